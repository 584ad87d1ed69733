"""Writing a draft trunk (`k3 pack --draft`): the derivation of io/draft_trunk.py run by run, each run read from the
packed trunk through its checked reader, written into draft.bin.partial, fsynced and recorded before the next, so a
killed derivation resumes after the last run that still hashes; the manifest and the rename come last. And
`verify_draft`, every run against its checksums. The machinery (free space, lock, atomic JSON, progress) is
io/pack.py's; this file only says what a draft's runs are.

Checked by tests/io/test_draft_trunk.py: the same bytes resumed or not, torn runs, refusals.
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import TrunkError, UnsoundRunError
from ..files.aligned_io import aligned_buffer
from ..files.atomic import write_json_atomic
from ..interfaces import Param
from .codec import BLOCK
from .draft_trunk import (COPIED, DATA, FORMAT, KINDS, PARTIAL, STEP, DraftSpec, another_trunk, default_dir, layout,
                          manifest_of, open_draft_trunk, plan_draft, quantize)
from .pack import (WRITE_ERRORS, Progress, _check_target, _drop_cache, _lock, _pread_full, _preflight, _pwrite_full,
                   block_sums, kept_runs, publish)
from .trunk import MANIFEST, SEAL, Trunk, _canon, _read_json, _sha, load_trunk, seal
from .trunk_reader import TrunkReader

STATE_FORMAT, STATE = "k3-draft-state", "draft-state.json"
FILES = (PARTIAL, DATA, MANIFEST, STATE)  # what k3 pack --draft writes in its directory, the partial file first


@dataclass(frozen=True)
class DraftResult:
    status: str                 # "derived", "resumed" or "up-to-date"
    directory: Path
    runs: int
    runs_written: int
    bytes_written: int          # draft bytes written by this call
    draft_bytes: int            # draft.bin's size
    seconds: float


# ---- one run ------------------------------------------------------------------------------------------------
def _values(reader: TrunkReader, run, t) -> np.ndarray:
    """Tensor `t` of trunk run `run` as stored (BF16 as uint16), read through the checked reader."""
    buf = aligned_buffer(reader.room(run, t.offset, t.offset + t.nbytes))
    at = reader.read(run, t.offset, t.offset + t.nbytes, buf)
    return t.param(buf, at).data


def _derive_run(reader: TrunkReader, source, planned: dict, kind: str, tick) -> bytearray:
    """The draft run `planned` describes, from trunk run `source`: each matrix quantized a block of rows at a time
    (bounded float64 temporaries), each other tensor copied; zeros between tensors."""
    out, by_name = bytearray(planned["length"]), {t.name: t for t in source.tensors}
    for e in planned["tensors"]:
        t = by_name[e["name"]]
        values = _values(reader, source, t)
        if e["kind"] == COPIED:
            out[e["data"]["offset"]:e["data"]["offset"] + t.nbytes] = values.tobytes()
            tick(t.nbytes)
            continue
        rows, cols = t.shape
        codes = np.frombuffer(out, np.uint8, e["codes"]["nbytes"], e["codes"]["offset"]).reshape(rows, -1)
        scales = np.frombuffer(out, np.float32, e["scales"]["nbytes"] // 4, e["scales"]["offset"]).reshape(rows, -1)
        step = max(1, STEP // max(cols, 1))
        for lo in range(0, rows, step):
            c, s = quantize(kind, Param(values[lo:lo + step], t.dtype).f32(),
                            f"tensor {source.prefix}{t.name} (trunk run {source.key})")
            codes[lo:lo + step] = c.view(np.uint8)
            scales[lo:lo + step] = s.reshape(len(s), -1)
        tick(e["codes"]["nbytes"] + e["scales"]["nbytes"])
    return out


def _checksums(buf) -> dict:
    """A run's sha256 and its block checksums, as a raw trunk run records them."""
    view = memoryview(buf)
    return {"sha256": hashlib.sha256(view).hexdigest(), "block_sums": block_sums(view, BLOCK)}


# ---- resuming -----------------------------------------------------------------------------------------------
def _save_state(path: Path, plan_sha: str, done: list) -> None:
    state = {"format": STATE_FORMAT, "plan_sha256": plan_sha, "done": done}
    write_json_atomic(path, {**state, "sha256": _sha(_canon(state))})


def _resume_point(out: Path, plan_sha: str, plan: list[dict]) -> tuple[list, list[str]]:
    """The recorded runs still trusted (each re-hashed from the partial file: those before the first that does not
    match are kept), and notes."""
    state, partial = _read_json(out / STATE), out / PARTIAL
    if not isinstance(state, dict):
        return [], [f"found {PARTIAL} without a readable {STATE}; starting over"] if partial.exists() else []
    body = {k: v for k, v in state.items() if k != "sha256"}
    if state.get("sha256") != _sha(_canon(body)) or state.get("format") != STATE_FORMAT:
        return [], [f"{STATE} is damaged or from another k3 version; starting over"]
    done = state["done"]
    if state["plan_sha256"] != plan_sha or len(done) > len(plan) or any(
            (d["key"], d["offset"], d["length"]) != (p["key"], p["offset"], p["length"]) for d, p in zip(done, plan)):
        return [], [f"{STATE} describes another draft (of another trunk, kind or layers); starting over"]
    if not partial.exists():
        return [], [f"{STATE} has no {PARTIAL} beside it; starting over"] if done else []
    return kept_runs(partial, done, len(plan), lambda fd, d: hashlib.sha256(_run_bytes(fd, partial, d)).hexdigest(),
                     ("deriving", "derived"))


def _run_bytes(fd: int, path: Path, run: dict) -> bytearray:
    buf = bytearray(run["length"])
    _pread_full(fd, memoryview(buf), run["offset"], path)
    return buf


# ---- the derivation -----------------------------------------------------------------------------------------
def _up_to_date(out: Path, want: dict, trunk: Trunk, say) -> bool:
    """Whether `out` already holds the finished draft `want` describes. A manifest.json there that is not a draft's
    is never replaced; a draft of another trunk is refused (TrunkError naming both) unless it was derived from a
    trunk in this very directory (packed there before: replaced, saying so)."""
    if not (out / MANIFEST).exists():
        return False
    old = _read_json(out / MANIFEST)
    if not isinstance(old, dict) or old.get("format") != FORMAT:
        raise TrunkError("this manifest.json is not a draft trunk's (unreadable, or a packed trunk's?) and k3 pack "
                         "--draft would replace it: give --draft-dir a new or empty directory", file=out / MANIFEST)
    data = out / DATA
    if layout(old) == layout(want) and old.get(SEAL) == seal(old)[SEAL] and data.is_file() \
            and data.stat().st_size == want["draft_bytes"]:
        return True
    source = old.get("source") if isinstance(old.get("source"), dict) else {}
    if source.get("manifest_sha256") != want["source"]["manifest_sha256"]:
        if source.get("directory") != want["source"]["directory"]:
            raise another_trunk(out, source, trunk, "remove it, or give another --draft-dir")
        say(f"{out} holds a draft of the trunk packed in {trunk.directory} before this one; replacing it")
    elif data.exists():
        say(f"{out} holds another draft of this trunk ({old.get('kind')}, {len(old.get('layers') or [])} layers); "
            "replacing it")
    return False


def _write_runs(out: Path, trunk: Trunk, spec: DraftSpec, plan: list, plan_sha: str, done: list, kept: int,
                total: int, progress) -> list:
    """Derive the runs `done` lacks into the partial file after its first `kept` bytes (those check), each fsynced,
    dropped from the page cache and recorded in the state file before the next; the file then ends at `total`."""
    fd, reader = os.open(out / PARTIAL, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644), TrunkReader(trunk)
    try:
        os.ftruncate(fd, kept)
        _save_state(out / STATE, plan_sha, done)
        start, moved, in_place = time.perf_counter(), 0, sum(d["length"] for d in done)
        run_bytes = sum(r["length"] for r in plan)

        def tick(n, finished=False):
            nonlocal moved, in_place
            moved, in_place = moved + n, in_place + n
            if progress:
                progress(Progress(planned["key"], len(done), len(plan), in_place, run_bytes, moved,
                                  time.perf_counter() - start, finished))

        for planned in plan[len(done):]:
            buf = _derive_run(reader, trunk.runs[planned["key"]], planned, KINDS[spec.kind], tick)
            _pwrite_full(fd, memoryview(buf), planned["offset"])
            os.fsync(fd)
            _drop_cache(fd, planned["offset"], planned["length"])
            done = done + [{"key": planned["key"], "offset": planned["offset"], "length": planned["length"],
                            **_checksums(buf)}]
            _save_state(out / STATE, plan_sha, done)
            tick(0, finished=True)
        os.ftruncate(fd, total)                       # zero padding: every run's aligned span is in the file
        os.fsync(fd)
    finally:
        os.close(fd)
        reader.close()
    return done


def derive_draft(trunk_dir, spec: DraftSpec, draft_dir=None, *, progress=None, say=None) -> DraftResult:
    """Derive `spec`'s draft of the packed trunk in `trunk_dir` into `draft_dir` (default: TRUNK_DIR/draft-KIND),
    resuming an interrupted derivation; a finished identical draft is left alone. `progress(Progress)` is called
    per tensor and per run, in draft bytes."""
    t0, say = time.perf_counter(), say or (lambda msg: None)
    trunk = load_trunk(trunk_dir)
    out = Path(draft_dir) if draft_dir is not None else default_dir(trunk_dir, spec.kind)
    _check_target(out, FILES, "the draft", "--draft-dir")
    plan, total = plan_draft(trunk, spec)
    want = manifest_of(trunk, spec, plan, total)
    if _up_to_date(out, want, trunk, say):
        (out / STATE).unlink(missing_ok=True)
        say(f"{out} already holds this draft of the trunk; nothing to do (`k3 pack --verify` re-hashes it)")
        return DraftResult("up-to-date", out, len(plan), 0, 0, total, time.perf_counter() - t0)
    plan_sha, data = _sha(_canon(layout(want))), out / DATA
    lock = _lock(out) if out.is_dir() else None
    try:
        done, notes = _resume_point(out, plan_sha, plan) if lock is not None else ([], [])
        for note in notes:
            say(note)
        kept = done[-1]["offset"] + done[-1]["length"] if done else 0
        partial_size = (out / PARTIAL).stat().st_size if (out / PARTIAL).exists() else 0
        _preflight(out, total - kept, (data.stat().st_size if data.exists() else 0) + max(0, partial_size - kept),
                   "the draft", "--draft-dir")
        if lock is None:
            out.mkdir(parents=True, exist_ok=True)
            lock = _lock(out)
        for stale in [out / MANIFEST, data] + [*out.glob(f".{MANIFEST}.*.tmp"), *out.glob(f".{STATE}.*.tmp")]:
            stale.unlink(missing_ok=True)
        written = plan[len(done):]
        done = _write_runs(out, trunk, spec, plan, plan_sha, done, kept, total, progress)
        publish(out, seal(manifest_of(trunk, spec, plan, total, done)), out / PARTIAL, data, out / STATE)
    except OSError as exc:
        if exc.errno not in WRITE_ERRORS:
            raise
        raise TrunkError(f"cannot write the draft: {exc.strerror} (in {exc.filename or out}); the runs finished so "
                         "far are kept: make room or fix that, then run the same command to resume", file=out) from None
    finally:
        if lock is not None:
            os.close(lock)
    return DraftResult("resumed" if kept else "derived", out, len(plan), len(written),
                       sum(r["length"] for r in written), total, time.perf_counter() - t0)


def verify_draft(draft_dir, trunk: Trunk, progress=None) -> list[str]:
    """Every problem found in the draft in `draft_dir`: a manifest open_draft_trunk refuses (another trunk's, edited,
    truncated), runs whose blocks fail their checksums or whose bytes do not hash to the manifest's sha256."""
    try:
        draft = open_draft_trunk(draft_dir, trunk)
    except TrunkError as e:
        return [str(e)]
    problems, total, done, start = [], sum(r.length for r in draft.runs.values()), 0, time.perf_counter()
    for i, run in enumerate(draft.runs.values(), 1):
        try:
            sha = hashlib.sha256(draft.read(run)).hexdigest()
            if sha != run.sha256:
                problems.append(f"run {run.key} (offset {run.offset}, {run.length} bytes): sha256 {sha[:16]}… does "
                                f"not match the manifest's {run.sha256[:16]}…")
        except UnsoundRunError as e:
            problems.append(f"run {run.key}: {e}")
        done += run.length
        if progress:
            progress(Progress(run.key, i, len(draft.runs), done, total, done, time.perf_counter() - start, True))
    return problems
