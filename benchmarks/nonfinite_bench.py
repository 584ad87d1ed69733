"""Measures the engine's NaN/infinity checks (k3core/model/finite.py): decodes --tokens ids per round, prints seconds
per pass and the CPU time spent inside the checks (thread time: waiting for the GIL is not their cost; on a shared
machine a run with the checks off differs by more than they cost). Not a test. E.g. on a `--shape wide` model:
  .venv/bin/python benchmarks/nonfinite_bench.py MODEL --trunk TRUNK --pin-layers 0
"""
import argparse
import time

from k3core import EngineConfig, open_engine
from k3core.model import engine as engine_module
from k3core.model import finite

CHECK_SMALL, CHECK_EMBED_ROWS = finite.check_small, engine_module.check_embed_rows  # the real ones


class Timed:
    """A function wrapped to add up the CPU seconds its thread spends in it and count its calls."""

    def __init__(self, fn):
        self.fn, self.seconds, self.calls = fn, 0.0, 0

    def __call__(self, *args):
        start = time.thread_time()
        try:
            return self.fn(*args)
        finally:
            self.seconds += time.thread_time() - start
            self.calls += 1


def decode(config: EngineConfig, tokens: int) -> tuple[float, Timed, Timed]:
    """(seconds per decode pass, the small-tensor check, the embedding check) over `tokens` passes after a prompt."""
    small, rows = Timed(CHECK_SMALL), Timed(CHECK_EMBED_ROWS)
    finite.check_small, engine_module.check_embed_rows = small, rows
    with open_engine(config) as engine:
        state = engine.new_state()
        engine.forward([1, 2, 3, 4], state)
        small.seconds = rows.seconds = 0.0
        small.calls = rows.calls = 0
        start = time.perf_counter()
        for t in range(tokens):
            engine.forward([5 + t % 7], state)
        return (time.perf_counter() - start) / tokens, small, rows


def report(seconds: float, small: Timed, rows: Timed, tokens: int) -> str:
    """One round: seconds per pass, and each check's CPU time per pass and share of it."""
    def per_pass(t: Timed) -> str:
        return f"{t.seconds / tokens * 1e6:8.1f} us/pass ({100 * t.seconds / tokens / seconds:.3f} %)"
    return (f"{seconds * 1e3:9.3f} ms/pass; small tensors of {small.calls / tokens:.1f} Weights/pass "
            f"{per_pass(small)}; embedding rows {per_pass(rows)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--trunk", help="a packed trunk: the pinned placer (else the resident one)")
    p.add_argument("--pin-layers", type=int)
    p.add_argument("--tokens", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    config = EngineConfig(args.model, trunk=args.trunk, pin_layers=args.pin_layers)
    try:
        for _ in range(args.rounds):
            print(report(*decode(config, args.tokens), args.tokens))
    finally:
        finite.check_small, engine_module.check_embed_rows = CHECK_SMALL, CHECK_EMBED_ROWS


if __name__ == "__main__":
    main()
