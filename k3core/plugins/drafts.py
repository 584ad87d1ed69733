"""The built-in draft sources for speculative decoding: `ngram` (prompt lookup: the longest suffix of the
ids so far that occurred before, and what followed it then) and `replay:PATH` (ids from a file, in order:
an oracle replaying a known continuation, or a deliberately wrong one, for tests and benchmarks). A replay file is
read with a byte limit (MAX_REPLAY_BYTES: /dev/zero is refused, not read until memory runs out) and, once the model is
known, checked whole against its vocabulary (DraftSource.check) before anything is generated."""
from __future__ import annotations

from pathlib import Path

from ..plugin_api import DraftSource, UsageError, hookimpl, read_limited

MAX_NGRAM = 8          # the longest suffix looked up
LOOKBACK = 4096        # ids searched back for it: bounds the work per step
MAX_REPLAY_BYTES = 16 << 20  # a replay:PATH file: ~2M ids, more than any context; more is refused, naming the limit


class NgramDraft(DraftSource):
    name = "ngram"
    description = "prompt lookup: continue the longest earlier repeat of the last ids (no draft model)"

    def __init__(self, argument=None):
        super().__init__(argument)
        if argument is not None:
            raise UsageError(f"--draft ngram takes no argument, got ngram:{argument}")

    def propose(self, history, generated, k):
        h = list(history[-LOOKBACK:])
        for n in range(min(MAX_NGRAM, len(h) - 1), 0, -1):
            tail = h[-n:]
            for start in range(len(h) - n - 1, -1, -1):  # the most recent earlier occurrence
                if h[start:start + n] == tail:
                    return h[start + n:start + n + k]
        return []


class ReplayDraft(DraftSource):
    name = "replay"
    description = "replay:PATH proposes the ids in PATH (comma/space separated), the i-th after the i-th generated"

    def __init__(self, argument=None):
        super().__init__(argument)
        if not argument:
            raise UsageError("--draft replay needs a file: replay:PATH")
        try:
            text = read_limited(argument, MAX_REPLAY_BYTES, "a replay draft file (--draft replay:PATH)").decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--draft replay:{argument}: cannot read it ({getattr(exc, 'strerror', None) or exc})") \
                from None
        parts = text.replace(",", " ").split()
        if not all(p.isascii() and p.isdigit() for p in parts):
            raise UsageError(f"--draft replay:{argument}: expected token ids (decimal, comma/space separated)")
        long = next((i for i, p in enumerate(parts) if len(p) > 18), None)
        if long is not None:
            raise UsageError(f"--draft replay:{argument}: id {parts[long][:20]}… at position {long} (counting from 0) "
                             "has more digits than any token id")
        self.ids = [int(p) for p in parts]

    def check(self, vocab_size: int) -> None:
        """Refuse, before generating, a file with an id the model cannot have: naming the file, the id, its position
        and the vocabulary (an id past it would stop the run mid-stream)."""
        for position, t in enumerate(self.ids):
            if t >= vocab_size:
                raise UsageError(f"--draft replay:{self.argument}: id {t} at position {position} (counting from 0) is "
                                 f"outside this model's vocabulary of {vocab_size} ids (0..{vocab_size - 1})")

    @classmethod
    def example_argument(cls, directory):
        path = Path(directory) / "replay-ids.txt"
        path.write_text(" ".join(str((17 * i + 3) % 200) for i in range(64)) + "\n", encoding="utf-8")
        return str(path)

    def propose(self, history, generated, k):
        return self.ids[generated:generated + k]


@hookimpl(trylast=True)
def k3_draft_sources():
    return [NgramDraft, ReplayDraft]
