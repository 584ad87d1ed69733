"""The `k3` command: argument parsing, human and JSON output, exit codes, and the tools behind
subcommands (doctor, bench, sim-cache). Built on the front door (k3core.api) and the model's own
modules; nothing else in k3core imports from here.
"""
