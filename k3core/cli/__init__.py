"""The `k3` command: argument parsing, human and JSON output, exit codes, and the tools behind
subcommands (doctor, bench, sim-cache, pack). Built on the model, text and io rooms; of the rest of
k3core only the front door (api.py) imports from here, to hand plugins the engine flags and the doctor.
"""
