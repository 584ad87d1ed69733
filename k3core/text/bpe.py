"""A plain byte-pair trainer for small tokenizers in the K3 format (test models, the demo model): the
256 single bytes are always there; merges are learned inside the pieces MODEL.md §7's pat_str splits text
into, so tiktoken (which splits the same way) reproduces them. Not a tokenizer for the real model,
which ships its own 163,584 ranks."""
from __future__ import annotations

from collections import Counter

import regex

from .tokenizer import PAT_STR


def train_bpe(text: str, n_merges: int) -> list[bytes]:
    """The first `n_merges` new tokens of a plain byte-pair trainer: split `text` with the
    tokenizer's pat_str, then repeatedly join the most frequent adjacent pair inside a piece
    (ties: the smaller pair of byte strings); a join that yields a known token adds no rank.
    If the corpus runs dry (only the "wide" shape), two-byte printable-ASCII tokens fill up."""
    words = Counter(tuple(bytes([b]) for b in piece.encode())
                    for piece in regex.findall(PAT_STR, text, flags=regex.V1))  # V1: `&&` in classes
    known, merged = {bytes([b]) for b in range(256)}, []
    while len(merged) < n_merges:
        pairs: Counter = Counter()
        for word, n in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += n
        if not pairs:
            break
        a, b = min(pairs, key=lambda p: (-pairs[p], p))
        if a + b not in known:
            known.add(a + b)
            merged.append(a + b)
        words = Counter({_join_pair(word, a, b): n for word, n in words.items()})
    filler = (bytes([x, y]) for x in range(0x20, 0x7F) for y in range(0x20, 0x7F))
    merged += [t for t in filler if t not in known][:n_merges - len(merged)]
    return merged


def _join_pair(word: tuple, a: bytes, b: bytes) -> tuple:
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
            out.append(a + b)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)
