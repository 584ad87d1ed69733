"""What the suffix draft source's index costs (issue 26), on recorded conversations: `make bench-suffix`, or
`python benchmarks/suffix_bench.py [MODEL_DIR] [--draft-memory GB] [--json]`. A script beside k3, not a
`k3 bench` command: it times the index's internals (k3core/plugins/suffix.py), which k3's own modules never import.

Three measurements in one run, against issue 26's targets:
  build      every assistant turn of the transcripts, in file order, walked as a server decodes it with
             `--speculate 8 --draft suffix` (bench drafts --transcripts's teacher-forced walk): open(prompt),
             extend(doc, history) before each pass, close(doc) at its end, each conversation's turns continuing
             its document; all that time over the ids the index took in, evictions' rebuilds included.
             Target: at most 1 ms per 100 ids.
  proposals  each propose(doc, 8) of that walk, against a decode pass of MODEL (Engine.forward of one id after a
             short prompt, timed in the same run). Target: the median at most 1 % of the pass.
  memory     in a child process: the index at --draft-memory's capacity filled past it (the transcripts again
             as needed), its peak RSS less its RSS before the index was made, against the plan (capacity ×
             BYTES_PER_ID). Then, in a separate pass with tracemalloc, the bytes per id held of an index
             filled to its capacity without evicting, against BYTES_PER_ID. Target: within the plan.

The transcripts are rendered into ids with MODEL's tokenizer. When they are added again, each later round's
ids are permuted (seeded), so it is new text to the index rather than a repeat it would share states with.
Not a test: it asserts nothing about time; what misses its target is marked ✗, and memory over the plan or
BYTES_PER_ID is spelled out in capitals below the table (on stderr with --json).
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from k3core.cli.bench.structured import ms
from k3core.cli.bench.transcripts import Turn

ROOT = Path(__file__).resolve().parents[1]
DRAFT_K = "8"              # drafted ids per pass of the walk, as bench_transcripts.walk takes K
FORWARD_PROMPT = 16        # ids of the first turn's prompt the engine holds before the timed passes
FORWARD_PASSES = 200       # timed decode passes of one id
FILL = 2                   # the memory pass adds at least this many times the capacity
TARGET_BUILD_MS = 1.0      # per 100 ids
TARGET_PROPOSE_SHARE = 0.01  # of a decode pass


# ---- the walk: build and proposals, in this process ----------------------------------------------------------

def timed(seconds: list[float], call, *args):
    """call(*args), its duration appended to `seconds`."""
    started = time.perf_counter()
    result = call(*args)
    seconds.append(time.perf_counter() - started)
    return result


def timed_index(capacity: int):
    """A TimedIndex of `capacity` ids (its class is made here: importing the plugins is not for every k3 command)."""
    from k3core.plugins.suffix import SuffixIndex

    class TimedIndex(SuffixIndex):
        """A SuffixIndex timing each call: proposals apart, the rest (open, extend, close) as building, and
        within that each eviction (drop and rebuild)."""

        def __init__(self, capacity: int):
            super().__init__(capacity)
            self.build_seconds: list[float] = []
            self.propose_seconds: list[float] = []
            self.evict_seconds: list[float] = []
            self.opened: dict[int, object] = {}  # every document opened, kept to count the ids added to them

        def open(self, prompt):
            doc = timed(self.build_seconds, super().open, prompt)
            self.opened[id(doc)] = doc
            return doc

        def extend(self, doc, history):
            timed(self.build_seconds, super().extend, doc, history)

        def close(self, doc):
            timed(self.build_seconds, super().close, doc)

        def propose(self, doc, k):
            return timed(self.propose_seconds, super().propose, doc, k)

        def _evict(self):  # inside a build call: timed apart too, to tell the rebuilds' share
            timed(self.evict_seconds, super()._evict)

        def ids_added(self) -> int:
            return sum(d.dropped + len(d.tokens) for d in self.opened.values())

    return TimedIndex(capacity)


def walk_turns(turns: list[Turn], capacity: int, vocab: int):
    """Every turn walked at K=8 with the suffix source on a TimedIndex of its own: (the index, Counts)."""
    from k3core.plugins.suffix import SuffixDraft
    from k3core.cli.bench.transcripts import Counts, walk

    index, total = timed_index(capacity), Counts()
    source = SuffixDraft()
    source.index = index  # this run's index, not the process's shared one
    for turn in turns:
        total.add(walk(source, turn, DRAFT_K, vocab))
    return index, total


def forward_seconds(model: Path, prompt: list[int]) -> list[float]:
    """Seconds of each of FORWARD_PASSES decode passes (one id, the argmax of the last) after `prompt`."""
    from k3core.api import EngineConfig, open_engine

    seconds: list[float] = []
    with open_engine(EngineConfig(model)) as engine:
        state = engine.new_state()
        logits = engine.forward(prompt, state)
        for _ in range(FORWARD_PASSES):
            logits = timed(seconds, engine.forward, [int(np.argmax(logits))], state)
    return seconds


# ---- memory: in a child process ----------------------------------------------------------------------------

def rounds(turns: list[Turn], vocab: int):
    """The turns, then again and again, each later round's ids permuted (seeded): new text to the index."""
    yield from turns
    for n in itertools.count(1):
        label = list(range(vocab))
        random.Random(n).shuffle(label)  # not numpy.random: importing it in the child would count as the index's
        for t in turns:
            yield Turn(t.kind, tuple(label[i] for i in t.prompt), tuple(label[i] for i in t.reply))


def serve(index, turns) -> None:
    """Add each turn as a server does without drafting: open(prompt), extend to the reply's end, close."""
    for turn in turns:
        doc = index.open(turn.prompt)
        index.extend(doc, turn.prompt + turn.reply)
        index.close(doc)


def status_bytes(field: str) -> int:
    """A size field of /proc/self/status (VmRSS, VmHWM), in bytes."""
    with open("/proc/self/status") as f:
        return 1024 * int(next(line.split()[1] for line in f if line.startswith(field + ":")))


def reset_peak() -> bool:
    """Start VmHWM afresh (Linux's clear_refs 5); False when this kernel does not let us."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def memory_job(turns: list[Turn], capacity: int, vocab: int, times: int) -> dict:
    """In a child: the peak RSS of an index of `capacity` fed the transcripts `times` times; then, traced, the
    bytes per id held of an index filled to `capacity` without evicting."""
    import tracemalloc

    from k3core.plugins.suffix import SuffixIndex

    reset = reset_peak()
    before = status_bytes("VmRSS")
    index = SuffixIndex(capacity)
    serve(index, itertools.islice(rounds(turns, vocab), times * len(turns)))
    peak = status_bytes("VmHWM")
    held, states = index.held, len(index.length)
    del index
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    traced = SuffixIndex(sys.maxsize)
    serve(traced, itertools.takewhile(lambda _: traced.held < capacity, rounds(turns, vocab)))
    traced_bytes = tracemalloc.get_traced_memory()[0] - start
    tracemalloc.stop()
    return {"rss_before_bytes": before, "peak_rss_bytes": peak, "peak_since": "reset" if reset else "process start",
            "held": held, "states": states, "traced_held": traced.held, "traced_states": len(traced.length),
            "traced_bytes": traced_bytes}


def measure_memory(turns: list[Turn], capacity: int, vocab: int, ids_per_round: int) -> dict:
    from k3core.plugins.suffix import BYTES_PER_ID

    times = math.ceil(FILL * capacity / ids_per_round)
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as child:
        m = child.submit(memory_job, turns, capacity, vocab, times).result()
    planned, index_peak = capacity * BYTES_PER_ID, m["peak_rss_bytes"] - m["rss_before_bytes"]
    traced_per_id = m["traced_bytes"] / m["traced_held"]
    return {**m, "capacity_ids": capacity, "bytes_per_id_planned": BYTES_PER_ID, "planned_bytes": planned,
            "transcripts_times": times, "index_peak_bytes": index_peak, "vs_planned": index_peak / planned,
            "within_plan": index_peak <= planned, "rss_bytes_per_capacity_id": index_peak / capacity,
            "traced_bytes_per_id": traced_per_id, "over_bytes_per_id": traced_per_id > BYTES_PER_ID}


# ---- the document and its table ------------------------------------------------------------------------------

def build_summary(index) -> dict:
    ids, seconds, evicting = index.ids_added(), sum(index.build_seconds), sum(index.evict_seconds)
    per_100 = 1e5 * seconds / ids
    return {"ids": ids, "calls": len(index.build_seconds), "seconds": seconds, "ms_per_100_ids": per_100,
            "evictions": len(index.evict_seconds), "eviction_seconds": evicting,
            "ms_per_100_ids_without_evictions": 1e5 * (seconds - evicting) / ids,
            "max_call_ms": ms(index.build_seconds, 100), "held": index.held, "states": len(index.length),
            "target_ms_per_100_ids": TARGET_BUILD_MS, "within_target": per_100 <= TARGET_BUILD_MS}


def proposal_summary(index, counts, forward: list[float]) -> dict:
    s = index.propose_seconds
    median, p99, pass_ms = ms(s), ms(s, 99), ms(forward)
    return {"k": int(DRAFT_K), "calls": len(s), "median_ms": median, "p99_ms": p99, "max_ms": ms(s, 100),
            "forward_ms": pass_ms, "forward_passes": len(forward), "vs_forward": median / pass_ms,
            "p99_vs_forward": p99 / pass_ms, "target_vs_forward": TARGET_PROPOSE_SHARE,
            "within_target": median / pass_ms <= TARGET_PROPOSE_SHARE, "walk": counts.summary()}


def measure(model: Path, path, capacity: int) -> dict:
    from k3core.api import load_tokenizer
    from k3core.errors import UsageError
    from k3core.machine.rates import machine_info
    from k3core.cli.bench.transcripts import read_conversations, scored_turns

    date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    tokenizer = load_tokenizer(model)
    conversations = read_conversations(path)
    turns = scored_turns(conversations, tokenizer, path)
    if not turns:
        raise UsageError(f"--transcripts {path}: no assistant turns to walk")
    print(f"  walking {len(turns)} turns …", file=sys.stderr, flush=True)
    index, counts = walk_turns(turns, capacity, tokenizer.vocab_size)
    if not index.propose_seconds:
        raise UsageError(f"--transcripts {path}: no reply longer than one id, so nothing to propose into")
    print(f"  {FORWARD_PASSES} decode passes of {model.name} …", file=sys.stderr, flush=True)
    forward = forward_seconds(model, list(turns[0].prompt[:FORWARD_PROMPT]))
    print("  memory, in a child process …", file=sys.stderr, flush=True)
    memory = measure_memory(turns, capacity, tokenizer.vocab_size, index.ids_added())
    return {"model": str(model), "transcripts": str(path), "conversations": len(conversations), "turns": len(turns),
            "vocabulary": tokenizer.vocab_size, "machine": machine_info(), "date": date, "capacity_ids": capacity,
            "build": build_summary(index), "proposals": proposal_summary(index, counts, forward), "memory": memory}


def mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def over_plan(doc: dict) -> list[str]:
    """The loud lines: memory over the plan, bytes per id over BYTES_PER_ID."""
    m, out = doc["memory"], []
    if m["over_bytes_per_id"]:
        out.append(f"!! MEASURED {m['traced_bytes_per_id']:.0f} BYTES PER ID HELD (tracemalloc) EXCEED BYTES_PER_ID = "
                   f"{m['bytes_per_id_planned']} (k3core/plugins/suffix.py): the plan undercounts the index")
    if not m["within_plan"]:
        out.append(f"!! THE INDEX'S PEAK RSS {m['index_peak_bytes'] / 1e6:.1f} MB EXCEEDS ITS PLAN "
                   f"{m['planned_bytes'] / 1e6:.1f} MB ({m['vs_planned']:.2f}x): {m['rss_bytes_per_capacity_id']:.0f} "
                   f"BYTES PER ID OF CAPACITY, BYTES_PER_ID = {m['bytes_per_id_planned']}")
    return out


def build_rows(b: dict) -> list[str]:
    return [f"| build: open/extend/close, ms per 100 ids ({b['ids']:,} ids, {b['calls']:,} calls) | "
            f"{b['ms_per_100_ids']:.3f} | ≤ {b['target_ms_per_100_ids']:g} | {mark(b['within_target'])} |",
            f"| build: of that, evictions (drop, rebuild): count, s; ms per 100 ids without them | "
            f"{b['evictions']}, {b['eviction_seconds']:.2f}; {b['ms_per_100_ids_without_evictions']:.3f} | | |",
            f"| build: the slowest call, ms | {b['max_call_ms']:.1f} | | |",
            f"| index at the end: ids held, states | {b['held']:,}, {b['states']:,} | | |"]


def proposal_rows(p: dict, model: str) -> list[str]:
    return [f"| propose(doc, {p['k']}): median, p99, max ms ({p['calls']:,} calls) | {p['median_ms']:.4f}, "
            f"{p['p99_ms']:.4f}, {p['max_ms']:.3f} | | |",
            f"| a decode pass of {model}: median ms ({p['forward_passes']} passes) | {p['forward_ms']:.3f} | | |",
            f"| proposal ÷ decode pass, median (p99) | {100 * p['vs_forward']:.2f} % "
            f"({100 * p['p99_vs_forward']:.2f} %) | ≤ {100 * p['target_vs_forward']:g} % | "
            f"{mark(p['within_target'])} |"]


def memory_rows(m: dict) -> list[str]:
    return [f"| memory: peak RSS − RSS before, child, transcripts ×{m['transcripts_times']} (peak since "
            f"{m['peak_since']}) | {m['index_peak_bytes'] / 1e6:.1f} MB | ≤ {m['planned_bytes'] / 1e6:.1f} MB "
            f"planned ({100 * m['vs_planned']:.0f} %) | {mark(m['within_plan'])} |",
            f"| memory: that peak per id of capacity | {m['rss_bytes_per_capacity_id']:.0f} B | | |",
            f"| memory: bytes per id held, tracemalloc, separate pass ({m['traced_held']:,} ids, "
            f"{m['traced_states']:,} states) | {m['traced_bytes_per_id']:.0f} B | ≤ {m['bytes_per_id_planned']} "
            f"(BYTES_PER_ID) | {mark(not m['over_bytes_per_id'])} |"]


def suffix_table(doc: dict) -> str:
    p, m, mach, model = doc["proposals"], doc["memory"], doc["machine"], Path(doc["model"]).name
    out = [f"the suffix index's cost on {Path(doc['transcripts']).name} ({doc['conversations']} conversations, "
           f"{doc['turns']} assistant turns; tokenizer of {model}, {doc['vocabulary']} ids), {mach['cpu']}, "
           f"{mach['cores']} cores, {doc['date']}",
           f"capacity {doc['capacity_ids']:,} ids ({m['planned_bytes'] / 1e6:.1f} MB planned at BYTES_PER_ID = "
           f"{m['bytes_per_id_planned']}); the walk: every turn at K={p['k']} with the suffix source, "
           f"{p['walk']['tokens_per_pass']:.2f} tokens per pass", "",
           "| measure | measured | target | |", "|---|---:|---|---|",
           *build_rows(doc["build"]), *proposal_rows(p, model), *memory_rows(m)]
    loud = over_plan(doc)
    return "\n".join([*out, "", *loud] if loud else out)


# ---- the command -----------------------------------------------------------------------------------------------

def capacity(gb: float | None) -> int:
    """The index's capacity in ids, as the suffix source reserves it: --draft-memory (else its default) over
    BYTES_PER_ID."""
    from k3core.errors import UsageError
    from k3core.plugins.suffix import BYTES_PER_ID, DEFAULT_BYTES

    if gb is not None and gb < 0:
        raise UsageError(f"--draft-memory takes GB >= 0, got {gb}")
    return max(1, (DEFAULT_BYTES if gb is None else int(gb * 1e9)) // BYTES_PER_ID)


def cmd_suffix(args) -> int:
    model = Path(args.model) if args.model else ROOT / "wizard" / "data" / "demo-model"
    doc = measure(model, args.transcripts, capacity(args.draft_memory))
    if args.json:
        print(json.dumps(doc, indent=1, ensure_ascii=False))
        for line in over_plan(doc):
            print(line, file=sys.stderr)
    else:
        print(suffix_table(doc))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="benchmarks/suffix_bench.py", formatter_class=argparse.RawDescriptionHelpFormatter, description=__doc__,
        epilog="examples:\n"
               "  make bench-suffix                                          # the demo model, the shipped transcripts\n"
               "  .venv/bin/python benchmarks/suffix_bench.py --draft-memory 0.5   # a 0.5 GB index\n"
               "  .venv/bin/python benchmarks/suffix_bench.py --json | jq .memory\n"
               "reading it: docs/performance-notes/suffix-index-cost.md.")
    p.add_argument("model", metavar="MODEL_DIR", nargs="?",
                   help="its tokenizer renders the transcripts, its decode pass is the yardstick (default: the "
                        "shipped demo model)")
    p.add_argument("--transcripts", metavar="FILE.jsonl", default=str(ROOT / "benchmarks" / "transcripts" /
                                                                      "transcripts.jsonl"),
                   help="conversations, as `k3 bench drafts --transcripts` reads them (default: "
                        "benchmarks/transcripts/transcripts.jsonl)")
    p.add_argument("--draft-memory", type=float, metavar="GB", default=None,
                   help="the index's memory, as `k3 serve --draft-memory` (default: the suffix source's, 0.067 GB)")
    p.add_argument("--json", action="store_true", help="print the JSON document instead of the table")
    return p


def main(argv=None) -> int:
    from k3core.errors import UsageError

    try:
        return cmd_suffix(parser().parse_args(argv))
    except UsageError as exc:
        print(f"suffix_bench: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
