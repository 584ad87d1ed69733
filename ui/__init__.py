"""k3's browser front end (`k3 ui`): a Gradio chat page over one engine, with a live engine panel and
Setup, Memory and Plugins tabs. It reaches k3core only through its public API and adds its command
through the `k3_subcommands` hook (ui/plugin.py); k3core never imports it.
"""
