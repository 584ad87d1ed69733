"""The machine checks `k3 doctor` prints and `k3 setup` runs: is this machine ready to stream Kimi K3, and
what to change if not.

Each check says ok, warn or fail, what it found and, for warn/fail, the exact fix. The disk checks write,
fsync, evict and re-read a temporary file under PATH (O_DIRECT where the filesystem allows), then delete it.
With a model installed (the saved profile's: the demo's, or any), free space is judged against what that model
still needs, and K3's need is said for reference only.
"""
from __future__ import annotations

import os
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..files.aligned_io import aligned_buffer
from ..io.trunk_reader import READ_BYTES
from ..plan import budget
from ..plan.budget import GB, PRESETS, WORKING_BYTES, human
from ..errors import K3Error, UsageError

CHECKPOINT_BYTES = 1_560_936_091_448  # the released checkpoint, every shard
TRUNK_BYTES = 113.5e9                 # a packed trunk (k3 pack): dense trunk + embed + lm_head
EXPERT_BYTES = 25.83e9                # routed-expert bytes one decode token reads at 0 % cache hit
GOOD_READ = 2e9                       # bytes/s; below it streaming is disk-bound (NVMe gives 3-6 GB/s)
CHUNK = 8 << 20                        # bytes per write of the speed test
REBUILD = "rm -rf build .venv/.k3-installed && env -u CXXFLAGS -u CFLAGS make install  (rebuilds k3core._native)"
FTZ_FIX = ("start k3 without what switches flush-to-zero on: unset LD_PRELOAD, drop any plugin or library built "
           "with -ffast-math (`k3 plugins` lists plugins)")
DIRECT_FIX = "keep the model on a local filesystem that takes O_DIRECT (ext4 or xfs; not tmpfs or a network mount)"


@dataclass(frozen=True)
class Target:
    """What the machine is checked for: the released K3 unless told otherwise (the demo model, a local one)."""

    name: str = "Kimi K3"
    checkpoint_bytes: int = CHECKPOINT_BYTES
    trunk_bytes: int = int(TRUNK_BYTES)

    @property
    def in_ram(self) -> bool:
        """Whether the whole checkpoint fits in what is free now: then nothing streams from disk."""
        return self.checkpoint_bytes + WORKING_BYTES <= budget.mem_available()


RELEASED = Target()


@dataclass
class Check:
    name: str
    status: str  # ok | warn | fail
    finding: str
    fix: str = ""
    data: dict = field(default_factory=dict)


def _missing_feature(feats: dict) -> str:
    arch = platform.machine().lower()
    if arch in ("x86_64", "amd64", "i386", "i686"):
        return "+".join(f for f in ("avx2", "fma") if not feats.get(f))
    if arch in ("aarch64", "arm64"):
        return "" if feats.get("neon") else "neon"
    return f"a SIMD backend for {arch} (k3 has avx2/avx512 for x86-64, neon for aarch64)"


def check_cpu(native) -> Check:
    feats = {k: bool(v) for k, v in native.cpu_features().items()}
    backends = list(native.available_backends())
    data = {"machine": platform.machine(), "features": feats, "backends": backends, "default": backends[0]}
    have = "+".join(k for k, v in feats.items() if v) or "no SIMD features"
    finding = f"{have} -> --kernels default {backends[0]} (available: {', '.join(backends)})"
    if os.environ.get("K3_KERNELS"):
        finding += f"; K3_KERNELS={os.environ['K3_KERNELS']} overrides the default"
    if backends[0] != "scalar":
        return Check("cpu -> kernels", "ok", finding, data=data)
    data["missing"] = missing = _missing_feature(feats)
    if not missing:
        return Check("cpu -> kernels", "warn", f"{finding}; the CPU has {have} but this build has no SIMD backend",
                     REBUILD, data)
    return Check("cpu -> kernels", "warn", f"{finding}; only scalar: this CPU lacks {missing}", "nothing to change "
                 "for correctness (scalar gives the same bits, slower); for speed, a CPU with AVX2+FMA or NEON", data)


def check_build(native) -> Check:
    info = {k: str(v) for k, v in native.build_info().items()}
    flags = info.get("flags", "").split()
    data = {**info, "python": platform.python_version(), "numpy": np.__version__}
    finding = f"{info.get('compiler', '?')} {' '.join(flags)}; Python {data['python']}, numpy {data['numpy']}"
    problems = [] if "-ffp-contract=off" in flags else ["-ffp-contract=off is missing (a*b+c may fuse into an FMA)"]
    fast = [f for f in flags if f == "-Ofast" or ("fast-math" in f and f != "-fno-fast-math")]
    problems += [f"{' '.join(fast)} reorders and flushes floats"] if fast else []
    if problems:
        return Check("build", "fail", f"{finding}; not exact: {'; '.join(problems)}", REBUILD, data)
    return Check("build", "ok", finding, data=data)


def check_fp(native) -> Check:
    try:
        out = float(native.Kernels("scalar", 1).sigmoid(np.zeros(1, np.float32))[0])
    except RuntimeError as exc:
        return Check("fp environment", "fail", str(exc), FTZ_FIX)
    if out != 0.5:
        return Check("fp environment", "fail", f"scalar sigmoid(0) gave {out!r}, not 0.5", REBUILD, {"sigmoid0": out})
    return Check("fp environment", "ok", "round to nearest, no flush-to-zero: the scalar kernel ran, sigmoid(0) = 0.5",
                 data={"sigmoid0": out})


def check_ram(target: Target = RELEASED) -> Check:
    total, avail = budget.mem_total(), budget.mem_available()
    if target is not RELEASED and target.in_ram:
        return Check("ram -> preset", "ok", f"MemTotal {human(total)}, MemAvailable {human(avail)}: the whole "
                     f"{target.name} ({human(target.checkpoint_bytes)}) fits in RAM; nothing streams",
                     data={"mem_total": total, "mem_available": avail, "auto": None, "needs": {}})
    needs = {n: int((t + c) * GB + WORKING_BYTES) for n, (t, c) in PRESETS.items()}
    try:
        auto = budget.auto_preset(avail)
    except K3Error:
        auto = None
    data = {"mem_total": total, "mem_available": avail, "auto": auto, "needs": needs}
    head = f"MemTotal {human(total)}, MemAvailable {human(avail)}"
    tail = " (presets need, plus decode state: " + ", ".join(f"{n} {human(b)}" for n, b in needs.items()) + ")"
    if auto is None:
        return Check("ram -> preset", "warn", f"{head}: below the laptop preset's {human(needs['laptop'])}{tail}",
                     f"free {human(needs['laptop'] - avail)} more RAM (close other programs) or use a machine with "
                     "more; `k3 presets` lists the budgets", data)
    finding = f"{head} -> --preset auto picks {auto}{tail}"
    if avail < target.trunk_bytes:
        finding += (f"; too little to hold the whole trunk ({human(target.trunk_bytes)}): pack it (k3 pack) and run "
                    "with --trunk")
    return Check("ram -> preset", "ok", finding, data=data)


def check_path(path: str) -> None:
    if not os.path.isdir(path):
        what = "not a directory" if os.path.exists(path) else "no such directory"
        raise UsageError(f"{path}: {what}; give the directory the model lives (or will live) on, e.g. "
                         f"`k3 doctor /data/k3`" + ("" if os.path.exists(path) else f", or create it: mkdir -p {path}"))
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{path}: not writable, so its read speed cannot be measured; give a writable directory "
                         f"on the same drive, or make it yours: sudo chown $USER {path}")


def check_space(path: str, target: Target = RELEASED) -> Check:
    """Free space under `path` for `target`; for the released K3 with a model already installed (the saved profile's,
    the demo's or any other), for what that model still needs instead, K3's own need said for reference."""
    installed = installed_needs() if target is RELEASED else None
    if installed is not None:
        return check_installed_space(path, *installed)
    free = shutil.disk_usage(path).free
    ckpt, trunk = human(target.checkpoint_bytes), human(target.trunk_bytes)
    data = {"free": free, "checkpoint": target.checkpoint_bytes, "packed_trunk": target.trunk_bytes}
    if free >= target.checkpoint_bytes + target.trunk_bytes:
        return Check("disk space", "ok", f"{human(free)} free: room for the checkpoint ({ckpt}) and a packed trunk "
                     f"({trunk})", data=data)
    if free >= target.trunk_bytes:
        return Check("disk space", "warn", f"{human(free)} free: room for a packed trunk ({trunk}), not for the "
                     f"checkpoint ({ckpt})", "none if the checkpoint is on this drive already; else keep it on one "
                     f"with >= {ckpt} free (check it: k3 doctor /that/drive)", data)
    return Check("disk space", "warn", f"{human(free)} free: too little for the checkpoint ({ckpt}) or a packed "
                 f"trunk ({trunk})", "free space, or pack onto another drive: k3 pack MODEL_DIR /other/trunk", data)


def installed_needs() -> tuple[str, bool, list[tuple[Path, int, str]]] | None:
    """(model, its trunk packed, [(directory, bytes, what)]) for the saved profile's model when its directory holds a
    checkpoint, else None: what it still needs on disk — the packed trunk the profile names, when not packed yet,
    and the prompt cache's files (its default disk allowance, less what they hold now)."""
    from ..io.pack import packed_trunk_bytes
    from ..plan.profile import DEFAULT_PROMPT_CACHE_DISK_GB, default_prompt_cache_dir
    from ..io.trunk import TRUNK

    profile = installed_profile()
    if profile is None:
        return None
    try:
        packed = bool(profile.trunk) and (Path(profile.trunk) / TRUNK).is_file()
        needs = [(Path(profile.trunk), packed_trunk_bytes(profile.model), "its packed trunk")] \
            if profile.trunk and not packed else []
    except K3Error:  # a damaged checkpoint: the check for the released model
        return None
    cache = default_prompt_cache_dir()
    allowance = int(DEFAULT_PROMPT_CACHE_DISK_GB * 1e9) - _bytes_under(cache)
    return profile.model, packed, needs + [(cache, max(0, allowance), "prompt cache files")]


def check_installed_space(path: str, model: str, packed: bool, needs: list[tuple[Path, int, str]]) -> Check:
    """Free space for what the installed `model` still needs, each filesystem on its own; Kimi K3's need said as
    information, never a warning, to whoever set up only the demo."""
    free, groups = shutil.disk_usage(path).free, {}
    for where, nbytes, what in needs:
        groups.setdefault(os.stat(_existing(where)).st_dev, []).append((where, nbytes, what))
    found, short = [], []
    for items in groups.values():
        need, there = sum(n for _, n, _ in items), shutil.disk_usage(_existing(items[0][0])).free
        parts = " + ".join(f"{human(n)} for {what} ({where})" for where, n, what in items)
        found.append(f"{parts}{f' = {human(need)}' if len(items) > 1 else ''}, {human(there)} free there")
        if need > there:
            short.append(items[0][0])
    finding = (f"{human(free)} free; the profile's model {model} is on disk{', its trunk packed,' if packed else ''} "
               f"and still needs at most {'; '.join(found)}: {'too little' if short else 'room for it'}. For "
               f"reference, Kimi K3 itself takes {human(CHECKPOINT_BYTES)} for its checkpoint and "
               f"{human(TRUNK_BYTES)} for a packed trunk")
    data = {"free": free, "model": model, "needs": [{"path": str(w), "bytes": n, "what": t} for w, n, t in needs],
            "checkpoint": CHECKPOINT_BYTES, "packed_trunk": int(TRUNK_BYTES)}
    if short:
        return Check("disk space", "warn", finding, f"free space on {short[0]}, give the prompt cache less disk "
                     "(--prompt-cache-disk-gb GB, or --prompt-cache off), or pack the trunk onto another drive: "
                     "k3 pack MODEL_DIR /other/trunk", data)
    return Check("disk space", "ok", finding, data=data)


def _existing(path: Path) -> Path:
    """`path`, or its nearest ancestor that exists (where a directory not made yet will be)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _bytes_under(directory: Path, limit: int = 100_000) -> int:
    """Bytes of the files under `directory` (the first `limit` of them; 0 when it does not exist)."""
    total = 0
    for _, (root, _, files) in zip(range(limit), os.walk(directory)):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name), follow_symlinks=False).st_size
            except OSError:
                pass
    return total


def _read_back(name: str, size: int, direct: bool) -> float:
    """Seconds to read `size` bytes of `name` sequentially, as the engine streams a trunk layer: reads of
    READ_BYTES one after another, into a page-aligned buffer with huge pages (as its ring slots have)."""
    fd, buf = os.open(name, os.O_RDONLY | (os.O_DIRECT if direct else 0)), aligned_buffer(READ_BYTES, huge=True)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        np.frombuffer(buf, np.uint8)[::4096] = 0  # its pages exist before the clock starts, as the ring's do
        done, start = 0, time.perf_counter()
        while done < size:
            n = os.preadv(fd, [buf], done)
            if n <= 0:
                raise OSError(f"the read stopped at byte {done} of {size}")
            done += n
        return time.perf_counter() - start
    finally:
        os.close(fd)
        buf.close()


def measure_read(path: str, mib: int) -> dict:
    """Write `mib` MiB of random bytes under `path`, fsync, evict, time reading them back; delete the file."""
    fd, name = tempfile.mkstemp(prefix=".k3-doctor-", suffix=".tmp", dir=path)
    try:
        size, block, written = mib << 20, memoryview(os.urandom(CHUNK)), 0  # random: compression can't shortcut
        while written < size:
            written += os.write(fd, block[:min(CHUNK, size - written)])
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        refusal = None
        try:
            seconds = _read_back(name, size, direct=True)
        except OSError as exc:  # some filesystems refuse the flag at open, others at the first read
            refusal, seconds = exc.strerror or str(exc), _read_back(name, size, direct=False)
        return {"bytes": size, "seconds": seconds, "bytes_per_s": size / max(seconds, 1e-9),
                "direct": refusal is None, "direct_refusal": refusal}
    finally:
        os.close(fd)
        os.unlink(name)


def installed_profile():
    """The saved profile when its model directory holds a checkpoint; None without one (or a damaged profile: the
    checks are then for the released model)."""
    from ..plan.profile import load_profile

    try:
        profile = load_profile()
    except K3Error:
        return None
    return profile if profile is not None and (Path(profile.model) / "config.json").is_file() else None


def installed_target() -> Target | None:
    """The saved profile's model as a Target (its shards' bytes) when it is installed (installed_profile), else None."""
    profile = installed_profile()
    if profile is None:
        return None
    root = Path(profile.model)
    size = sum(f.stat().st_size for f in root.glob("*.safetensors"))
    return Target(f"the profile's model {root.name} ({human(size)})", size, size)


def check_read(m: dict, fs: str, target: Target = RELEASED) -> Check:
    rate, how = m["bytes_per_s"], "O_DIRECT" if m["direct"] else (
        f"buffered (O_DIRECT refused: {m['direct_refusal']}; the page cache may flatter it)")
    finding = f"{rate / 1e9:.2f} GB/s reading {m['bytes'] >> 20} MiB back, sequential, {how}"
    if fs in ("tmpfs", "ramfs") or rate > 15e9:
        finding += f"; {fs}: RAM-backed or cached, not what a disk delivers"
    if rate >= GOOD_READ:
        return Check("disk read", "ok", finding, data=m)
    if target is not RELEASED and target.in_ram:
        return Check("disk read", "ok", f"{finding}; enough: {target.name} is read once, then runs from RAM", data=m)
    installed = installed_target() if target is RELEASED else None
    if installed is not None and installed.in_ram:  # right after the demo: K3's need is information, not a warning
        return Check("disk read", "ok", f"{finding}; enough: {installed.name} is read once, then runs from RAM. For "
                     f"reference, Kimi K3 streams: at this speed a token reading ~25.8 GB of experts would wait "
                     f"~{EXPERT_BYTES / rate:.0f} s on the disk alone (NVMe: 3-6 GB/s)", data=m)
    return Check("disk read", "warn", f"{finding}; streaming wants >= 2 GB/s (NVMe: 3-6 GB/s): at this speed a token "
                 f"reading ~25.8 GB of experts waits ~{EXPERT_BYTES / rate:.0f} s on the disk alone",
                 "keep the checkpoint and packed trunk on a local NVMe drive (measure one: k3 doctor /nvme/dir); "
                 "small samples are noisy: retry with --read-mb 1024", m)


def _fs_type(path: str) -> str:
    real, best = os.path.realpath(path), ("", "unknown")
    with open("/proc/self/mounts") as f:
        for line in f:
            point, fstype = line.split()[1:3]
            point = point.replace("\\040", " ")
            if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(best[0]):
                best = (point, fstype)
    return best[1]


def check_direct(m: dict | None, path: str, target: Target = RELEASED) -> Check:
    fs = _fs_type(path)
    data = {"filesystem": fs, "direct": None if m is None else m["direct"]}
    if m is not None and m["direct"]:
        return Check("O_DIRECT", "ok", f"supported on {fs}: expert reads bypass the page cache", data=data)
    if target is not RELEASED and target.in_ram:
        return Check("O_DIRECT", "ok", f"{'refused' if m is not None else 'not checked'} on {fs}; not needed: "
                     f"{target.name} runs from RAM", data=data)
    finding = (f"not checked on {fs}: the test file could not be written" if m is None else f"refused on {fs} "
               f"({m['direct_refusal']}): the expert store falls back to buffered reads (1.3-1.9 GB/s vs 6.4 GB/s "
               "direct in the C engine under a memory cap)")
    return Check("O_DIRECT", "warn", finding, DIRECT_FIX, data)


def check_threads() -> Check:
    avail, total = len(os.sched_getaffinity(0)), os.cpu_count() or 1
    data = {"available": avail, "cpu_count": total}
    finding = f"{avail} of {total} CPUs available to this process: kernels default to {avail} threads (--threads N)"
    if avail < total:
        return Check("threads", "warn", finding + "; an affinity mask (taskset, numactl, a cpuset) limits it",
                     f"if unintended, run without the mask, e.g. taskset -c 0-{total - 1} k3 run ...", data)
    return Check("threads", "ok", finding, data=data)


def check_tuning() -> Check:
    """The settings `k3 tune` saved in the profile: what they are and what they were measured to gain, or that they
    came from another machine (then runs do not use them)."""
    from ..errors import K3Error
    from ..plan.profile import load_profile
    from ..plan.tuned import tuning_for

    try:
        profile = load_profile()
        tuned, line = tuning_for(profile)
    except K3Error as exc:
        return Check("tuning", "warn", f"the saved profile's tuning cannot be read: {exc}", TUNE_FIX)
    if profile is None or not profile.tuned:
        where = "the saved profile's model is" if profile is not None else "nothing is (no saved profile yet)"
        return Check("tuning", "ok", f"not tuned: {where} run with the defaults; `k3 tune` measures the fastest "
                                     "exact settings for this machine")
    if tuned is None:
        return Check("tuning", "warn", line.removeprefix("k3: "), TUNE_FIX, {"tuned": profile.tuned})
    m = tuned.measured
    spt = m.get("seconds_per_token") or {}
    figures = (f"; measured {spt['untuned']:.3f} s/token untuned, {spt['tuned']:.3f} tuned on "
               f"{m['workload']['prompts']} prompts × {m['workload']['reply_ids']} ids"
               if spt.get("untuned") and spt.get("tuned") else "")
    partial = "" if m.get("complete", True) else " (cut short: not every knob was tried)"
    return Check("tuning", "ok", f"tuned {tuned.when[:16].replace('T', ' ')} UTC{partial}: {tuned.summary()}{figures}",
                 data={"tuned": profile.tuned})


TUNE_FIX = "run `k3 tune` (a few minutes): it measures this machine and saves what wins in the profile"


def run_checks(path: str, read_mb: int, target: Target = RELEASED) -> list[Check]:
    try:
        from .. import _native  # ImportError when the extension was never built or is stale
        checks = [check_cpu(_native), check_build(_native), check_fp(_native)]
    except ImportError as exc:
        why = f"k3core._native does not import ({exc})"
        checks = [Check(n, "fail", why if n == "cpu -> kernels" else f"not checked: {why}", REBUILD)
                  for n in ("cpu -> kernels", "build", "fp environment")]
    checks += [check_ram(target), check_space(path, target)]
    m = None
    try:
        m = measure_read(path, read_mb)
        checks.append(check_read(m, _fs_type(path), target))
    except OSError as exc:
        checks.append(Check("disk read", "fail", f"could not write and read {read_mb} MiB under {path}: {exc}",
                            f"free {read_mb} MiB at {path}, or measure less: --read-mb 64"))
    return checks + [check_direct(m, path, target), check_threads(), check_tuning()]
