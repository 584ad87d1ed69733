"""`k3 bench prefill`: a prompt forwarded at several prefill chunk lengths, each measured against the FMA probe of
the kernels in use and against what plan/prefill.py predicts (issue 39).

Per chunk length, one engine opened with it; a seeded prompt of --ids ids forwarded once untimed (it fills the
expert cache and pages; --cold skips it) and then once timed, from a fresh state. Reported: ids/s, the model's
multiply-adds per id (its weights, and the attention pairs of this prompt), those per second per core and as a
share of the FMA probe at the same thread count, measured right after each run (on a shared host the probe
itself moves between runs), the bytes read (the engine's own counters) beside the cost
model's, the time the pass waited for reads (its I/O share) and the share of the time reads were in flight that
compute hid, and the predicted seconds: the compute rate calibrated on the first chunk length's time not spent
waiting, the disk rate measured by each run's reads — so the later lengths test how the model's cost changes
with the chunk. --by-kernel also times every kernel call of the timed pass: where the pass went, and the matrix
products' and attention's multiply-adds per second against the same probe.

Not a test: it measures and prints; it asserts nothing about speed.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import time

import numpy as np

from ...errors import UsageError
from ...units import human

MAX_IDS = 1 << 16  # a prompt longer than this is a run, not a bench


def _tokens(x) -> int:
    return x.shape[0] if np.ndim(x) == 2 else 1


def _mxfp4_macs(packed) -> int:
    return packed.shape[0] * packed.shape[1] * 2


# The multiply-adds of a call of a matrix product (rows x columns x tokens) or of MLA attention (heads x positions
# x the keys' and values' widths); the other kernels count none.
MACS = {
    "linear": lambda w, x, *_: w.shape[0] * w.shape[1] * _tokens(x),
    "mxfp4_linear": lambda packed, scale, x, *_: _mxfp4_macs(packed) * _tokens(x),
    "int8_linear": lambda codes, scales, x, *_: codes.shape[0] * codes.shape[1] * _tokens(x),
    "int4_linear": lambda packed, scales, cols, x, *_: packed.shape[0] * cols * _tokens(x),
    "expert": lambda e, z, *_: (_mxfp4_macs(e.w1_packed) + _mxfp4_macs(e.w2_packed) + _mxfp4_macs(e.w3_packed))
    * _tokens(z),
    "mqa_attention": lambda q, keys, values, *_: q.shape[0] * keys.shape[0] * (keys.shape[1] + values.shape[1]),
}


class KernelClock:
    """While open, every kernel method of `kernels` (a KernelBackend) is timed: calls, seconds, and for the matrix
    products and attention the multiply-adds (MACS). A kernel a backend calls inside another (the reference
    backend's `expert` calls its `mxfp4_linear`) counts as part of the outer one, so no time counts twice."""

    def __init__(self, kernels):
        from ...interfaces import kernel_names

        self.kernels, self.calls, self.depth, self.names = kernels, {}, 0, kernel_names()

    def __enter__(self):
        for name in self.names:
            setattr(self.kernels, name, self._timed(name, getattr(self.kernels, name)))
        return self

    def __exit__(self, *exc):
        for name in self.names:
            delattr(self.kernels, name)  # the class's method again

    def _timed(self, name, call):
        macs = MACS.get(name)

        def timed(*args, **kwargs):
            if self.depth:
                return call(*args, **kwargs)
            self.depth += 1
            start = time.perf_counter()
            try:
                out = call(*args, **kwargs)
            finally:
                self.depth -= 1
            seconds = time.perf_counter() - start
            row = self.calls.setdefault(name, {"kernel": name, "calls": 0, "seconds": 0.0,
                                               "macs": 0 if macs else None})
            row["calls"] += 1
            row["seconds"] += seconds
            if macs:
                row["macs"] += macs(*args, **kwargs)
            return out
        return timed

    def rows(self, seconds: float, threads: int) -> list[dict]:
        """One row a kernel called, the longest first: its share of the pass and, for a product, its multiply-adds
        per second per core."""
        out = []
        for row in sorted(self.calls.values(), key=lambda r: -r["seconds"]):
            per_core = row["macs"] / row["seconds"] / threads if row["macs"] and row["seconds"] > 0 else None
            out.append({**row, "share": row["seconds"] / seconds, "macs_per_second_per_core": per_core})
        return out


def measure(args, chunk: int) -> dict:
    """One chunk length: open, warm (unless --cold), forward the prompt from a fresh state, timed."""
    from ...api import open_engine
    from ...interfaces import default_threads
    from ...plan import prefill
    from ...generation.generate import prefill as forward_prompt
    from ..options import engine_config_from_args

    config = engine_config_from_args(args, tuned=False)  # a bench measures what its flags say, never a saved tuning
    config = config.replace(prefill_chunk=chunk, max_context=max(4096, args.ids + 1))
    with open_engine(config) as engine:
        prompt = [int(i) for i in np.random.default_rng(args.seed).integers(0, engine.config.vocab_size, args.ids)]
        if not args.cold:
            forward_prompt(engine, prompt, engine.new_state())
        clock = KernelClock(engine.kernels) if args.by_kernel else contextlib.nullcontext()
        with clock:
            before, start = engine.stats(), time.perf_counter()
            forward_prompt(engine, prompt, engine.new_state())
            seconds, after = time.perf_counter() - start, engine.stats()
        shape = prefill.Shape.of_checkpoint(engine.checkpoint)
        where = prefill.where_held(shape, type(engine.placer).streamed_bytes(engine.placer.ctx),
                                   sum(r.bytes for r in engine.plan.experts))
        threads = config.threads or default_threads()
        read = {k: after.get(k, 0) - before.get(k, 0) for k in
                ("expert_bytes_read", "expert_read_seconds", "trunk_bytes_read", "trunk_read_seconds",
                 "expert_wait_seconds", "trunk_wait_seconds")}
        backend = engine.kernels.name
        by_kernel = clock.rows(seconds, threads) if args.by_kernel else None
    pairs = args.ids * (args.ids + 1) / 2
    bytes_read = read["expert_bytes_read"] + read["trunk_bytes_read"]
    waited = read["expert_wait_seconds"] + read["trunk_wait_seconds"] if bytes_read else 0.0  # else: bookkeeping only
    return {"chunk": chunk, "seconds": seconds, "ids_per_second": args.ids / seconds, "backend": backend,
            "threads": threads, "macs": args.ids * shape.macs_per_id + pairs * shape.macs_per_pair,
            "macs_per_id_weights": shape.macs_per_id, "bytes_read": bytes_read,
            "read_seconds": read["expert_read_seconds"] + read["trunk_read_seconds"],
            "wait_seconds": waited, "by_kernel": by_kernel,
            "shape": shape, "where": where}


def predict(runs: list[dict], ids: int) -> None:
    """Each run's predicted seconds and bytes (plan/prefill.py), the compute rate calibrated on the first run's
    time not spent waiting for reads."""
    from ...plan import prefill

    first = runs[0]
    def disk(r):  # the run's own read rate; one that read nothing is not slowed by the disk's rate
        return r["bytes_read"] / r["read_seconds"] if r["bytes_read"] and r["read_seconds"] > 0 else prefill.ASSUMED_DISK

    shape = first["shape"]  # attention's pairs at ATTENTION_RATIO of the rate calibrated
    work = ids * shape.macs_per_id + ids * (ids + 1) / 2 * shape.macs_per_pair / prefill.ATTENTION_RATIO
    rate = work / max(first["seconds"] - first["wait_seconds"], 1e-9) / first["threads"]
    for r in runs:
        rates = prefill.Rates(disk(r), r["threads"], rate)
        r["predicted_seconds"] = prefill.prompt_seconds(r["shape"], r["where"], rates, r["chunk"], ids)
        r["predicted_bytes"] = sum(prefill.pass_seconds(r["shape"], r["where"], rates, min(r["chunk"], ids - at), at)
                                   ["bytes_read"] for at in range(0, ids, r["chunk"]))
        r["calibrated_macs_per_core"] = rate


def probe_backend(backend: str) -> str:
    """The native backend whose FMA probe bounds `backend`: itself, or for a backend with no probe of its own (the
    numpy reference, a plugin's) the best this machine runs."""
    from ... import _native

    native = _native.available_backends()
    return backend if backend in native else native[0]


def cmd_prefill(args) -> int:
    from ...machine.rates import measure_fma

    try:
        chunks = [int(c) for c in args.chunks.split(",")] if args.chunks else [128, 256, 512]
    except ValueError:
        chunks = [0]
    if min(chunks) < 1 or args.ids < 1 or args.ids > MAX_IDS:
        raise UsageError(f"--chunks takes positive integers (got {args.chunks!r}) and --ids 1..{MAX_IDS} "
                         f"(got {args.ids})")
    runs = []
    for chunk in chunks:
        runs.append(measure(args, chunk))
        r = runs[-1]
        r["probe_backend"] = probe_backend(r["backend"])
        r["fma_probe_macs_per_second"] = measure_fma([r["probe_backend"]], [r["threads"]], 0.5)[0]["macs_per_s"]
        if not args.json:
            print(f"chunk {chunk}: {r['seconds']:.1f} s, {r['ids_per_second']:.2f} ids/s", flush=True)
    fma = float(np.median([r["fma_probe_macs_per_second"] for r in runs]))
    predict(runs, args.ids)
    for r in runs:
        r["macs_per_second_per_core"] = r["macs"] / r["seconds"] / r["threads"]
        r["share_of_fma"] = r["macs"] / r["seconds"] / r["fma_probe_macs_per_second"]
        r["predicted_vs_measured"] = r["predicted_seconds"] / r["seconds"]
        r["io_share"] = r["wait_seconds"] / r["seconds"]  # the pass stood waiting for bytes
        r["reads_hidden"] = 1 - r["wait_seconds"] / r["read_seconds"] if r["read_seconds"] > 0 else None
        for k in r["by_kernel"] or []:
            k["share_of_fma"] = (k["macs"] / k["seconds"] / r["fma_probe_macs_per_second"]
                                 if k["macs_per_second_per_core"] is not None else None)
        del r["shape"], r["where"]
    doc = {"model": args.model, "ids": args.ids, "cold": args.cold, "fma_probe_macs_per_second": fma, "runs": runs}
    print(json.dumps(doc, indent=1) if args.json else table(doc))
    return 0


def table(doc: dict) -> str:
    r0 = doc["runs"][0]
    lines = [f"prefill of {doc['ids']} ids ({'cold' if doc['cold'] else 'after one untimed pass'}), {r0['backend']} kernels, "
             f"{r0['threads']} threads; FMA probe ({r0['probe_backend']}) after each run, median "
             f"{doc['fma_probe_macs_per_second'] / 1e9:.1f} "
             f"G multiply-adds/s; "
             f"weights {r0['macs_per_id_weights'] / 1e9:.2f} G multiply-adds per id; predicted: plan/prefill.py, compute "
             f"rate calibrated on chunk {r0['chunk']} ({r0['calibrated_macs_per_core'] / 1e9:.1f} G/s per core)", "",
             "| chunk | seconds | ids/s | G MACs/s per core | FMA probe G/s | % FMA probe | read | predicted read | "
             "waited | I/O share | reads hidden | predicted s | predicted ÷ measured |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["runs"]:
        lines.append(f"| {r['chunk']} | {r['seconds']:.1f} | {r['ids_per_second']:.2f} | "
                     f"{r['macs_per_second_per_core'] / 1e9:.1f} | {r['fma_probe_macs_per_second'] / 1e9:.1f} | "
                     f"{100 * r['share_of_fma']:.0f} % | {human(r['bytes_read'])} | "
                     f"{human(r['predicted_bytes'])} | {r['wait_seconds']:.1f} s | {_percent(r['io_share'])} | "
                     f"{_percent(r['reads_hidden'])} | "
                     f"{r['predicted_seconds']:.1f} | {r['predicted_vs_measured']:.2f} |")
    for r in doc["runs"]:
        if r["by_kernel"] is not None:
            lines += ["", *kernel_table(r)]
    return "\n".join(lines)


def kernel_table(run: dict) -> list[str]:
    """Where chunk `run`'s pass went: each kernel's calls, seconds and share; a product's rate against the probe."""
    rows = run["by_kernel"]
    outside = run["seconds"] - sum(k["seconds"] for k in rows)
    lines = [f"chunk {run['chunk']}, by kernel ({100 * (1 - outside / run['seconds']):.0f} % of the pass in kernels; "
             f"products and attention: multiply-adds per second per core, share of the run's probe)", "",
             "| kernel | calls | seconds | share of the pass | G MACs/s per core | % FMA probe |",
             "|---|---:|---:|---:|---:|---:|"]
    for k in rows:
        rate = "" if k["macs_per_second_per_core"] is None else f"{k['macs_per_second_per_core'] / 1e9:.1f}"
        lines.append(f"| {k['kernel']} | {k['calls']} | {k['seconds']:.2f} | {100 * k['share']:.1f} % | {rate} | "
                     f"{'' if k['share_of_fma'] is None else _percent(k['share_of_fma'])} |")
    lines.append(f"| outside the kernels | | {outside:.2f} | {100 * outside / run['seconds']:.1f} % | | |")
    return lines


def _percent(share: float | None) -> str:
    return "n/a" if share is None else f"{100 * share:.0f} %"


def add_parser(sub) -> None:
    from ..options import add_engine_arguments

    p = sub.add_parser("prefill", help="a prompt at several prefill chunks: ids/s, share of the FMA probe, and the "
                       "cost model's prediction", formatter_class=argparse.RawDescriptionHelpFormatter,
                       description=__doc__.split("\n\n")[1],
                       epilog="examples:\n  k3 bench prefill demo-model --ids 1024 --chunks 128,512,1024\n"
                              "  k3 bench prefill wide --ids 256 --chunks 64,128,256\n"
                              "  k3 bench prefill wide --ids 128 --chunks 128 --by-kernel\n"
                              "  k3 bench prefill wide --trunk wide-trunk --preset laptop --ids 512 --chunks 128,256,512")
    p.add_argument("--ids", type=int, default=512, metavar="N", help="prompt length (default 512)")
    p.add_argument("--chunks", metavar="A,B,…", help="prefill chunk lengths, the first calibrates (default 128,256,512)")
    p.add_argument("--seed", type=int, default=0, help="the prompt's seed (default 0)")
    p.add_argument("--cold", action="store_true", help="time the first pass (nothing read before it)")
    p.add_argument("--by-kernel", action="store_true",
                   help="also time every kernel call of the timed pass: each kernel's share of it, and the matrix "
                        "products' and attention's multiply-adds per second against the probe")
    p.add_argument("--json", action="store_true")
    add_engine_arguments(p)
    p.set_defaults(func=cmd_prefill)
