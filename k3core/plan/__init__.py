"""What an engine will be before anything loads: EngineConfig and its resolution into a checkpoint, chosen
plugins and budgets (engine_config.py), and the presets and the memory plan that refuses what cannot fit
(budget.py).

May import: k3core.errors, k3core.interfaces, k3core.units, k3core.format, k3core.plugin_manager.
"""
