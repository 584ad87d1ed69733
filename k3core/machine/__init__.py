"""This machine, measured: the checks `k3 doctor` prints and `k3 setup` runs (checks.py), what the disk gives
k3's reads (probes.py), what the CPU computes per second (rates.py), and what a token of the full model
costs from such rates — the projection and the trunk codec choice (cost.py, routing.py for the real
routing trace's expert unions).

May import: k3core.errors, k3core.interfaces, k3core.units, k3core.files, k3core.format, k3core.io,
k3core.plan, k3core.model (what a pass reads), k3core._native.
"""
