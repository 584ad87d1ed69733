"""Log-probabilities as OpenAI's two APIs shape them, from k3core's TokenLogprob (k3core/generation/logprobs.py computes
them; nothing here changes a number).

Chat: `logprobs.content`, one entry per generated id: {token, logprob, bytes, top_logprobs: [{token, logprob,
bytes}]}. Legacy completions: {tokens, token_logprobs, top_logprobs (a dict per id), text_offset}. An id's
`token` is its bytes decoded as UTF-8 with U+FFFD for what is not valid alone (a byte-level BPE piece of a
character); `bytes` are its raw bytes.
"""
from __future__ import annotations


def piece(tokenizer, token: int) -> tuple[str, list[int]]:
    """(the text of one id, its bytes as ints)."""
    raw = tokenizer.token_bytes(token)
    return raw.decode("utf-8", errors="replace"), list(raw)


def _chat_alternative(tokenizer, token: int, logprob: float) -> dict:
    text, raw = piece(tokenizer, token)
    return {"token": text, "logprob": logprob, "bytes": raw}


def chat_logprobs(tokenizer, entries) -> dict:
    """`choices[i].logprobs` of a chat reply (or of one streamed chunk) from its ids' TokenLogprobs."""
    return {"content": [{**_chat_alternative(tokenizer, e.token, e.logprob),
                         "top_logprobs": [_chat_alternative(tokenizer, t, lp) for t, lp in e.top]} for e in entries],
            "refusal": None}


class LegacyLogprobs:
    """The legacy completions' `logprobs`, piece by piece: `text_offset` counts characters of the returned
    text (the echoed prompt first, with echo) and goes on from one streamed chunk to the next."""

    def __init__(self, tokenizer):
        self.tokenizer, self.offset = tokenizer, 0

    def of(self, ids, entries) -> dict:
        """`ids` and their TokenLogprobs (None for the first prompt id, which has none)."""
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token, e in zip(ids, entries):
            text = piece(self.tokenizer, token)[0]
            out["tokens"].append(text)
            out["token_logprobs"].append(None if e is None else e.logprob)
            out["top_logprobs"].append(None if e is None else self._alternatives(e))
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out

    def _alternatives(self, e) -> dict:
        """{text: logprob}, most likely first; of two ids with the same text the likelier one stays."""
        out: dict[str, float] = {}
        for token, logprob in e.top:
            out.setdefault(piece(self.tokenizer, token)[0], logprob)
        return out
