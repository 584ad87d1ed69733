"""What an engine will be before anything loads: EngineConfig and its resolution into a checkpoint, chosen
plugins and budgets (engine_config.py), and the presets and the memory plan that refuses what cannot fit
(budget.py), the prefill chunk `auto` picks (prefill.py), and the saved profile that feeds it: which model,
trunk, preset and tuned settings `k3 run` uses when told none (profile.py).

May import: k3core.errors, k3core.interfaces, k3core.units, k3core.files, k3core.format, k3core.plugin_manager.
"""
