"""Text around the engine: the tokenizer, the K3 chat format, sampling, structured output, id generation
(generate_ids) and batches of it (BatchGenerator), the prompt cache, and the text layer on top of it (Session,
ChatSession: detokenising, stop strings, chat channels).

May import: k3core.errors, k3core.interfaces, k3core.units, k3core.files, k3core.format, k3core.plan,
k3core.model (the engine, its decode states and their state files). Not io, nor a room above this one.
"""
