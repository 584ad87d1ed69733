"""Text around the engine: the tokenizer, the K3 chat format, sampling, id generation (generate_ids),
and the text layer on top of it (Session, ChatSession: detokenising, stop strings, chat channels).

May import: k3core.errors, k3core.model (the engine), k3core.io (state files). Never cli.
"""
