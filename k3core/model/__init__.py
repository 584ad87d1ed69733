"""The model: the forward pass one file per block — the layer loop and DecodeState (engine.py), one decoder
layer (layer.py), Attention Residuals (attnres.py), the latent MoE and its router (moe.py), the dense MLP (mlp.py),
the non-finite checks on what a layer produced (finite.py) — what watches a pass (observer.py), what one pass reads
(pass_cost.py), and decode states saved to a file (state_file.py). The math is docs/MODEL.md §4.

May import: k3core.errors, k3core.interfaces, k3core.files, k3core.format, k3core.io (trunk fingerprints),
k3core.plan. Never text, cli, or a built-in plugin by name (plugins come through the hooks).
"""
