"""Generation: where tokens are made. Sampling and structured output (the grammar a reply must follow), id
generation (generate_ids, greedy_ids, speculation by drafts) and batches of it (BatchGenerator), log-probabilities,
the prompt cache (in RAM and on disk), and the text layer on top (Session, ChatSession: detokenising, stop strings,
chat channels).

May import: k3core.errors, k3core.interfaces, k3core.units, k3core.files, k3core.format, k3core.plan,
k3core.model (the engine, its decode states and their state files), k3core.text (the tokenizer and chat format).
Not io, nor a room above this one.
"""
