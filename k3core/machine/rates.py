"""What this machine computes per second, measured: a timing loop that reports how much CPU others took
meanwhile, the bf16 GEMV sweep a token's kernels resemble, the trunk codec's restore rate, and what the
machine is (CPU, caches, kernel backends). `k3 bench`, `k3 setup`'s codec choice and the benchmarks use
these."""
from __future__ import annotations

import glob
import itertools
import os
import platform
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def cpu_seconds():
    """(CPU seconds all cores spent busy or stolen, CPU seconds of this process); None without /proc."""
    try:
        with open("/proc/stat") as f:
            v = f.readline().split()  # cpu user nice system idle iowait irq softirq steal
        busy = sum(int(x) for x in v[1:4] + v[6:9]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    t = os.times()
    return busy, t.user + t.system



def timed(call, seconds, min_reps=3):
    """One warm-up call, then repeat for `seconds` (at least min_reps). background_cores: how many
    cores' worth of CPU other processes (or the hypervisor) took meanwhile; None if too short to tell."""
    call()
    times, c0, start = [], cpu_seconds(), time.perf_counter()
    while len(times) < min_reps or (time.perf_counter() - start < seconds and len(times) < 100000):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    wall, c1 = time.perf_counter() - start, cpu_seconds()
    other = None if c0 is None or wall < 0.25 else max(0.0, round((c1[0] - c0[0] - c1[1] + c0[1]) / wall, 2))
    return dict(median_s=statistics.median(times), min_s=min(times), reps=len(times), background_cores=other)



def bf16_gemv_sweep(threads: int):
    """(call, bytes): one bf16 GEMV over each of four 4096 × 4096 weights, 128 MB cycled so they come from
    RAM as a streamed layer's do, on the best backend with `threads` threads; and the weight bytes a call reads."""
    from .. import _native

    kernels = _native.Kernels(_native.available_backends()[0], threads)
    weights = [np.random.default_rng(i).integers(0, 1 << 16, (4096, 4096), dtype=np.uint16) & 0xBFFF
               for i in range(4)]
    x = np.ones((1, 4096), np.float32)
    return (lambda: [kernels.linear(w, "BF16", x) for w in weights]), sum(w.nbytes for w in weights)



def llc_bytes():
    """The largest cache sysfs reports for cpu0 (e.g. "32768K"), or None."""
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        with open(path) as f:
            text = f.read().strip()
        sizes.append(int(text.rstrip("KM")) << {"K": 10, "M": 20}.get(text[-1], 0))
    return max(sizes, default=None)



def machine_info():
    from .. import _native
    from ..interfaces import default_threads
    from ..plan.budget import cpu_name
    return dict(cpu=cpu_name(), cores=default_threads(), llc_bytes=llc_bytes(), backends=_native.available_backends(),
                build=_native.build_info(), numpy=np.__version__, python=platform.python_version())


def restore_rate(pairs: list, block: int, threads: int, seconds: float) -> float:
    """Restored bytes per second of (Block, stored bytes) pairs restored over and over on `threads` threads,
    for about `seconds` after a warm-up."""
    from ..io import codec

    def restore_all(share: list) -> int:
        out, n = bytearray(block), 0
        for b, s in share:
            codec.restore(b, s, out, "bench block")
            n += b.restored
        return n

    shares = [pairs[i::threads] for i in range(threads)]
    restore_all(pairs[: max(1, len(pairs) // 20)])  # warm
    done, start = 0, time.perf_counter()
    while True:
        with ThreadPoolExecutor(threads) as pool:
            done += sum(pool.map(restore_all, shares))
        if (elapsed := time.perf_counter() - start) >= seconds:
            return done / elapsed



def gaussian_restore_rate(seconds: float, threads: int = 1, blocks: int = 64) -> float:
    """restore_rate on `threads` threads of Gaussian BF16 weights coded as `k3 pack --codec planes` codes them
    (the kind of bytes a trained trunk holds; `wide`'s own blocks restore at the same rate), 64 MiB of them so
    they come from RAM as a streamed layer's do."""
    from ..io import codec

    values = np.random.default_rng(0).standard_normal(blocks * codec.BLOCK // 2).astype(np.float32) * 0.02
    coded, stored = codec.encode_run((values.view(np.uint32) >> 16).astype("<u2").tobytes())
    return restore_rate([(b, s[:b.stored]) for b, s in zip(coded, stored)], codec.BLOCK, threads, seconds)


PROBE_CALL_SECONDS = 0.02


def probe_rounds(name, seconds=PROBE_CALL_SECONDS, clock=time.perf_counter):
    """Rounds of backend `name`'s FMA probe that take at least `seconds` on one thread. A pool's start and join
    (~0.1 ms) count against each timed call: 200,000 AVX-512 rounds (0.4 ms) read an Ice Lake core's probe 15 % low on
    one thread and 30 % low on two, and every share of the probe that much too high."""
    from .. import _native
    rounds = 1_000
    while True:
        start = clock()
        _native.fma_probe(name, rounds)
        took = clock() - start
        if took >= seconds:
            return rounds
        rounds *= 16 if took <= 0 else max(2, min(16, int(1.25 * seconds / took) + 1))


def measure_fma(backends, threads, seconds):
    """Each backend's FMA bound: its probe loop (12 independent chains of its widest double multiply-add)
    on `threads` threads at once, each call at least PROBE_CALL_SECONDS long; multiply-adds per second, all
    threads together."""
    from .. import _native
    rows = []
    for name, t in itertools.product(backends, threads):
        rounds = probe_rounds(name)
        with ThreadPoolExecutor(t) as pool:
            macs = _native.fma_probe(name, rounds) * t
            m = timed(lambda: list(pool.map(lambda _: _native.fma_probe(name, rounds), range(t))), seconds / 4)
        rows.append(dict(backend=name, threads=t, **m, macs_per_s=macs / m["median_s"]))
    return rows
