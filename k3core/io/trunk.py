"""The packed trunk's format: where a checkpoint's trunk bytes go in a pack (`plan_runs`), the checkpoint
fingerprint that ties a pack to its checkpoint, and the manifest reader the trunk placers build on
(`open_trunk`), which proves the manifest's tensor table against the checkpoint's headers rather than trust
it. It never reads a run: placers own the I/O.

Written by k3core/io/pack.py; checked by tests/io/test_pack.py.
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

from ..format.checkpoint import PREFIX, VISION_PREFIXES, Checkpoint, layer_prefix
from ..errors import CheckpointError, TrunkError
from ..interfaces import Param, Weights
from ..files.aligned_io import ALIGN, align_up
from .codec import CODECS, RAW, Block, stored_length
from ..files.limits import INDEX_FILE_BYTES, read_json_limited
from ..format.safetensors_index import DTYPES

FORMAT, VERSION = "k3-trunk", 2
                              # 2: a raw run carries a checksum per block, checked on every read (1 is re-packed)
CODEC_VERSION = 4             # a pack whose runs are coded (manifest "codec" other than raw): blocks per run;
                              # 4: exponent + rest planes, k3's own code per tensor (2 and 3 are re-packed)
SAMPLE_BLOCKS, SAMPLE_BLOCK, SAMPLE_ALL = 16, 4096, 1 << 20
TENSOR_ALIGN = 64             # tensors of a re-laid-out run; runs start at aligned_io.ALIGN
EXPERTS = "block_sparse_moe.experts."
TRUNK, PARTIAL, MANIFEST = "trunk.bin", "trunk.bin.partial", "manifest.json"
SEAL = "manifest_sha256"      # the manifest's own sha256 (optional: packs made before it have none)


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


# ---- the plan: which bytes of a checkpoint go where in a pack ------------------------------------
@dataclass
class _Planned:
    key: str
    layer: int | None
    length: int
    verbatim: bool
    source: dict | None                 # verbatim: {"file", "offset"} of the run in its shard
    tensors: list[dict]                 # name (relative), offset in the run, dtype, shape, nbytes
    pieces: list[tuple]                 # (path or None for zeros, source offset, nbytes), in run order
    offset: int = 0

    def entry(self, sha256=None) -> dict:
        return {"key": self.key, "layer": self.layer, "offset": self.offset, "length": self.length,
                "sha256": sha256, "verbatim": self.verbatim, "source": self.source, "tensors": self.tensors}


def plan_runs(index) -> tuple[list[_Planned], int]:
    """Runs in trunk.bin order (layers ascending, then "model") with their offsets, and the file size."""
    groups: dict[str, list] = {}
    for name in index.names():
        if name.startswith(VISION_PREFIXES):
            continue
        if name.startswith(PREFIX + "layers."):
            num, _, rel = name[len(PREFIX + "layers."):].partition(".")
            if not num.isdigit() or str(int(num)) != num or not rel:
                raise CheckpointError("layer tensor without a plain layer number", file=index.directory, tensor=name)
            if not rel.startswith(EXPERTS):
                groups.setdefault(int(num), []).append((rel, index[name]))
        else:
            groups.setdefault("model", []).append((name, index[name]))
    order = {f.path: i for i, f in enumerate(index.files)}
    plan, at = [], 0
    for key in sorted(groups, key=lambda k: (k == "model", k if k != "model" else 0)):
        ts = sorted(groups[key], key=lambda r: (order[r[1].file], r[1].offset, r[1].nbytes, r[0]))
        first, last = ts[0][1], ts[-1][1]
        verbatim = all(b.file == a.file and b.offset == a.offset + a.nbytes for (_, a), (_, b) in zip(ts, ts[1:])) \
            and all((t.offset - first.offset) % DTYPES[t.dtype][0] == 0 for _, t in ts)
        if verbatim:                    # one gap-free span: copied as is
            offsets, length = [t.offset - first.offset for _, t in ts], last.offset + last.nbytes - first.offset
            pieces = [(first.file, first.offset, length)]
            source = {"file": first.file.relative_to(index.directory).as_posix(), "offset": first.offset}
        else:                           # gaps or several shards: tensor after tensor, 64-byte aligned
            offsets, pieces, length, source = [], [], 0, None
            for _, t in ts:
                start = _align(length, TENSOR_ALIGN)
                pieces += [(None, 0, start - length), (t.file, t.offset, t.nbytes)]
                offsets.append(start)
                length = start + t.nbytes
        tensors = [{"name": rel, "offset": o, "dtype": t.dtype, "shape": list(t.shape), "nbytes": t.nbytes}
                   for (rel, t), o in zip(ts, offsets)]
        run = _Planned("model" if key == "model" else f"layer.{key}", None if key == "model" else key,
                       length, verbatim, source, tensors, [p for p in pieces if p[2]], _align(at, ALIGN))
        at = run.offset + run.length
        plan.append(run)
    return plan, _align(at, ALIGN)


def layout_of(entry: dict, coded: bool) -> dict:
    """What of a run's manifest entry the plan decides: not its hashes or blocks, nor a coded run's offset."""
    drop = ("sha256", "block_sums", "stored", "blocks") + (("offset",) if coded else ())
    return {k: v for k, v in entry.items() if k not in drop}


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


class _Malformed(ValueError):
    """A manifest entry that cannot be what k3 pack wrote: the message names the run and field."""


def _field(entry, name: str, kind, where: str):
    """entry[name] as `kind` (int, str, list, ...), or _Malformed naming `where` and the field."""
    if not isinstance(entry, dict) or name not in entry:
        raise _Malformed(f"{where}: field {name!r} is missing")
    value = entry[name]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)) or \
            kind is not int and not isinstance(value, kind):
        raise _Malformed(f"{where}: field {name!r} is {value!r}, not {getattr(kind, '__name__', kind)}")
    return value


def _tensor(t, where: str) -> TrunkTensor:
    name = _field(t, "name", str, where)
    here = f"{where}, tensor {name}"
    shape = _field(t, "shape", list, here)
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape):
        raise _Malformed(f"{here}: field 'shape' is {shape!r}, not a list of sizes")
    return TrunkTensor(name, _field(t, "offset", int, here), _field(t, "dtype", str, here), tuple(shape),
                       _field(t, "nbytes", int, here))


def _run(r, i: int, codec: str, align: int, block: int) -> Run:
    where = f"runs[{i}]"
    key = _field(r, "key", str, where)
    where = f"run {key}"
    layer = None if _field(r, "layer", (int, type(None)), where) is None else r["layer"]
    offset, length = _field(r, "offset", int, where), _field(r, "length", int, where)
    tensors = tuple(_tensor(t, where) for t in _field(r, "tensors", list, where))
    try:
        blocks = tuple(Block.of(b, block) for b in _field(r, "blocks", list, where)) if codec != RAW else ()
        sums = tuple(int(x, 16) for x in _field(r, "block_sums", list, where)) if codec == RAW else ()
    except (TypeError, ValueError) as e:
        raise _Malformed(f"{where}: {'blocks' if codec != RAW else 'block_sums'}: {e}") from None
    run = Run(key, layer, offset, length, _align(length, align), _field(r, "sha256", str, where),
              _field(r, "verbatim", bool, where), tensors, codec, blocks, block, sums)
    if length < 0 or offset % align:
        raise _Malformed(f"{where}: offset {offset} is not a multiple of the alignment {align}, or length {length} < 0")
    if codec == RAW and len(sums) != -(-length // block):
        raise _Malformed(f"{where}: {len(sums)} block checksums for {length} bytes in blocks of {block}")
    if codec != RAW and not _blocks_cover(blocks, length, block):
        raise _Malformed(f"{where}: its blocks do not restore exactly its {length} bytes in order")
    _check_tensors(run, where)
    return run


def _check_tensors(run: Run, where: str) -> None:
    """Each tensor entry possible in itself, inside the run, after the one before it and not overlapping it."""
    end, before = 0, None
    for t in run.tensors:
        if t.dtype not in DTYPES or t.nbytes != math.prod(t.shape) * DTYPES[t.dtype][0]:
            raise _Malformed(f"{where}, tensor {t.name}: {t.nbytes} bytes cannot hold {t.dtype} {list(t.shape)}")
        if t.offset < end or t.offset + t.nbytes > run.length:
            what = f"overlaps {before}" if t.offset < end else f"ends past the run's {run.length} bytes"
            raise _Malformed(f"{where}, tensor {t.name}: at offset {t.offset} it {what}")
        end, before = t.offset + t.nbytes, t.name


def _parse_runs(m: dict, where: Path) -> dict[str, Run]:
    runs, end, before = {}, 0, None
    try:
        align, codec = _field(m, "alignment", int, "manifest"), str(m.get("codec", RAW))
        block = _field(m, "block_bytes", int, "manifest")
        if align <= 0 or block <= 0 or block % align:
            raise _Malformed(f"block_bytes {block} is not a positive multiple of the alignment {align}")
        fp = _field(m, "checkpoint", dict, "manifest")
        if not (isinstance(fp.get("config_sha256"), str) and isinstance(fp.get("shards"), list) and all(
                isinstance(s, dict) and isinstance(s.get("name"), str) and isinstance(s.get("size"), int)
                for s in fp["shards"])):
            raise _Malformed("the checkpoint fingerprint is incomplete")
        for i, r in enumerate(_field(m, "runs", list, "manifest")):
            run = _run(r, i, codec, align, block)
            if run.key in runs:
                raise _Malformed(f"run {run.key} is listed twice")
            if run.offset < end:
                raise _Malformed(f"run {run.key} overlaps run {before} before it (offset {run.offset} < {end})")
            runs[run.key], end, before = run, run.offset + (run.length if codec == RAW else run.span), run.key
    except _Malformed as e:
        raise TrunkError(f"manifest is malformed: {e}; re-pack with `k3 pack`", file=where) from None
    return runs


def prove_layout(trunk: "Trunk", index) -> list[str]:
    """What in the manifest's tensor table differs from what packing the checkpoint behind `index` lays out — its
    runs in order, each tensor's name, dtype, shape, bytes and offset in the run (and a raw run's offset in
    trunk.bin) as the checkpoint's headers give them: one phrase per run that differs ([] when none does)."""
    coded, plan = trunk.codec != RAW, plan_runs(index)[0]
    have, want = [r["key"] for r in trunk.manifest["runs"]], [p.key for p in plan]
    if have != want:
        missing, extra = [k for k in want if k not in have], [k for k in have if k not in want]
        if missing or extra:
            return [f"it has no run for {_few(missing)}" if missing else f"its runs {_few(extra)} are not the "
                    "checkpoint's"]
        return [f"its runs are in the order {_few(have)}, the checkpoint's {_few(want)}"]
    return [f"run {p.key}: {why}" for p, entry in zip(plan, trunk.manifest["runs"])
            if (why := _difference(layout_of(entry, coded), layout_of(p.entry(), coded)))]


def _few(keys: list) -> str:
    return ", ".join(map(str, keys[:4])) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")


def _difference(got: dict, want: dict) -> str | None:
    """The first field in which a run's manifest entry differs from the checkpoint's layout, in words."""
    if got == want:
        return None
    for k in want:
        if k == "tensors" and got.get(k) != want[k]:
            return _tensor_difference(got.get(k) or [], want[k])
        if got.get(k) != want[k]:
            return f"field {k!r} is {got.get(k)!r} in the manifest, {want[k]!r} from the checkpoint's headers"
    return f"fields {sorted(set(got) - set(want))} are not k3 pack's"


def _tensor_difference(got: list, want: list) -> str:
    names_got, names_want = [t.get("name") for t in got], [t["name"] for t in want]
    if missing := [n for n in names_want if n not in names_got]:
        return f"tensor {missing[0]} is missing from the manifest"
    if extra := [n for n in names_got if n not in names_want]:
        return f"the manifest lists tensor {extra[0]}, which the checkpoint does not have in this run"
    if names_got != names_want:
        i = next(i for i, (a, b) in enumerate(zip(names_got, names_want)) if a != b)
        return f"tensor {names_got[i]} is listed where the checkpoint has {names_want[i]} (entries out of order)"
    t, w = next((t, w) for t, w in zip(got, want) if t != w)
    k = next(k for k in w if t.get(k) != w[k])
    return f"tensor {w['name']}: {k} is {t.get(k)!r} in the manifest, {w[k]!r} in the checkpoint"


def seal(m: dict) -> dict:
    """The manifest with its own sha256 (of its canonical JSON without that field): what `k3 pack --verify`
    without the checkpoint proves an edit by. It guards against edits and damage, not against an adversary."""
    body = {k: v for k, v in m.items() if k != SEAL}
    return {**body, SEAL: _sha(_canon(body))}


def seal_problem(m: dict, have_model: bool) -> str | None:
    """What is wrong with the manifest's own sha256 (None: it matches, or it has none and the checkpoint's
    headers will prove the tensor table instead)."""
    if SEAL not in m:
        return None if have_model else (
            f"the manifest has no {SEAL} of its own (packed by an older k3), so its tensor table (names, shapes, "
            "dtypes) can only be proven against the checkpoint: give --model MODEL_DIR, or re-pack")
    if m[SEAL] != seal(m)[SEAL]:
        return (f"the manifest is not the one k3 pack wrote: its {SEAL} does not match its contents (edited or "
                "damaged since)" + ("" if have_model else "; --model MODEL_DIR names what differs") + "; re-pack")
    return None


def shape_problems(trunk: "Trunk") -> list[str]:
    """What in the run table k3 pack cannot have written, judged without the checkpoint: runs layer.0 ..
    layer.N-1 then model, each `layer` its key's; each run where the one before it ends (aligned); each
    tensor where the one before it ends (back to back in a verbatim run, else at the next 64-byte boundary)."""
    out, keys = [], list(trunk.runs)
    layers = sum(k.startswith("layer.") for k in keys)
    want = [f"layer.{L}" for L in range(layers)] + ["model"]
    if keys != want:
        missing = [k for k in want if k not in keys]
        out.append(f"it has no run for {_few(missing)}" if missing else
                   f"its runs are in the order {_few(keys)}, not {_few(want)}")
    at = 0
    for run in trunk.runs.values():
        number = run.key.removeprefix("layer.")
        if run.layer != (None if run.key == "model" else int(number) if number.isdigit() else run.layer):
            out.append(f"run {run.key}: field 'layer' is {run.layer!r}")
        if run.offset != at:
            out.append(f"run {run.key}: at offset {run.offset}, where k3 pack puts it at {at}")
        at = _align(run.offset + (run.length if run.codec == RAW else run.span), trunk.alignment)
        end = 0
        for t in run.tensors:
            if t.offset != (end if run.verbatim else _align(end, TENSOR_ALIGN)):
                out.append(f"run {run.key}, tensor {t.name}: at offset {t.offset}, not where the tensor before it "
                           "ends")
                break
            end = t.offset + t.nbytes
    return out


def check_source(trunk: "Trunk", checkpoint: Checkpoint) -> None:
    """TrunkError (exit 2) naming both unless the pack was packed from this very checkpoint (its fingerprint)."""
    old, new = trunk.manifest["checkpoint"], fingerprint(checkpoint)
    if diffs := fingerprint_diff(old, new):
        if not {s["name"] for s in old["shards"]} & {s["name"] for s in new["shards"]}:
            diffs = [f"none of the {len(old['shards'])} shards it was packed from ({old['shards'][0]['name']}, …) "
                     f"is one of the {len(new['shards'])} there"]
        raise TrunkError(f"{trunk.directory} was packed from another checkpoint than {checkpoint.root}: "
                         f"{_diff_text(diffs)}; give the pack made from {checkpoint.root}, or re-pack with "
                         f"`k3 pack {checkpoint.root} {trunk.directory}`", file=trunk.directory / MANIFEST)


def _blocks_cover(blocks, length: int, block: int) -> bool:
    """Blocks restore [0, length) one after the other, `block` bytes each but the last, stored in order."""
    return sum(b.restored for b in blocks) == length and all(b.restored == block for b in blocks[:-1]) \
        and all(b.offset == align_up(a.offset + a.stored) for a, b in zip(blocks, blocks[1:])) \
        and (not blocks or blocks[0].offset == 0)


def load_trunk(trunk_dir, checkpoint: Checkpoint | None = None) -> Trunk:
    """The manifest, checked for format, version, shape and against trunk.bin's size; with `checkpoint`, also
    that it was packed from that very checkpoint (check_source), before anything reads its runs."""
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
    if m.get("trunk_file") != TRUNK:
        raise TrunkError(f'manifest field "trunk_file" is {m.get("trunk_file")!r}: a pack\'s bytes are its own '
                         f'"{TRUNK}" in its directory; re-pack with `k3 pack`', file=where)
    runs, path = _parse_runs(m, where), directory / TRUNK
    if not path.is_file():
        hint = " (packing was interrupted: run `k3 pack` again to finish)" if (directory / PARTIAL).exists() else ""
        raise TrunkError(f"trunk.bin is missing{hint}", file=path)
    size = path.stat().st_size
    if bad := next((r for r in runs.values() if r.offset + r.span > size), None):
        raise TrunkError(f"trunk.bin has {size} bytes but run {bad.key} needs bytes up to {bad.offset + bad.span}: "
                         "the file is truncated; re-pack", file=path)
    trunk = Trunk(directory, path, m, int(m["alignment"]), size, runs)
    if checkpoint is not None:
        check_source(trunk, checkpoint)
    return trunk


def open_trunk(trunk_dir, checkpoint: Checkpoint) -> Trunk:
    """load_trunk, plus: the pack comes from this very checkpoint and covers every layer of its config."""
    trunk = load_trunk(trunk_dir, checkpoint)
    if missing := [k for k in [f"layer.{L}" for L in range(checkpoint.config.num_hidden_layers)] + ["model"]
                   if k not in trunk.runs]:
        raise TrunkError(f"the packed trunk has no run for {', '.join(missing)}", file=trunk.directory / MANIFEST)
    if differences := prove_layout(trunk, checkpoint.index):
        raise TrunkError(f"the manifest's tensor table is not this checkpoint's: {differences[0]}"
                         + (f" (and {len(differences) - 1} more runs)" if len(differences) > 1 else "")
                         + "; re-pack with `k3 pack`", file=trunk.directory / MANIFEST)
    return trunk
