"""The `k3` command: argument parsing, human and JSON output, exit codes (main.py), and one module per command
family (run, chat, pack, plugins, doctor, tune, sim-cache); the benchmark commands have a folder of their own,
bench/ (`k3 bench …`, a module each). The top room: it may import every other room of
k3core, and of k3core only __main__.py imports it; the front door (api.py) never does. One module here is public,
options.py: the flags `k3 run` shares with `k3 chat` and with the subcommands of plugins (serve/, ui/, wizard/).
"""
