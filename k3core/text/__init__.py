"""Text as K3 reads and writes it: the tokenizer (tiktoken BPE ranks, and training one for a test model), the
K3 chat format (rendering a conversation, splitting a reply), and OpenAI-style messages turned into K3's. Making
tokens is the next room up, k3core.generation.

May import: k3core.errors, k3core.interfaces, k3core.units, k3core.files. Nothing that runs the model.
"""
