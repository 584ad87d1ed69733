"""k3's setup wizard: `k3 setup` (doctor, space, download, verify, pack, profile, next command) and
`k3 verify MODEL_DIR`, added to the `k3` command through the k3_subcommands hook (wizard/plugin.py).

It calls only k3core's public functions; k3core never imports it. Checked by tests/wizard against a
mock Hub on 127.0.0.1 driven by the real huggingface_hub client.
"""
OFFICIAL_REPO = "moonshotai/Kimi-K3"
