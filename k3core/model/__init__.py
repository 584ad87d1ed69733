"""The model: config, checkpoint names and the binding check, the forward pass one file per block
(engine, attnres, moe, mlp), MXFP4, the memory plan and the run report, and the test-model writer.

May import: k3core.errors, k3core.interfaces, k3core.plugin_manager, k3core.io. Never text, cli, or
a built-in plugin by name (plugins come through the hooks).
"""
