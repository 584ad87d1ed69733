"""Checking a checkpoint's files: size and sha256 (LFS files) or git blob id (plain files) against what the
setup recorded from the Hub, else the published shard-size table shipped in wizard/data; every tensor against the
checksums recorded in k3-tensor-sums.bin, which are never recorded over bytes that fail them (only `--record`
does, saying so); and `k3 verify MODEL_DIR`, which names every bad file (exit 2) and marks it so the next `k3 setup`
fetches only it.
Checked by tests/wizard/test_verify.py.
"""
from __future__ import annotations

import errno
import hashlib
import os
import stat
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path

from k3core import check_checkpoint
from k3core.errors import K3Error, UsageError
from k3core.format import tensor_sums
from k3core.format.safetensors_index import ShardIndex, file_kind
from k3core.format.scan import scan_weights
from k3core.format.tensor_sums import FILE as SUMS_FILE, ShardSums
from k3core.report.meters import ProgressMeter

from . import OFFICIAL_REPO
from .progress import human
from .state import DONE, PENDING, VERIFIED, SetupState, StateError, read_state

CHUNK = 8 << 20
OFFICIAL_VISION = ("model-00095-of-000096.safetensors", "model-00096-of-000096.safetensors")  # MODEL.md §6


class Digest:
    """sha256 of the content, or git's blob id: sha1 over b"blob SIZE\\0" + content (how plain files are named)."""

    def __init__(self, kind: str, size: int):
        self.kind = kind
        self.h = hashlib.sha256() if kind == "sha256" else hashlib.sha1(b"blob %d\0" % size)

    def update(self, data) -> None:
        self.h.update(data)

    def hexdigest(self) -> str:
        return self.h.hexdigest()


def expected(rec: dict) -> tuple[str, str] | None:
    """(kind, hex) a record promises, or None when only its size is known."""
    if rec.get("sha256"):
        return "sha256", rec["sha256"]
    if rec.get("oid"):
        return "git-sha1", rec["oid"]
    return None


def hash_file(path: Path, kind: str, size: int, advance=None, upto: int | None = None, also=None) -> tuple[Digest, int]:
    """Hash the first `upto` bytes (default: all) of `path`; returns the digest and the bytes read. `also(bytes)`
    is given every piece too (the tensor checksums, in the same pass)."""
    d, done, limit = Digest(kind, size), 0, size if upto is None else upto
    buf = bytearray(CHUNK)
    with open(path, "rb", buffering=0) as f:
        while done < limit:
            n = f.readinto(memoryview(buf)[:min(CHUNK, limit - done)])
            if not n:
                break
            d.update(memoryview(buf)[:n])
            if also:
                also(memoryview(buf)[:n])
            done += n
            if advance:
                advance(n)
    return d, done


def file_problem(path: Path) -> str | None:
    """None for a regular file (a symlink to one is fine: the Hub cache links its files); else what is there."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"a symlink to {os.readlink(path)}, which does not exist" if os.path.islink(path) else "missing"
    except OSError as exc:
        return "a symlink loop" if exc.errno == errno.ELOOP else f"cannot be read: {exc.strerror}"
    return None if stat.S_ISREG(st.st_mode) else f"{file_kind(st.st_mode)}, not a regular file"


def check_file(dest: Path, local: str, rec: dict, advance=None, sums: dict | None = None) -> str | None:
    """What is wrong with one file against its record (None when it matches). A safetensors shard that matches is
    put in `sums` ({path: ShardSums}) when given: its tensor checksums, from the same pass."""
    path = dest / local
    if why := file_problem(path):
        return why
    if (size := path.stat().st_size) != rec["size"]:
        return f"{size} bytes on disk, expected {rec['size']}"
    if (want := expected(rec)) is None:
        return None
    tensors = _shard_sums(path) if sums is not None else None
    got = hash_file(path, want[0], rec["size"], advance, also=tensors.update if tensors else None)[0].hexdigest()
    if got != want[1]:
        return f"{want[0]} {got[:16]}… does not match the expected {want[1][:16]}…"
    if tensors:
        sums[path] = tensors
    return None


def _shard_sums(path: Path) -> ShardSums | None:
    """A shard's tensor checksums to feed while it is hashed; None for another file, or a header that does not
    parse (the checkpoint check names that, and recording reads the shard itself)."""
    if path.suffix != ".safetensors":
        return None
    try:
        return ShardSums(path)
    except K3Error:
        return None


def check_files(dest: Path, records: dict[str, dict], jobs: int = 4, stream=None, verb="verified",
                sums: dict | None = None) -> dict[str, str]:
    """Check records in parallel with progress; {local name: problem} for every bad file. `sums`: see check_file."""
    meter = ProgressMeter(verb, sum(r["size"] for r in records.values()), len(records), stream=stream)

    def one(local):
        meter.start(local, records[local]["size"])
        problem = check_file(dest, local, records[local], lambda n: meter.advance(local, n), sums)
        meter.finish(local, f": BAD, {problem}" if problem else "")
        return local, problem

    try:
        with ThreadPoolExecutor(max(1, jobs)) as pool:
            return {k: p for k, p in pool.map(one, sorted(records, key=lambda k: -records[k]["size"])) if p}
    finally:
        meter.close()


def published_sizes() -> dict[str, int]:
    """The released checkpoint's shard sizes (MODEL.md §6), as shipped in wizard/data/k3-shard-sizes.txt."""
    text = resources.files("wizard").joinpath("data/k3-shard-sizes.txt").read_text()
    return {name: int(size) for name, size in (line.split() for line in text.splitlines() if line.strip())}


def table_problems(sizes: dict[str, int], vision: bool) -> dict[str, str]:
    """Every published shard whose size here differs (a missing vision shard is fine unless `vision`)."""
    table, out = published_sizes(), {}
    for name, want in table.items():
        if name not in sizes:
            if vision or name not in OFFICIAL_VISION:
                out[name] = "missing"
        elif sizes[name] != want:
            out[name] = f"{sizes[name]} bytes, the published table says {want}"
    return out


def is_official(repo: str | None) -> bool:
    return (repo or "").lower() == OFFICIAL_REPO.lower()


class SumsDiffer(K3Error):
    """Shards whose bytes the recorded tensor checksums do not vouch for (and no recorded hash proves): the record
    is kept, never written over from those bytes."""

    exit_code = 2

    def __init__(self, dest: Path, differ: dict[str, str]):
        self.differ = differ
        super().__init__(f"{dest}: {len(differ)} shard(s) differ from the tensor checksums recorded in {SUMS_FILE}, "
                         "which are kept: " + "; ".join(f"{k}: {v}" for k, v in sorted(differ.items()))
                         + f"; {tensor_sums.advice(dest)}")


class Sums:
    """Every tensor's checksum measured from the bytes on disk (with progress) and compared with the record:
    `differ` ({shard or the record's name: what differs}) names what the record does not vouch for. Shards in
    `known` ({path: ShardSums}, fed by the hash pass) are not read again; those `records` (k3 setup's) give a
    hash from elsewhere for are proven (proven_by_hash) and may replace a record that differs."""

    def __init__(self, dest: Path, jobs: int = 4, stream=None, known: dict | None = None,
                 records: dict | None = None):
        self.dest, meter, start = dest, None, time.perf_counter()

        def progress(done, total):
            nonlocal meter
            if meter is None:
                meter = ProgressMeter("checksummed", total, 1, stream=stream)
                meter.start("tensors", total)
            meter.set_done("tensors", done)

        self.index = ShardIndex.open(dest)
        try:
            self.measured = tensor_sums.measure(self.index, progress, jobs, known)
        finally:
            if meter is not None:
                meter.finish("tensors")
                meter.close()
        self.read = f", {meter.total / 1e9:.2f} GB read for it" if meter is not None else " from the hash pass"
        self.seconds = time.perf_counter() - start
        self.proven = proven_by_hash(dest, records or {}, known or {})
        self.cmp = tensor_sums.compare(self.index, self.measured)
        self.differ = {k: v for k, v in self.cmp.shards.items() if k not in self.proven}
        if self.cmp.damaged and len(self.proven) < len(self.index.files):
            self.differ[SUMS_FILE] = f"{self.cmp.damaged}, so it vouches for no shard"

    def record(self, trust: bool = False, note=None) -> str:
        """Write the checksums (unless the record already says the same) and say on what trust; SumsDiffer when
        the record differs from bytes nothing proves, unless `trust` (`k3 verify --record`), which `note`s each
        shard whose recorded checksums it replaces. Returns a phrase for a summary."""
        if self.differ and not trust:
            raise SumsDiffer(self.dest, self.differ)
        for name, why in sorted(self.differ.items()):
            if note:
                note(f"RECORDED {name}: {why}; recorded again from the bytes on disk, as --record asks")
        unproven = len(self.index.files) - len(self.proven & {f.path.name for f in self.index.files})
        took = f" in {self.seconds:.1f} s{self.read}"
        if self.cmp.recorded and not self.cmp.damaged and not self.cmp.shards:
            return f"every tensor matches its checksum recorded in {SUMS_FILE}{took}"
        tensor_sums.write(self.index, self.measured)
        trusting = (f"trusting the bytes on disk of {unproven} shard(s) that no hash from the Hub proves"
                    if unproven else "from shards that match the hashes k3 setup recorded from the Hub")
        if self.differ:
            return f"every tensor's checksum recorded again ({SUMS_FILE}), {trusting} (--record){took}"
        if self.cmp.recorded:
            return (f"the checksums of {len(self.cmp.shards) or 'every'} shard(s) recorded again ({SUMS_FILE}), "
                    f"{trusting}{took}")
        return f"no tensor checksums were recorded here: every tensor's checksum recorded, {trusting}{took}"


def proven_by_hash(dest: Path, records: dict, known: dict) -> set[str]:
    """Names of the shards in `known` (which matched their recorded hash) whose hash came from elsewhere — the
    Hub, the demo's SHA256SUMS — not measured by k3 from these very bytes (origin "measured" proves nothing
    about them: only that they have not changed since)."""
    return {p.name for p in map(Path, known)
            if records.get(p.relative_to(dest).as_posix(), {}).get("origin", "measured") != "measured"}


def record_sums(dest: Path, jobs: int = 4, stream=None, known: dict | None = None, records: dict | None = None) -> str:
    """Every tensor's checksum recorded (k3-tensor-sums.bin), with progress: what each later read of the
    checkpoint is checked against; never over a record the bytes on disk fail (SumsDiffer, exit 2) unless a
    hash from elsewhere proves those bytes (`records`: k3 setup's). Shards in `known` ({path: ShardSums}, fed by
    the hash pass) are not read again. Returns a phrase for the step's summary."""
    return Sums(dest, jobs, stream, known, records).record()


# ---- `k3 verify` ------------------------------------------------------------------------------
def _structure(dest: Path) -> str | None:
    try:
        check_checkpoint(dest)
    except K3Error as exc:
        return str(exc)
    return None


def _deep(dest: Path) -> dict:
    meter = None

    def progress(done, total, name):
        nonlocal meter
        if meter is None:
            meter = ProgressMeter("read", total, 1)
            meter.start("tensors", total)
        meter.set_done("tensors", done)

    try:
        return scan_weights(dest, progress)
    finally:
        if meter is not None:
            meter.close()


def cmd_verify(args) -> int:
    dest, out = Path(args.model_dir), sys.stdout
    if not dest.is_dir():
        raise UsageError(f"{dest}: no such directory; give the checkpoint directory `k3 setup` made")
    state = read_state(dest)
    records = (state or {}).get("files") or {}
    bad: dict[str, str] = {}
    sums: dict = {}
    if records:
        basis = "the sizes and hashes k3 setup recorded (.k3-setup.json)"
        waiting = {k: "not downloaded yet" for k, r in records.items() if r["status"] not in (DONE, VERIFIED)}
        bad.update(waiting)
        bad.update(check_files(dest, {k: r for k, r in records.items() if k not in waiting}, args.jobs, sums=sums))
        if is_official(state.get("repo")):
            bad.update(table_problems({k: r["size"] for k, r in records.items()}, state.get("vision", False)))
    else:
        found = sorted(dest.glob("*.safetensors"))
        bad.update({p.name: why for p in found if (why := file_problem(p))})
        shards = {p.name: p.stat().st_size for p in found if p.name not in bad}
        if shards and set(shards) <= set(published_sizes()):
            basis = "the published shard-size table (no recorded hashes: this directory was not set up by k3 setup)"
            bad.update(table_problems(shards, vision=False))
        else:
            basis = "the safetensors headers only (no record and not the released checkpoint's shard names)"
    if not bad:  # the headers against the config: every tensor there, with its shape and dtype
        if problem := _structure(dest):
            bad["(checkpoint)"] = problem
        basis += "; every tensor the config implies present with its shape and dtype"
    warnings, sums_checked = [], None
    if not bad:
        if args.deep:
            found = _deep(dest)
            bad.update({f"(weights) {name}": f"{n} NaN or infinite value(s)" for name, n in found["non_finite"]})
            warnings = [f"WARN {name}: {n} scale byte(s) of 255 (MODEL.md §5: those groups read as zeros)"
                        for name, n in found["scale_255"]]
            basis += "; every weight read (--deep)"
        sums_checked = Sums(dest, args.jobs, known=sums, records=records)
        if not args.record:
            bad.update(sums_checked.differ)
        if sums_checked.cmp.recorded:
            basis += f"; every tensor against its checksum in {SUMS_FILE}"
    for line in warnings:
        print(line, file=out)
    for name in sorted(bad):
        print(f"BAD  {name}: {bad[name]}", file=out)
    checked = len(records) or len(list(dest.glob("*.safetensors")))
    if not bad:
        summary = sums_checked.record(trust=args.record, note=lambda line: print(line, file=out))
        print(f"{dest}: {checked} files match {basis}; {summary}", file=out)
        return 0
    print(f"{dest}: {len(bad)} bad of {checked} files, checked against {basis}", file=out)
    if args.record:
        print("nothing recorded: --record trusts the bytes on disk only where nothing above shows them wrong", file=out)
    stale = sorted(k for k in bad if sums_checked is not None and k in sums_checked.differ)
    fetch = [k for k in bad if records.get(k, {}).get("remote") and records[k]["status"] != PENDING]
    if fetch:  # a file k3 setup downloaded: the next `k3 setup` fetches only it
        _mark_for_refetch(dest, fetch, state, out)
    if restore := [k for k in sorted(bad) if k not in fetch and not k.startswith("(") and k != SUMS_FILE
                   and records.get(k, {}).get("status") != PENDING]:
        kept = f"the tensor checksums in {SUMS_FILE} are kept; " if stale else ""
        print(f"{kept}restore {', '.join(restore)} from where the checkpoint came from (copy or download the "
              f"file(s) again), then run `k3 verify {dest}` again", file=out)
    if stale:
        what = f"{SUMS_FILE} checks nothing now" if stale == [SUMS_FILE] else \
            "if the bytes on disk are the right ones and the record is wrong"
        print(f"{what}: `k3 verify {dest} --record` records every tensor's checksum again, trusting the bytes on "
              "disk", file=out)
    return 2


def _mark_for_refetch(dest: Path, names: list[str], state: dict, out) -> None:
    try:
        st = SetupState.open(dest, {"source": state["source"]})
    except StateError as exc:
        print(f"(could not mark them for `k3 setup`: {exc})", file=out)
        return
    try:
        for name in names:
            st.update_file(name, status=PENDING, bytes=0)
        st.reopen("download", "verify", "pack", "profile", "next")
        st.log(f"k3 verify: {len(names)} bad file(s) marked to fetch again: {', '.join(names)}")
    finally:
        st.close()
    size = human(sum(state["files"][n]["size"] for n in names))
    print(f"marked {len(names)} file(s) ({size}) to fetch again; run `{state.get('facts', {}).get('command') or 'k3 setup'}` "
          "to fetch only those", file=out)
