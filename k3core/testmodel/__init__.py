"""Generated checkpoints in the real K3 format: random weights of a named shape, the same bytes for the same
shape and seed (make.py, `k3 make-model`), written shard by shard with their checksums (writer.py). The
conformance kit, the tests and the benchmarks run on them.

May import: k3core.errors, k3core.files, k3core.format, k3core.plugin_manager (the attention backends'
tensors, by name), k3core.text (the tokenizer and chat template a model ships with).
"""
