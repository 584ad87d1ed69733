"""Packing: copy every layer's trunk run (and the model-level run) into one 4096-aligned trunk.bin
with a versioned manifest.json, resumably; verifying a pack; and the packed size of a checkpoint
before it is packed. The format and its reader (`open_trunk`, used by the trunk placers) are in
io/trunk.py; the `k3 pack` command in cli/pack.py.

Checked by tests/io/test_pack.py against ShardIndex.read: every tensor's bytes, kills and torn writes.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import __version__, _native
from ..files.aligned_io import ALIGN
from ..files.atomic import fsync_dir, write_json_atomic
from ..format.checkpoint import PREFIX, VISION_PREFIXES, Checkpoint, open_checkpoint
from ..errors import CheckpointError, TrunkError, UnsoundRunError
from .codec import BLOCK, RAW, check_block_bytes, check_codec, encode_run
from .trunk import (CODEC_VERSION, EXPERTS, FORMAT, MANIFEST, PARTIAL, TENSOR_ALIGN, TRUNK, VERSION, _align, _canon,
                    _diff_text, _read_json, _sha, fingerprint, fingerprint_diff, layout_of, load_trunk, plan_runs,
                    prove_layout, seal, seal_problem, shape_problems)
from .trunk_reader import TrunkReader, restored_sha256

STATE_FORMAT, STATE = "k3-pack-state", "pack-state.json"
CHUNK = 64 << 20


def size_text(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def packed_size(index) -> int:
    """Bytes trunk.bin will have for the checkpoint behind `index`."""
    return plan_runs(index)[1]


def packed_size_of_headers(headers: dict) -> int:
    """An upper bound of packed_size from parsed safetensors headers alone ({shard: header dict}), for
    a checkpoint not downloaded yet: every trunk tensor with a tensor's alignment slack, and a run's."""
    total, runs = 0, set()
    for header in headers.values():
        for name, t in header.items():
            if name == "__metadata__" or not isinstance(t, dict) or name.startswith(VISION_PREFIXES):
                continue
            layer, _, rel = name[len(PREFIX + "layers."):].partition(".") if name.startswith(PREFIX + "layers.") \
                else ("model", "", name)
            if not rel.startswith(EXPERTS):
                start, end = t.get("data_offsets", (0, 0))
                total += int(end) - int(start) + TENSOR_ALIGN
                runs.add(layer)
    return total + ALIGN * len(runs)


# ---- moving bytes: read ahead one window, hash, checksum and write the current one in parallel --------
def _pread_full(fd, view, at, path):
    done = 0
    while done < len(view):
        if (n := os.preadv(fd, [view[done:]], at + done)) <= 0:
            raise CheckpointError(f"file ends at byte {at + done}, {len(view) - done} bytes short", file=path)
        done += n


def _pwrite_full(fd, view, at):
    while len(view):
        n = os.pwrite(fd, view, at)
        view, at = view[n:], at + n


def _drop_cache(fd, at, n):
    if hasattr(os, "posix_fadvise"):    # a 113 GB pass should not evict everything else from the page cache
        os.posix_fadvise(fd, at, n, os.POSIX_FADV_DONTNEED)


def block_sums(view: memoryview, block: int) -> list[str]:
    """The checksum of each `block` bytes of `view` (planes_checksum, the last block shorter), in hex as a raw run's
    manifest records them."""
    return [f"{_native.planes_checksum(view[k:k + block]):016x}" for k in range(0, len(view), block)]


class _Mover:
    """Streams a run's bytes, given as pieces (fd + offset, or zeros), through two window buffers of whole blocks:
    their sha256 and each block's checksum (planes_checksum), optionally written out."""

    def __init__(self, chunk, block=BLOCK):
        self.block, self.chunk = block, max(block, chunk // block * block)
        self.bufs, self.pool = [bytearray(self.chunk), bytearray(self.chunk)], ThreadPoolExecutor(2)

    def close(self):
        self.pool.shutdown(wait=True)

    def stream(self, pieces, out_fd=None, out_at=0, tick=None) -> tuple[str, list[str]]:
        """(sha256, block checksums in hex) of the bytes `pieces` make up, written from out_at of out_fd if given."""
        length = sum(n for *_, n in pieces)
        windows = [(lo, min(length, lo + self.chunk)) for lo in range(0, length, self.chunk)]

        def load(i):
            return _restored_window(pieces, *windows[i], self.bufs[i % 2], drop=out_fd is not None)

        h, sums, ahead = hashlib.sha256(), [], self.pool.submit(load, 0) if windows else None
        for i in range(len(windows)):
            view = ahead.result()
            ahead = self.pool.submit(load, i + 1) if i + 1 < len(windows) else None
            hashed = self.pool.submit(h.update, view)
            sums += block_sums(view, self.block)
            if out_fd is not None:
                _pwrite_full(out_fd, view, out_at)
            hashed.result()
            out_at += len(view)
            if tick:
                tick(len(view))
        return h.hexdigest(), sums


class _Sources:
    """The shard files a plan reads, opened once; turns plan pieces into (fd, path, offset, n)."""

    def __init__(self, plan):
        self.fds = {}
        for run in plan:
            for path, _, _ in run.pieces:
                if path is not None and path not in self.fds:
                    self.fds[path] = os.open(path, os.O_RDONLY)

    def pieces(self, run):
        return [(self.fds.get(path), path, at, n) for path, at, n in run.pieces]

    def close(self):
        for fd in self.fds.values():
            os.close(fd)


# ---- progress -----------------------------------------------------------------------------------
@dataclass
class Progress:
    key: str                # the run being copied or hashed
    runs_done: int
    runs_total: int
    bytes_done: int         # run bytes in place, including runs kept from an earlier, interrupted pack
    bytes_total: int
    moved: int              # bytes moved by this call
    elapsed: float
    run_finished: bool      # True once per run, after it is on disk and recorded in the state file

    @property
    def rate(self) -> float:
        return self.moved / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        return (self.bytes_total - self.bytes_done) / self.rate if self.rate else None


@dataclass
class PackResult:
    status: str             # "packed", "resumed" or "up-to-date"
    runs: int
    runs_copied: int
    bytes_copied: int       # run bytes copied from the checkpoint by this call
    trunk_bytes: int
    seconds: float


def _save_state(path, fp, plan_sha, done):
    state = {"format": STATE_FORMAT, "version": VERSION, "checkpoint": fp, "plan_sha256": plan_sha, "done": done}
    write_json_atomic(path, {**state, "sha256": _sha(_canon(state))})


def _expected_offsets(done: list, plan) -> list[int]:
    """Where each recorded run must start: the plan's offsets for a raw pack; for a coded one, each run at
    the aligned end of the stored bytes before it."""
    at, out = 0, []
    for d, p in zip(done, plan):
        out.append(p.offset if "stored" not in d else at)
        at = _align(d["offset"] + d.get("stored", d["length"]), ALIGN)
    return out


def _resume_point(out: Path, fp, plan, plan_sha, mover) -> tuple[list, list[str]]:
    """The recorded runs still trusted (every one re-hashed from the partial file: those up to the first that does
    not match it are kept), and notes."""
    state, partial = _read_json(out / STATE), out / PARTIAL
    if state is None:
        return [], ["found trunk.bin.partial without a readable pack-state.json; starting over"] if partial.exists() else []
    body = {k: v for k, v in state.items() if k != "sha256"} if isinstance(state, dict) else None
    if not body or state.get("sha256") != _sha(_canon(body)) or state.get("format") != STATE_FORMAT \
            or state.get("version") != VERSION:
        return [], ["pack-state.json is damaged or from another k3 version; starting over"]
    if diffs := fingerprint_diff(state["checkpoint"], fp):
        return [], [f"pack-state.json belongs to another checkpoint ({_diff_text(diffs)}); starting over"]
    done = state["done"]
    if state["plan_sha256"] != plan_sha or len(done) > len(plan) or any(
            (d["key"], d["offset"], d["length"]) != (p.key, at, p.length)
            for d, p, at in zip(done, plan, _expected_offsets(done, plan))):
        return [], ["pack-state.json describes another trunk layout; starting over"]
    if not partial.exists():
        return [], ["pack-state.json has no trunk.bin.partial beside it; starting over"] if done else []
    def sha(fd, d):
        return mover.stream([(fd, partial, d["offset"], d.get("stored", d["length"]))])[0]

    return kept_runs(partial, done, len(plan), sha, ("copying", "packed"))


def publish(out: Path, manifest: dict, partial: Path, final: Path, state: Path) -> None:
    """A finished write made visible: the manifest first (a kill before the rename leaves a state whose runs all
    check, and the next call finishes), then the data file under its name, the directory synced, the state gone."""
    write_json_atomic(out / MANIFEST, manifest)
    os.replace(partial, final)
    fsync_dir(out)
    state.unlink()


def kept_runs(partial: Path, done: list, runs: int, sha, words: tuple[str, str]) -> tuple[list, list[str]]:
    """The recorded runs `done` whose bytes in `partial` still have their recorded sha256 (sha(fd, run) re-hashes
    one), those before the first that does not; and notes saying which was written again and where it resumes.
    `words`: what writing a run again is, and what a written run is ("copying", "packed")."""
    notes, fd = [], os.open(partial, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        size = os.fstat(fd).st_size
        for i, d in enumerate(done):
            if d["offset"] + d.get("stored", d["length"]) > size or sha(fd, d) != d.get("stored_sha256", d["sha256"]):
                why = "torn write" if i == len(done) - 1 else "changed since it was written"
                notes.append(f"{d['key']} in {partial.name} does not match its recorded sha256 ({why}); "
                             f"{words[0]} it{' and the runs after it' if i < len(done) - 1 else ''} again")
                done = done[:i]
                break
    finally:
        os.close(fd)
    if done:
        notes.append(f"resuming after {len(done)} of {runs} runs "
                     f"({size_text(sum(d['length'] for d in done))} already {words[1]})")
    return done, notes


def _lock(out: Path) -> int:
    """An exclusive lock on the directory itself (released by the kernel even on kill -9)."""
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise TrunkError("another k3 pack is writing into this directory", file=out) from None
    return fd


def _check_target(out: Path, files=(PARTIAL, TRUNK, MANIFEST, STATE), what: str = "the pack",
                  flag: str = "TRUNK_DIR") -> None:
    """`out` (given as `flag`) is a directory or a new path, and what k3 pack writes or replaces in it (`files`,
    the partial file first) is nothing else: the partial file a regular file (never written through a symlink,
    nor into a FIFO or device), the others no directory. TrunkError (exit 2) naming the path otherwise."""
    if os.path.lexists(out) and not out.is_dir():
        raise TrunkError(f"{what}'s directory exists and is not a directory: give {flag} as a new path or a "
                         "directory", file=out)
    partial = files[0]
    for name in files:
        try:
            st = os.lstat(out / name)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise TrunkError(f"cannot look at {name}: {exc.strerror}", file=out / name) from None
        if name == partial and stat.S_ISLNK(st.st_mode):
            raise TrunkError(f"{name} is a symlink (to {os.readlink(out / name)}), not the partial file k3 pack "
                             "writes; k3 pack never writes through it: move it away, then run the same command "
                             "again", file=out / name)
        if stat.S_ISDIR(st.st_mode) or (name == partial and not stat.S_ISREG(st.st_mode)):
            raise TrunkError(f"{name} is not a regular file; k3 pack neither writes into nor removes it: move it "
                             "away, then run the same command again", file=out / name)


def _preflight(out: Path, need: int, freeable: int, what: str = "the pack", flag: str = "TRUNK_DIR"):
    probe = out
    while not probe.exists():
        probe = probe.parent
    if os.statvfs(probe).f_flag & os.ST_RDONLY:
        raise TrunkError(f"the filesystem holding {probe} is mounted read-only: {what} cannot be written there; "
                         f"give a {flag} on a writable disk", file=out)
    if not os.access(probe, os.W_OK):
        raise TrunkError(f"no permission to write in {probe}", file=out)
    free, spare = shutil.disk_usage(probe).free, 16 << 20
    if free + freeable < need + spare:
        raise TrunkError(f"not enough free space: {what} needs {size_text(need)} more (and {size_text(spare)} to "
                         f"spare) and the filesystem holding {probe} has {size_text(free)} free", file=out)


WRITE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EACCES, errno.EPERM)


def _manifest(fp, plan, total, done, codec, block) -> dict:
    m = {"format": FORMAT, "version": VERSION if codec == RAW else CODEC_VERSION, "packed_by": f"k3 {__version__}",
         "alignment": ALIGN, "tensor_alignment": TENSOR_ALIGN, "trunk_file": TRUNK, "trunk_bytes": total,
         "run_bytes": sum(r.length for r in plan), "checkpoint": fp}
    if codec == RAW:
        return {**m, "block_bytes": block,
                "runs": [{**r.entry(d["sha256"]), "block_sums": d["block_sums"]} for r, d in zip(plan, done)]}
    return {**m, "codec": codec, "block_bytes": block, "stored_bytes": sum(d["stored"] for d in done),
            "runs": [{**r.entry(d["sha256"]), "offset": d["offset"], "stored": d["stored"], "blocks": d["blocks"]}
                     for r, d in zip(plan, done)]}


def _same_pack(old, fp, plan, total: int, codec: str, block: int, trunk: Path) -> bool:
    """Whether the finished pack described by `old` is what packing `plan` with `codec` would write."""
    if not isinstance(old, dict) or old.get("checkpoint") != fp or old.get("codec", RAW) != codec \
            or old.get("version") != (VERSION if codec == RAW else CODEC_VERSION) or not trunk.is_file() \
            or old.get("block_bytes") != block:
        return False
    if codec == RAW:
        return [layout_of(r, False) for r in old.get("runs", [])] == [layout_of(r.entry(), False) for r in plan] \
            and trunk.stat().st_size == total
    return [layout_of(r, True) for r in old.get("runs", [])] == [layout_of(r.entry(), True) for r in plan] \
        and trunk.stat().st_size == old.get("trunk_bytes")


def _restored_window(pieces, lo: int, hi: int, buf, drop: bool = False) -> memoryview:
    """Restored bytes [lo, hi) of a run given as pieces (fd + offset, or zeros) into buf; `drop`: the bytes read
    leave the page cache."""
    view, at = memoryview(buf)[:hi - lo], 0
    for fd, path, src, n in pieces:
        a, z = max(lo, at), min(hi, at + n)
        if a < z:
            if fd is None:
                np.frombuffer(view, np.uint8)[a - lo:z - lo] = 0
            else:
                _pread_full(fd, view[a - lo:z - lo], src + a - at, path)
                if drop:
                    _drop_cache(fd, src + a - at, z - a)
        at += n
    return view


def _write_coded(pieces, length: int, starts, fd, at: int, pool, chunk: int, block: int, tick) -> dict:
    """A run encoded window by window (chunk restored bytes, whole blocks) and written from `at`: its
    restored sha256, stored length, stored sha256 and block table. `starts`: where its tensors start."""
    restored, stored_h, blocks, written = hashlib.sha256(), hashlib.sha256(), [], 0
    buf = bytearray(chunk)
    for lo in range(0, length, chunk):
        view = _restored_window(pieces, lo, min(length, lo + chunk), buf)
        restored.update(view)
        coded, payloads = encode_run(view, pool, block, [s - lo for s in starts if lo <= s < lo + len(view)])
        for b, payload in zip(coded, payloads):
            blocks.append([written + b.offset, *b.entry()[1:]])
            stored_h.update(payload)
        data = b"".join(payloads)
        _pwrite_full(fd, memoryview(data), at + written)
        written += len(data)
        tick(len(view))
    return {"sha256": restored.hexdigest(), "stored": written, "stored_sha256": stored_h.hexdigest(), "blocks": blocks}


def _write_runs(out: Path, fp, plan, plan_sha: str, done: list, kept: int, total: int, *, mover, sources, codec: str,
                encoders, window: int, block_bytes: int, progress) -> tuple[list, int]:
    """Write the runs `done` lacks into the partial file after its first `kept` bytes (those check), each run
    fsynced, dropped from the page cache and recorded in the state file before the next; the file then ends at
    its final size. Returns (every run's record, that size)."""
    fd = os.open(out / PARTIAL, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        os.ftruncate(fd, kept)
        _save_state(out / STATE, fp, plan_sha, done)
        moved, start = 0, time.perf_counter()
        in_place, run_bytes = sum(d["length"] for d in done), sum(r.length for r in plan)

        def tick(n, finished=False):
            nonlocal moved, in_place
            moved, in_place = moved + n, in_place + n
            if progress:
                progress(Progress(run.key, len(done), len(plan), in_place, run_bytes, moved,
                                  time.perf_counter() - start, finished))

        at = _align(kept, ALIGN)
        for run in plan[len(done):]:
            if codec == RAW:
                at = run.offset
                sha, sums = mover.stream(sources.pieces(run), fd, at, tick)
                record = {"sha256": sha, "block_sums": sums}
                end = at + run.length
            else:
                record = _write_coded(sources.pieces(run), run.length, [t["offset"] for t in run.tensors], fd, at,
                                      encoders, window, block_bytes, tick)
                end = at + record["stored"]
            os.fsync(fd)
            _drop_cache(fd, at, end - at)
            done = done + [{"key": run.key, "offset": at, "length": run.length, **record}]
            _save_state(out / STATE, fp, plan_sha, done)
            tick(0, finished=True)
            at = _align(end, ALIGN)
        size = total if codec == RAW else at
        os.ftruncate(fd, size)                       # zero padding: every run's aligned span is in the file
        os.fsync(fd)
    finally:
        os.close(fd)
    return done, size


def pack(model, trunk_dir, *, progress=None, say=None, chunk_bytes: int = CHUNK, codec: str = RAW,
         block_bytes: int = BLOCK) -> PackResult:
    """Pack `model` (a directory or Checkpoint) into trunk_dir with `codec` (io/codec.py; coded runs in
    blocks of `block_bytes`), resuming an interrupted pack; a matching finished pack is left alone.
    `progress(Progress)` is called per chunk and per run."""
    t0, say = time.perf_counter(), say or (lambda msg: None)
    check_codec(codec)
    check_block_bytes(block_bytes)
    ckpt = model if isinstance(model, Checkpoint) else open_checkpoint(model)
    out = Path(trunk_dir)
    fp, (plan, total) = fingerprint(ckpt), plan_runs(ckpt.index)
    entries = [r.entry() for r in plan]
    plan_sha = _sha(_canon({"codec": codec, "version": VERSION if codec == RAW else CODEC_VERSION,
                            "block_bytes": block_bytes, "runs": entries}))
    trunk = out / TRUNK
    _check_target(out)
    if _same_pack(_read_json(out / MANIFEST), fp, plan, total, codec, block_bytes, trunk):
        (out / STATE).unlink(missing_ok=True)
        say(f"{out} already holds the packed trunk of this checkpoint; nothing to do "
            "(`k3 pack --verify` re-hashes it)")
        return PackResult("up-to-date", len(plan), 0, 0, trunk.stat().st_size, time.perf_counter() - t0)
    lock = _lock(out) if out.is_dir() else None
    mover = _Mover(min(chunk_bytes, max([r.length for r in plan] + [1])), block_bytes)
    window = max(block_bytes, chunk_bytes // block_bytes * block_bytes)
    encoders = ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="k3-pack-encode") if codec != RAW else None
    sources = _Sources(plan)
    try:
        done, notes = _resume_point(out, fp, plan, plan_sha, mover) if lock is not None else ([], [])
        for note in notes:
            say(note)
        kept = done[-1]["offset"] + done[-1].get("stored", done[-1]["length"]) if done else 0
        partial_size = (out / PARTIAL).stat().st_size if (out / PARTIAL).exists() else 0
        _preflight(out, total - kept, (trunk.stat().st_size if trunk.exists() else 0) + max(0, partial_size - kept))
        if lock is None:
            out.mkdir(parents=True, exist_ok=True)
            lock = _lock(out)
        if trunk.exists():
            say(f"{out} holds a pack that does not match this checkpoint; replacing it")
        for stale in [out / MANIFEST, trunk] + [*out.glob(f".{MANIFEST}.*.tmp"), *out.glob(f".{STATE}.*.tmp")]:
            stale.unlink(missing_ok=True)
        copied = plan[len(done):]
        done, size = _write_runs(out, fp, plan, plan_sha, done, kept, total, mover=mover, sources=sources,
                                 codec=codec, encoders=encoders, window=window, block_bytes=block_bytes,
                                 progress=progress)
        publish(out, seal(_manifest(fp, plan, size, done, codec, block_bytes)), out / PARTIAL, trunk, out / STATE)
    except OSError as exc:
        if exc.errno not in WRITE_ERRORS:
            raise
        where = exc.filename or out
        raise TrunkError(f"cannot write the pack: {exc.strerror} (in {where}); the runs finished so far are kept: "
                         "make room or fix that, then run the same command to resume", file=out) from None
    finally:
        mover.close()
        sources.close()
        if encoders:
            encoders.shutdown(wait=True)
        if lock is not None:
            os.close(lock)
    return PackResult("resumed" if kept else "packed", len(plan), len(copied), sum(r.length for r in copied),
                      size, time.perf_counter() - t0)


def verify(trunk_dir, model=None, *, deep=False, progress=None) -> list[str]:
    """Every problem found: a run table k3 pack cannot have written, a manifest that is not the one k3 pack wrote
    (its own sha256), runs whose bytes do not hash to the manifest's sha256; with `model`, a fingerprint difference
    and the tensor table against the checkpoint's headers; with `deep`, runs whose bytes in the checkpoint differ
    from the pack."""
    trunk, problems = load_trunk(trunk_dir), []
    ckpt = open_checkpoint(model) if model is not None else None
    problems += [f"the manifest's run table: {p}" for p in shape_problems(trunk)]
    if (why := seal_problem(trunk.manifest, ckpt is not None)) is not None:
        problems.append(why)
    if ckpt is not None:
        if diffs := fingerprint_diff(trunk.manifest["checkpoint"], fingerprint(ckpt)):
            problems.append(f"packed from another checkpoint than {model}: {_diff_text(diffs)}")
        problems += [f"the manifest's tensor table: {p}" for p in prove_layout(trunk, ckpt.index)]
    plan = {r.key: r for r in plan_runs(ckpt.index)[0]} if deep and ckpt is not None else {}
    total, done, start = sum(r.length for r in trunk.runs.values()), 0, time.perf_counter()
    mover = _Mover(min(CHUNK, max([r.length for r in trunk.runs.values()] + [1])), trunk.block_bytes)
    sources = _Sources(plan.values())
    reader = TrunkReader(trunk) if trunk.codec != RAW else None
    fd = os.open(trunk.path, os.O_RDONLY)
    try:
        for i, run in enumerate(trunk.runs.values()):
            def tick(n, finished=False):
                nonlocal done
                done += n
                if progress:
                    progress(Progress(run.key, i + finished, len(trunk.runs), done, total, done,
                                      time.perf_counter() - start, finished))
            try:
                if reader is None:
                    sha, sums = mover.stream([(fd, trunk.path, run.offset, run.length)], tick=tick)
                    if (bad := next((i for i, x in enumerate(sums) if int(x, 16) != run.sums[i]), None)) is not None:
                        problems.append(f"run {run.key}: block {bad} fails its checksum (bytes from "
                                        f"{run.offset + bad * trunk.block_bytes} of {trunk.path})")
                        sha = None
                else:
                    sha = restored_sha256(reader, run, tick=tick)
            except UnsoundRunError as exc:  # a coded block that does not decode, or fails its checksum
                problems.append(f"run {run.key}: {exc}")
                sha = None
            if sha is not None and sha != run.sha256:
                problems.append(f"run {run.key} (offset {run.offset}, {run.length} bytes): sha256 {sha[:16]}… "
                                f"does not match the manifest's {run.sha256[:16]}…")
            if deep and ckpt is not None:
                p = plan.get(run.key)
                if p is None or layout_of(p.entry(), reader is not None) != layout_of(trunk.manifest["runs"][i],
                                                                                 reader is not None):
                    problems.append(f"run {run.key}: the checkpoint would be packed differently today")
                elif mover.stream(sources.pieces(p))[0] != run.sha256:
                    problems.append(f"run {run.key}: the checkpoint's bytes differ from the pack")
            tick(0, True)
    finally:
        os.close(fd)
        mover.close()
        sources.close()
        if reader is not None:
            reader.close()
    return problems


def packed_trunk_bytes(source) -> int:
    """Bytes `k3 pack` will write: `source` is a checkpoint directory, or {shard name: parsed header}."""
    if isinstance(source, dict):
        return packed_size_of_headers(source)
    checkpoint = open_checkpoint(source)
    try:
        return packed_size(checkpoint.index)
    finally:
        checkpoint.close()
