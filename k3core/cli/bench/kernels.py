"""`k3 bench`: measure the native kernels on real K3 shapes against a memory-read probe and numpy.

`k3 bench kernels` times bf16 and MXFP4 products (T = 1, 2, 4, 8, 16, 64), a 16-expert MoE batch, a draft trunk's
int8 and int4 products of q_proj (T = 1, 64), one position of MLA attention over 4,096 cached latents, and numpy
baselines of the same work, all in one run, and prints a table (or JSON with --json).
"""
from __future__ import annotations

import argparse
import itertools
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ...errors import UsageError
from ...machine.rates import machine_info, measure_fma, timed

MB = 1e6
GEMM_TOKENS = (2, 4, 8, 16, 64)  # the small batches of speculation and batched sequences, and a prefill chunk
DRAFT_TOKENS = (1, 64)  # a draft model's decode step and a prefill chunk
HOT_ROWS = 64  # rows of the in-cache bf16 GEMV (917 kB of q_proj); the MXFP4 one takes 4x as many (458 kB of w1)
TARGET_MX_PER_CORE, TARGET_BF16_PROBE, TARGET_VS_NUMPY = 10.0, 0.60, 3.0
# byte b -> (E2M1 of its low nibble, E2M1 of its high nibble); scale byte -> 2^(b-127), 255 -> 0
_E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)
PAIRS = np.stack([_E2M1[np.arange(256) & 15], _E2M1[np.arange(256) >> 4]], axis=1)
SCALES = np.where(np.arange(256) == 255, 0, np.ldexp(1.0, np.arange(256) - 127)).astype(np.float32)


@dataclass(frozen=True)
class Shapes:
    hidden: int     # H: q_proj input width
    proj: int       # q_proj rows (KDA heads x head dim)
    latent: int     # expert input width (w1/w3), w2 rows
    inter: int      # expert intermediate width (w1/w3 rows, w2 input)
    experts: int    # distinct experts cycled so the working set exceeds the LLC
    probe_bytes: int
    heads: int      # MLA: query heads, each against every cached position
    positions: int  # MLA: cached latent positions one query sees
    kv_lora: int    # MLA: a cached latent's width (the values); keys add the rope dims
    rope: int


REAL = Shapes(7168, 12288, 3584, 3072, 16, 256 << 20, 96, 4096, 512, 64)
QUICK = Shapes(256, 384, 128, 64, 4, 4 << 20, 4, 64, 32, 8)



# ---- inputs (seeded) and numpy baselines ----


def make_inputs(s: Shapes, seed=0):
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 1 << 16, (s.proj, s.hidden), dtype=np.uint16)
    bf16 = (bits & 0x807F) | 0x3C00  # random sign and mantissa, magnitude in [2^-7, 2^-6)

    def mx(rows, cols):
        packed = np.frombuffer(rng.bytes(rows * cols // 2), np.uint8).reshape(rows, cols // 2)
        return packed, rng.integers(120, 123, (rows, cols // 32), dtype=np.uint8)  # MODEL.md §5 scales

    experts = [(*mx(s.inter, s.latent), *mx(s.latent, s.inter), *mx(s.inter, s.latent))
               for _ in range(s.experts)]  # (w1p, w1s, w2p, w2s, w3p, w3s), w2 = down
    xs = {(w, t): rng.standard_normal((t, w), dtype=np.float32)
          for w in (s.hidden, s.latent, s.inter) for t in (1, *GEMM_TOKENS)}
    return bf16, experts, xs


def numpy_bf16(w, x, buf):
    np.left_shift(w, 16, out=buf, dtype=np.uint32)  # BF16 -> float32 bits, exact
    return x @ buf.view(np.float32).T


def numpy_mxfp4(p, s, x, bufs):
    rows = p.shape[0]
    buf = bufs.setdefault(p.shape, np.empty((*p.shape, 2), np.float32))
    np.take(PAIRS, p, axis=0, out=buf, mode="clip")
    buf.reshape(rows, -1, 32)[...] *= SCALES[s][:, :, None]
    return x @ buf.reshape(rows, -1).T


def draft_weights(bf16):
    """q_proj as a draft trunk holds it (io/draft_trunk.py quantize, from the bf16 values): {kind: (data, scales)}."""
    from ...io.draft_trunk import INT4, INT8, STEP, quantize
    w = np.empty(bf16.shape, np.float32)
    w.view(np.uint32)[...] = bf16.astype(np.uint32) << 16
    step = max(1, STEP // bf16.shape[1])
    parts = {kind: [quantize(kind, w[lo:lo + step], "q_proj") for lo in range(0, len(w), step)]
             for kind in (INT8, INT4)}
    return {kind: tuple(np.concatenate(a) for a in zip(*p)) for kind, p in parts.items()}


def numpy_draft(kind, data, scales, x, f32):
    """The numpy path draft_linear was before the draft kernels: dequantize to float32 (into f32), then W @ x."""
    from ...io.draft_trunk import INT8, unpack_int4
    w = f32.view(np.float32)
    if kind == INT8:
        np.multiply(data, scales[:, None], out=w, dtype=np.float32)
    else:
        rows, cols = w.shape
        np.multiply(unpack_int4(data)[:, :cols].reshape(rows, -1), np.repeat(scales, 32, axis=1)[:, :cols], out=w,
                    dtype=np.float32)
    return x @ w.T


def numpy_attention(q, keys, values, scale):
    e = (q.astype(np.float64) @ keys.T.astype(np.float64)) * scale
    e = np.exp(e - e.max(axis=1, keepdims=True))
    return ((e / e.sum(axis=1, keepdims=True)) @ values.astype(np.float64)).astype(np.float32)


def numpy_expert(e, z, bufs, beta=4.0, lin=25.0):
    g, u = numpy_mxfp4(e[0], e[1], z, bufs), numpy_mxfp4(e[4], e[5], z, bufs)
    with np.errstate(over="ignore"):
        h = (beta * np.tanh(g / beta)) / (1 + np.exp(-g)) * (lin * np.tanh(u / lin))
    return numpy_mxfp4(e[2], e[3], h.astype(np.float32), bufs)


# ---- the work: one entry per table section ----

@dataclass
class Work:
    key: str
    title: str
    tokens: int
    bytes: int      # bytes one call counts: bf16 weight, MXFP4 packed, expert batch packed + scale
    macs: int       # weight x token (attention: query x position) products one call adds up: a multiply-add each
    native: object  # Kernels -> a zero-argument call
    numpy: object   # a zero-argument call doing the same work in numpy, or None (no baseline)


def cycled(f, args):
    """A call that applies f to the next args tuple each time, round and round."""
    nxt = itertools.cycle(args).__next__
    return lambda: f(*nxt())


def works(s: Shapes, bf16, experts, xs):
    mats = [(e[i], e[i + 1]) for e in experts for i in (0, 4, 2)]  # w1, w3, w2 of each expert
    f32, bufs = np.empty(bf16.shape, np.uint32), {}
    mx_set = (f"{len(mats)} matrices cycled (w1/w3 {s.inter}x{s.latent}, w2 {s.latent}x{s.inter}; "
              f"{size(sum(p.nbytes + sc.nbytes for p, sc in mats))} packed+scale)")

    def bf16_work(t):
        x, kind = xs[s.hidden, t], "GEMV" if t == 1 else "GEMM"
        return Work(f"bf16_t{t}", f"bf16 {kind} T={t}: q_proj {s.proj}x{s.hidden} ({size(bf16.nbytes)})", t,
                    bf16.nbytes, bf16.size * t, lambda k: lambda: k.linear(bf16, "BF16", x),
                    lambda: numpy_bf16(bf16, x, f32))

    def mx_work(t):
        args = [(p, sc, xs[p.shape[1] * 2, t]) for p, sc in mats]
        return Work(f"mxfp4_t{t}", f"MXFP4 {'GEMV' if t == 1 else 'GEMM'} T={t}: {mx_set}", t, mats[0][0].nbytes,
                    mats[0][0].size * 2 * t, lambda k: cycled(k.mxfp4_linear, args),
                    cycled(lambda *a: numpy_mxfp4(*a, bufs), args))

    def hot_work(kind, w, title, call):  # the same few rows every call: what the kernel computes without DRAM
        return Work(f"{kind}_t1_hot", f"{title} ({size(w.nbytes)}), the same rows every call (in cache)", 1,
                    w.nbytes, w.size * (2 if kind == "mxfp4" else 1), call, None)

    hot_bf16, (hot_p, hot_s) = bf16[:HOT_ROWS], (a[:HOT_ROWS * 4] for a in mats[0])
    hot_x, hot_mx = xs[s.hidden, 1], xs[s.latent, 1]
    hot = [hot_work("bf16", hot_bf16, f"bf16 GEMV T=1: the first {len(hot_bf16)} rows of q_proj",
                    lambda k: lambda: k.linear(hot_bf16, "BF16", hot_x)),
           hot_work("mxfp4", hot_p, f"MXFP4 GEMV T=1: the first {len(hot_p)} rows of one w1",
                    lambda k: lambda: k.mxfp4_linear(hot_p, hot_s, hot_mx))]
    z, batch_bytes = xs[s.latent, 1], sum(a.nbytes for e in experts for a in e)
    batch = Work("experts", f"{s.experts}-expert batch T=1: Kernels.expert on one latent vector "
                 f"({size(batch_bytes)} packed+scale)", 1, batch_bytes,
                 sum(e[i].size * 2 for e in experts for i in (0, 2, 4)),
                 lambda k: lambda: [k.expert(*e, z, 4.0, 25.0) for e in experts],
                 lambda: [numpy_expert(e, z, bufs) for e in experts])
    drafts = draft_weights(bf16)

    def draft_work(kind, t):
        (data, scales), x, short = drafts[kind], xs[s.hidden, t], kind.split("_")[0]
        call = (lambda k: lambda: k.int8_linear(data, scales, x)) if short == "int8" else \
            (lambda k: lambda: k.int4_linear(data, scales, s.hidden, x))
        return Work(f"draft_{short}_t{t}", f"draft {short} {'GEMV' if t == 1 else 'GEMM'} T={t}: q_proj "
                    f"{s.proj}x{s.hidden} as `k3 pack --draft {short}` holds it "
                    f"({size(data.nbytes + scales.nbytes)} codes+scales)", t,
                    data.nbytes + scales.nbytes, bf16.size * t, call, lambda: numpy_draft(kind, data, scales, x, f32))

    return [bf16_work(1), mx_work(1), *hot, batch, *map(bf16_work, GEMM_TOKENS), *map(mx_work, GEMM_TOKENS),
            *(draft_work(kind, t) for kind in drafts for t in DRAFT_TOKENS), attention_work(s)]


def attention_work(s: Shapes):
    """One query position of MLA attention over `positions` cached latents (the prefill cost model's
    macs_per_pair, heads x (keys' + values' widths), per position)."""
    rng = np.random.default_rng(1)
    q = rng.standard_normal((s.heads, s.kv_lora + s.rope), dtype=np.float32)
    keys = rng.standard_normal((s.positions, s.kv_lora + s.rope), dtype=np.float32)
    values, scale = np.ascontiguousarray(keys[:, :s.kv_lora]), (s.kv_lora + s.rope) ** -0.5
    return Work("mla_attention", f"MLA attention, one query position: {s.heads} heads over {s.positions} cached "
                f"latents of {s.kv_lora} + {s.rope} ({size(keys.nbytes)} of keys)", 1, keys.nbytes,
                s.heads * s.positions * (2 * s.kv_lora + s.rope),
                lambda k: lambda: k.mqa_attention(q, keys, values, scale),
                lambda: numpy_attention(q, keys, values, scale))


# ---- measuring ----

def measure_probe(s: Shapes, threads, seconds):
    """Sum a uint64 buffer with numpy, one slice per worker thread (numpy releases the GIL)."""
    buf = np.ones(s.probe_bytes // 8, np.uint64)
    rows = []
    for t in threads:
        with ThreadPoolExecutor(t) as pool:
            parts = np.array_split(buf, t)
            m = timed(lambda: list(pool.map(np.add.reduce, parts)), seconds)
        rows.append(dict(threads=t, bytes=buf.nbytes, **m, gbps=buf.nbytes / m["median_s"] / 1e9,
                         best_gbps=buf.nbytes / m["min_s"] / 1e9))
    small = buf[: 32 << 10]  # 256 KiB: stays in L2, so this is numpy's compute ceiling
    m = timed(lambda: [np.add.reduce(small) for _ in range(64)], seconds / 4)
    return rows, small.nbytes * 64 / m["median_s"] / 1e9


def row(work, backend, threads, m, probe, numpy_row=None, fma=None):
    """One table row; native rows (threads set) also get per-core, probe and numpy ratios and targets."""
    gbps = work.bytes / m["median_s"] / 1e9
    r = dict(bench=work.key, backend=backend, threads=threads, tokens=work.tokens, bytes=work.bytes, **m,
             gbps=gbps, best_gbps=work.bytes / m["min_s"] / 1e9, tokens_per_s=work.tokens / m["median_s"])
    if not threads:
        return r
    bound = (fma or {}).get((backend, threads))
    r.update(gbps_per_core=gbps / threads, vs_probe=gbps / probe[threads] if threads in probe else None,
             vs_numpy=gbps / numpy_row["gbps"] if numpy_row else None,
             vs_fma=work.macs / m["median_s"] / bound if bound else None, targets={})
    if work.key in ("bf16_t1", "mxfp4_t1"):
        r["targets"][f"numpy>={TARGET_VS_NUMPY:g}x"] = r["vs_numpy"] >= TARGET_VS_NUMPY
    if work.key == "mxfp4_t1":
        r["targets"][f"GB/s/core>={TARGET_MX_PER_CORE:g}"] = r["gbps_per_core"] >= TARGET_MX_PER_CORE
    if work.key == "bf16_t1" and r["vs_probe"] is not None:
        r["targets"][f"probe>={TARGET_BF16_PROBE:.0%}"] = r["vs_probe"] >= TARGET_BF16_PROBE
    return r


def run_kernels(backends, threads, seconds, quick, log=lambda *_: None):
    from ... import _native
    s = QUICK if quick else REAL
    probe_rows, in_cache = measure_probe(s, threads, seconds)
    probe = {p["threads"]: p["gbps"] for p in probe_rows}
    log("FMA probe")
    fma_rows = measure_fma(backends, threads, seconds)
    fma = {(f["backend"], f["threads"]): f["macs_per_s"] for f in fma_rows}
    ws, results = works(s, *make_inputs(s)), []
    for w in ws:
        log(w.title)
        base = None if w.numpy is None else row(w, "numpy", None, timed(w.numpy, seconds), probe)
        results += [base] if base else []
        results += [row(w, name, t, timed(w.native(_native.Kernels(name, t)), seconds), probe, base, fma)
                    for name, t in itertools.product(backends, threads)]
    for r in results:  # a batch's tokens/s against one token's, same backend and threads
        single = next((o for o in results if o["bench"] == r["bench"].rsplit("_t", 1)[0] + "_t1"
                       and o["backend"] == r["backend"] and o["threads"] == r["threads"]), None)
        if r["tokens"] > 1 and single is not None and r["bench"] != "experts":
            r["vs_t1"] = r["tokens_per_s"] / single["tokens_per_s"]
    return dict(machine=machine_info(), settings=dict(backends=backends, threads=threads, seconds=seconds,
                                                     quick=quick, shapes=s.__dict__),
                probe=dict(method="numpy uint64 add.reduce, one slice per thread", rows=probe_rows,
                           in_cache_gbps=in_cache),
                fma_probe=dict(method="the backend's widest double FMA, 12 independent chains per thread, calls of "
                                      "20 ms or more", rows=fma_rows),
                benches={w.key: w.title for w in ws}, results=results)



# ---- output ----

def _num(v, fmt, suffix=""):
    return "-" if v is None else format(v, fmt) + suffix


def size(n):
    return f"{n / MB:.0f} MB" if n >= MB else f"{n / 1e3:.0f} kB"


def format_table(doc) -> str:
    m, st, pr = doc["machine"], doc["settings"], doc["probe"]
    llc = f"LLC {m['llc_bytes'] >> 20} MiB" if m["llc_bytes"] else "LLC unknown"
    out = [f"k3 bench kernels: {m['cpu']}, {m['cores']} cores, {llc}; backends {','.join(st['backends'])} "
           f"(available: {','.join(m['backends'])}); {m['build']['compiler']} {m['build']['flags']}",
           f"timing: a warm-up call, then repeats for {st['seconds']:g} s (at least 3); per-call median and "
           "min; GB/s, tok/s and ratios use the median",
           "bg: cores' worth of CPU that other processes took during the cell (above 0.1: disturbed)", "",
           f"memory-read probe: {pr['method']}, {pr['rows'][0]['bytes'] >> 20} MiB buffer "
           f"(the same loop in L2: {pr['in_cache_gbps']:.1f} GB/s)", "  threads  GB/s median  GB/s best    bg"]
    out += [f"  {p['threads']:>7}  {p['gbps']:>11.1f}  {p['best_gbps']:>9.1f} {_num(p['background_cores'], '5.2f'):>5}"
            for p in pr["rows"]]
    out += ["", f"FMA probe: {doc['fma_probe']['method']}; the bound of every product below (%FMA: its weight x "
            "token multiply-adds, or attention's query x position ones, per second against this)",
            "  backend  thr  G mul-add/s    bg"]
    out += [f"  {f['backend']:<8} {f['threads']:>3}  {f['macs_per_s'] / 1e9:>11.2f} "
            f"{_num(f['background_cores'], '5.2f'):>5}" for f in doc["fma_probe"]["rows"]]
    head = (f"  {'backend':<8} {'thr':>3} {'median ms':>10} {'min ms':>9} {'GB/s':>7} {'GB/s/core':>9} "
            f"{'tok/s':>9} {'xT=1':>6} {'xnumpy':>7} {'%probe':>6} {'%FMA':>5}    bg  targets")
    for key, title in doc["benches"].items():
        out += ["", title, head]
        for r in (r for r in doc["results"] if r["bench"] == key):
            marks = "  ".join(("✓ " if ok else "✗ ") + name for name, ok in r.get("targets", {}).items())
            pct = None if r.get("vs_probe") is None else 100 * r["vs_probe"]
            fma_pct = None if r.get("vs_fma") is None else 100 * r["vs_fma"]
            out.append(f"  {r['backend']:<8} {r['threads'] or '-':>3} {r['median_s'] * 1e3:>10.2f} "
                       f"{r['min_s'] * 1e3:>9.2f} {r['gbps']:>7.2f} {_num(r.get('gbps_per_core'), '.2f'):>9} "
                       f"{r['tokens_per_s']:>9.1f} {_num(r.get('vs_t1'), '.2f', 'x'):>6} "
                       f"{_num(r.get('vs_numpy'), '.2f', 'x'):>7} {_num(pct, '.1f'):>6} {_num(fma_pct, '.0f'):>5} "
                       f"{_num(r['background_cores'], '.2f'):>5}  {marks}".rstrip())
    return "\n".join(out)


def _csv(text, what, convert=str):
    try:
        items = [convert(p.strip()) for p in text.split(",") if p.strip()]
    except ValueError:
        items = []
    if not items:
        raise UsageError(f"--{what} {text!r}: expected a comma-separated list, e.g. 1,2")
    return items


def cmd_kernels(args) -> int:
    import sys

    from ... import _native
    from ...interfaces import default_threads
    available = _native.available_backends()
    backends = _csv(args.backends, "backends") if args.backends else available
    unknown = [b for b in backends if b not in available]
    if unknown:
        raise UsageError(f"--backends: {','.join(unknown)} not available here (available: {','.join(available)})")
    threads = _csv(args.threads, "threads", int) if args.threads else sorted({1, default_threads()})
    if min(threads) < 1:
        raise UsageError(f"--threads {args.threads}: thread counts must be at least 1")
    seconds = args.seconds if args.seconds is not None else (0.01 if args.quick else 1.0)
    if seconds <= 0:
        raise UsageError(f"--seconds must be positive, got {seconds}")
    tty = sys.stderr.isatty()
    doc = run_kernels(backends, threads, seconds, args.quick, lambda t: tty and print(t, file=sys.stderr, flush=True))
    print(json.dumps(doc, indent=1) if args.json else format_table(doc))
    return 0


KERNELS_HELP = f"""\
Time the native matrix kernels on real K3 shapes (MODEL.md §1/§3/§5), all in one run:
  memory-read probe  numpy sum of a 256 MiB uint64 buffer (8x a 32 MiB LLC), one slice per thread:
                     how fast plain streaming code reads DRAM here; the yardstick for bf16
  FMA probe          each backend's widest double multiply-add in 12 independent chains per thread:
                     the most any product can do here, as the contract adds every weight x token
                     product in double (docs/NUMERICS.md); %FMA = a kernel's products per second
                     against it, so the gap to this core's limit is on screen
  bf16 GEMV          KDA q_proj 12288x7168 BF16 (176 MB), T=1: weight GB/s, % of the probe
  MXFP4 GEMV         expert w1/w3 3072x3584 and w2 3584x3072, 16 experts cycled (~281 MB, so every
                     call reads DRAM): PACKED GB/s, total and per core (= per thread)
  in-cache GEMVs     the first 64 rows of q_proj (917 kB) and 256 rows of one w1 (458 kB packed),
                     the same rows every call: what the kernel computes when DRAM is not the limit
  16-expert batch    Kernels.expert x16 on one latent vector, as one MoE layer runs: s and GB/s
                     (packed + scale bytes)
  small-batch GEMM   the same bf16 and MXFP4 work with T=2, 4, 8, 16, 64: weight GB/s, tokens/s and
                     tokens/s against T=1 (xT=1): what one pass over the weights gives several positions
  draft products     q_proj quantized as a draft trunk holds it (int8 rows; int4 groups of 32), T=1 and
                     64: codes+scales GB/s; numpy dequantizes to float32, then W @ x
  numpy baselines    the same work in numpy: bf16 widened to float32 then W @ x; MXFP4 decoded
                     with lookup tables then W @ x (BLAS threads as numpy ships them)
Each cell: one warm-up call, repeats for --seconds (at least 3), median and min per call; inputs
are seeded. Ratios use baselines from the same run.

targets (printed with ✓/✗, never asserted):
  MXFP4 GEMV >= {TARGET_MX_PER_CORE:g} GB/s packed per core; bf16 GEMV >= {TARGET_BF16_PROBE:.0%} of the probe at the
  same thread count; both >= {TARGET_VS_NUMPY:g}x numpy.
"""


def add_parser(sub) -> None:
    from ..options import SECONDS

    k = sub.add_parser("kernels", help="native kernels vs a memory probe and numpy, on K3 shapes",
                       description=KERNELS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  k3 bench kernels                         # every backend, 1 and all cores\n"
                              "  k3 bench kernels --backends avx2 --threads 2 --seconds 3\n"
                              "  k3 bench kernels --quick --json          # tiny shapes, for tests")
    k.add_argument("--json", action="store_true", help="print a JSON document instead of the table")
    k.add_argument("--backends", metavar="A,B", help="backends to time (default: all available here)")
    k.add_argument("--threads", metavar="1,2", help="thread counts (default: 1 and every core)")
    k.add_argument("--quick", action="store_true", help="tiny shapes and 0.01 s per cell (for tests)")
    k.add_argument("--seconds", type=SECONDS, metavar="S", help="time per cell (default 1; 0.01 with --quick)")
    k.set_defaults(func=cmd_kernels)
