"""Checking a checkpoint's files: size and sha256 (LFS files) or git blob id (plain files) against what the
setup recorded from the Hub, else the published shard-size table shipped in wizard/data; and `k3 verify
MODEL_DIR`, which names every bad file (exit 2) and marks it so the next `k3 setup` fetches only it.
Checked by tests/wizard/test_verify.py.
"""
from __future__ import annotations

import hashlib
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path

from k3core import K3Error, UsageError, check_checkpoint
from k3core.format.scan import record_tensor_sums, scan_weights
from k3core.format.tensor_sums import ShardSums
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


def check_file(dest: Path, local: str, rec: dict, advance=None, sums: dict | None = None) -> str | None:
    """What is wrong with one file against its record (None when it matches). A safetensors shard that matches is
    put in `sums` ({path: ShardSums}) when given: its tensor checksums, from the same pass."""
    path = dest / local
    if not path.is_file():
        return "missing"
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


def record_sums(dest: Path, jobs: int = 4, stream=None, known: dict | None = None) -> str:
    """Every tensor's checksum recorded (k3-tensor-sums.bin), with progress: what each later read of the
    checkpoint is checked against; shards in `known` ({path: ShardSums}, fed by the hash pass) are not read
    again. Returns a phrase for the step's summary."""
    meter, start = None, time.perf_counter()

    def progress(done, total):
        nonlocal meter
        if meter is None:
            meter = ProgressMeter("checksummed", total, 1, stream=stream)
            meter.start("tensors", total)
        meter.set_done("tensors", done)

    try:
        record_tensor_sums(dest, progress, jobs, known)
    finally:
        if meter is not None:
            meter.finish("tensors")
            meter.close()
    again = f", {meter.total / 1e9:.2f} GB read for it" if meter is not None else " from the hash pass"
    return f"every tensor's checksum recorded in {time.perf_counter() - start:.1f} s{again}"


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
        shards = {p.name: p.stat().st_size for p in dest.glob("*.safetensors")}
        if shards and set(shards) <= set(published_sizes()):
            basis = "the published shard-size table (no recorded hashes: this directory was not set up by k3 setup)"
            bad.update(table_problems(shards, vision=False))
        else:
            basis = "the safetensors headers only (no record and not the released checkpoint's shard names)"
    if not bad:  # the headers against the config: every tensor there, with its shape and dtype
        if problem := _structure(dest):
            bad["(checkpoint)"] = problem
        basis += "; every tensor the config implies present with its shape and dtype"
    warnings = []
    if args.deep and not bad:
        found = _deep(dest)
        bad.update({f"(weights) {name}": f"{n} NaN or infinite value(s)" for name, n in found["non_finite"]})
        warnings = [f"WARN {name}: {n} scale byte(s) of 255 (MODEL.md §5: those groups read as zeros)"
                    for name, n in found["scale_255"]]
        basis += "; every weight read (--deep)"
    for line in warnings:
        print(line, file=out)
    for name in sorted(bad):
        print(f"BAD  {name}: {bad[name]}", file=out)
    checked = len(records) or len(list(dest.glob("*.safetensors")))
    if not bad:
        print(f"{dest}: {checked} files match {basis}; {record_sums(dest, args.jobs, known=sums)}", file=out)
        return 0
    print(f"{dest}: {len(bad)} bad of {checked} files, checked against {basis}", file=out)
    if records:
        _mark_for_refetch(dest, [k for k in bad if k in records and records[k]["status"] != PENDING], state, out)
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
