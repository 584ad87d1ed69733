"""k3: run Kimi K3 on one CPU machine, exactly. Public API: Engine, load_config, errors."""
__version__ = "0.1.0"
