"""The packed trunk's format: the checkpoint fingerprint that ties a pack to its checkpoint, and the
manifest reader the trunk placers build on (`open_trunk`). It never reads a run: placers own the I/O.

Written by k3core/pack.py; checked by tests/test_pack.py.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..model.checkpoint import Checkpoint, layer_prefix
from ..errors import CheckpointError, TrunkError
from ..interfaces import Param, Weights
from .aligned_io import align_up
from .codec import CODECS, RAW, Block, stored_length
from .limits import INDEX_FILE_BYTES, read_json_limited
from .safetensors_index import DTYPES

FORMAT, VERSION = "k3-trunk", 2
                              # 2: a raw run carries a checksum per block, checked on every read (1 is re-packed)
CODEC_VERSION = 4             # a pack whose runs are coded (manifest "codec" other than raw): blocks per run;
                              # 4: exponent + rest planes, k3's own code per tensor (2 and 3 are re-packed)
SAMPLE_BLOCKS, SAMPLE_BLOCK, SAMPLE_ALL = 16, 4096, 1 << 20
TRUNK, PARTIAL, MANIFEST = "trunk.bin", "trunk.bin.partial", "manifest.json"


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def _canon(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _sha(data) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_json(path: Path):
    try:
        return read_json_limited(path, INDEX_FILE_BYTES, "a packed-trunk manifest")
    except (OSError, ValueError):
        return None


# ---- the checkpoint fingerprint -----------------------------------------------------------------
def _data_sample(f) -> str:
    """sha256 of a shard's data region if small, else of 16 evenly spaced 4 KiB blocks of it. Headers
    alone do not tell two same-shaped checkpoints apart (test models of two seeds, a re-upload)."""
    start, n = 8 + f.header_len, f.size - 8 - f.header_len
    spans = [(start, n)] if n <= SAMPLE_ALL else \
        [(start + i * (n - SAMPLE_BLOCK) // (SAMPLE_BLOCKS - 1), SAMPLE_BLOCK) for i in range(SAMPLE_BLOCKS)]
    h, fd = hashlib.sha256(), os.open(f.path, os.O_RDONLY)
    try:
        for at, k in spans:
            if len(block := os.pread(fd, k, at)) != k:
                raise CheckpointError("shard shrank while it was fingerprinted", file=f.path)
            h.update(block)
    finally:
        os.close(fd)
    return h.hexdigest()


def fingerprint(ckpt: Checkpoint) -> dict:
    """Every shard's name, size, header sha256 and data sample; a sha256 over that list; config.json's."""
    files = ckpt.index.files
    with ThreadPoolExecutor(min(8, len(files))) as pool:
        samples = list(pool.map(_data_sample, files))
    shards = [{"name": f.path.relative_to(ckpt.index.directory).as_posix(), "size": f.size,
               "header_sha256": f.header_sha256, "data_sample_sha256": s} for f, s in zip(files, samples)]
    return {"shards": shards, "shards_sha256": _sha(_canon(shards)),
            "config_sha256": _sha((Path(ckpt.root) / "config.json").read_bytes())}


def fingerprint_diff(old: dict, new: dict) -> list[str]:
    """What differs between two fingerprints, one phrase per difference ([] when equal)."""
    a, b = ({s["name"]: s for s in fp["shards"]} for fp in (old, new))
    out = [f"shard {n} is gone" for n in a if n not in b] + [f"shard {n} is new" for n in b if n not in a]
    for n in (n for n in a if n in b):
        x, y = a[n], b[n]
        if x["size"] != y["size"]:
            out.append(f"shard {n}: {x['size']} bytes when packed, {y['size']} now")
        elif x["header_sha256"] != y["header_sha256"]:
            out.append(f"shard {n}: header changed (sha256 {x['header_sha256'][:12]}… now {y['header_sha256'][:12]}…)")
        elif x.get("data_sample_sha256") != y.get("data_sample_sha256"):
            out.append(f"shard {n}: tensor data changed (sampled blocks differ)")
    if old["config_sha256"] != new["config_sha256"]:
        out.append("config.json changed")
    return out


def _diff_text(diffs: list[str]) -> str:
    return "; ".join(diffs[:5]) + (f"; and {len(diffs) - 5} more" if len(diffs) > 5 else "")


# ---- the reader the placers use -----------------------------------------------------------------
@dataclass(frozen=True)
class TrunkTensor:
    name: str               # relative to layers.{L}. for a layer run; the full name in the model run
    offset: int             # from the start of the run
    dtype: str
    shape: tuple[int, ...]
    nbytes: int

    def param(self, buf, at: int) -> Param:
        """A view of this tensor's bytes, which start at byte `at` of `buf` (BF16 as uint16)."""
        itemsize, dtype = DTYPES[self.dtype]
        return Param(np.frombuffer(buf, dtype, self.nbytes // itemsize, at).reshape(self.shape), self.dtype, self.name)


@dataclass(frozen=True)
class Run:
    key: str                # "layer.{L}" or "model"
    layer: int | None
    offset: int             # in trunk.bin, a multiple of the alignment
    length: int
    padded: int             # length rounded up to the alignment: [offset, offset + padded) is inside trunk.bin
    sha256: str
    verbatim: bool
    tensors: tuple[TrunkTensor, ...]
    codec: str = RAW
    blocks: tuple[Block, ...] = ()  # a coded run's blocks (io/codec.py); () for a raw one
    block_bytes: int = 0            # restored bytes per block (the last one shorter)
    sums: tuple[int, ...] = ()      # a raw run's block checksums (planes_checksum of each block's bytes)

    def block_sum(self, i: int) -> int:
        """The checksum of block i's restored bytes, as the manifest records it."""
        return self.sums[i] if self.codec == RAW else self.blocks[i].checksum

    @property
    def span(self) -> int:
        """Bytes of trunk.bin from `offset` that hold this run (padding included)."""
        return self.padded if self.codec == RAW else stored_length(list(self.blocks))

    @property
    def prefix(self) -> str:
        return "" if self.layer is None else layer_prefix(self.layer)

    def params(self, buf) -> dict[str, Param]:
        """Views into `buf`, which holds this run's bytes from its first byte (BF16 as uint16)."""
        if (n := memoryview(buf).nbytes) < self.length:
            raise TrunkError(f"run {self.key} has {self.length} bytes, the buffer only {n}")
        return {t.name: t.param(buf, t.offset) for t in self.tensors}

    def weights(self, buf) -> Weights:
        return Weights(self.prefix, self.params(buf))


@dataclass
class Trunk:
    directory: Path
    path: Path              # trunk.bin
    manifest: dict
    alignment: int
    size: int
    runs: dict[str, Run]

    @property
    def codec(self) -> str:
        return str(self.manifest.get("codec", RAW))

    @property
    def block_bytes(self) -> int:
        """Restored bytes per block: what a block checksum covers (and a coded pack stores as one block)."""
        return int(self.manifest["block_bytes"])

    def layer(self, layer: int) -> Run:
        if (run := self.runs.get(f"layer.{layer}")) is None:
            raise TrunkError(f"the packed trunk has no run for layer {layer}", file=self.directory / MANIFEST)
        return run

    @property
    def model(self) -> Run:
        if (run := self.runs.get("model")) is None:
            raise TrunkError("the packed trunk has no model-level run", file=self.directory / MANIFEST)
        return run


def _parse_runs(m: dict, where: Path) -> dict[str, Run]:
    runs, end = {}, 0
    try:
        align, fp, codec = int(m["alignment"]), m["checkpoint"], str(m.get("codec", RAW))
        block = int(m["block_bytes"])
        if block <= 0 or block % align:
            raise ValueError(f"block_bytes {block} is not a positive multiple of the alignment {align}")
        if not (isinstance(fp["config_sha256"], str) and all(
                isinstance(s["name"], str) and isinstance(s["size"], int) for s in fp["shards"])):
            raise ValueError("the checkpoint fingerprint is incomplete")
        for r in m["runs"]:
            tensors = tuple(TrunkTensor(str(t["name"]), int(t["offset"]), str(t["dtype"]),
                                        tuple(int(s) for s in t["shape"]), int(t["nbytes"])) for t in r["tensors"])
            blocks = tuple(Block.of(b, block) for b in r["blocks"]) if codec != RAW else ()
            sums = tuple(int(x, 16) for x in r["block_sums"]) if codec == RAW else ()
            run = Run(str(r["key"]), None if r["layer"] is None else int(r["layer"]), int(r["offset"]),
                      int(r["length"]), _align(int(r["length"]), align), str(r["sha256"]), bool(r["verbatim"]), tensors,
                      codec, blocks, block, sums)
            if codec == RAW and len(sums) != -(-run.length // block):
                raise ValueError(f"run {run.key}: {len(sums)} block checksums for {run.length} bytes in blocks of "
                                 f"{block}")
            bad = [t.name for t in tensors if t.dtype not in DTYPES or t.offset < 0 or t.offset + t.nbytes > run.length
                   or t.nbytes != math.prod(t.shape) * DTYPES[t.dtype][0]]
            if codec != RAW and not _blocks_cover(blocks, run.length, block):
                raise ValueError(f"run {run.key}: its blocks do not restore exactly its {run.length} bytes in order")
            if run.key in runs or run.offset % align or run.offset < end or bad:
                raise ValueError(f"run {run.key} is repeated, misaligned, overlaps the one before, or has an "
                                 f"impossible tensor entry {bad[:1]}")
            runs[run.key], end = run, run.offset + (run.length if codec == RAW else run.span)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise TrunkError(f"manifest is malformed: {e!r}", file=where) from None
    return runs


def _blocks_cover(blocks, length: int, block: int) -> bool:
    """Blocks restore [0, length) one after the other, `block` bytes each but the last, stored in order."""
    return sum(b.restored for b in blocks) == length and all(b.restored == block for b in blocks[:-1]) \
        and all(b.offset == align_up(a.offset + a.stored) for a, b in zip(blocks, blocks[1:])) \
        and (not blocks or blocks[0].offset == 0)


def load_trunk(trunk_dir) -> Trunk:
    """The manifest, checked for format, version, shape and against trunk.bin's size."""
    directory = Path(trunk_dir)
    where = directory / MANIFEST
    if not where.is_file():
        raise TrunkError("no packed trunk here (manifest.json is missing): run `k3 pack MODEL_DIR TRUNK_DIR`",
                         file=where)
    m = _read_json(where)
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise TrunkError(f'not a packed-trunk manifest (want "format": "{FORMAT}")', file=where)
    if m.get("version") == 1 and "codec" not in m:
        raise TrunkError("this raw pack was made by an older k3 without block checksums, so its reads cannot be "
                         "checked; re-pack it with `k3 pack MODEL_DIR TRUNK_DIR` (it replaces it)", file=where)
    if m.get("version") not in (VERSION, CODEC_VERSION) or (m.get("version") == CODEC_VERSION) != ("codec" in m):
        raise TrunkError(f"manifest version {m.get('version')!r} is not one this k3 reads ({VERSION}, or "
                         f"{CODEC_VERSION} with a codec); re-pack with `k3 pack`", file=where)
    if m.get("codec", RAW) not in CODECS:
        raise TrunkError(f"manifest names codec {m.get('codec')!r}, which this k3 does not know (it knows "
                         f"{', '.join(CODECS)}); re-pack with `k3 pack`", file=where)
    runs, path = _parse_runs(m, where), directory / TRUNK
    if not path.is_file():
        hint = " (packing was interrupted: run `k3 pack` again to finish)" if (directory / PARTIAL).exists() else ""
        raise TrunkError(f"trunk.bin is missing{hint}", file=path)
    size = path.stat().st_size
    if bad := next((r for r in runs.values() if r.offset + r.span > size), None):
        raise TrunkError(f"trunk.bin has {size} bytes but run {bad.key} needs bytes up to {bad.offset + bad.span}: "
                         "the file is truncated; re-pack", file=path)
    return Trunk(directory, path, m, int(m["alignment"]), size, runs)


def open_trunk(trunk_dir, checkpoint: Checkpoint) -> Trunk:
    """load_trunk, plus: the pack comes from this very checkpoint and covers every layer of its config."""
    trunk = load_trunk(trunk_dir)
    if diffs := fingerprint_diff(trunk.manifest["checkpoint"], fingerprint(checkpoint)):
        raise TrunkError(f"{trunk.directory} was packed from another checkpoint than {checkpoint.root}: "
                         f"{_diff_text(diffs)}; re-pack with `k3 pack`", file=trunk.directory / MANIFEST)
    if missing := [k for k in [f"layer.{L}" for L in range(checkpoint.config.num_hidden_layers)] + ["model"]
                   if k not in trunk.runs]:
        raise TrunkError(f"the packed trunk has no run for {', '.join(missing)}", file=trunk.directory / MANIFEST)
    return trunk
