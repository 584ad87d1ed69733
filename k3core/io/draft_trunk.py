"""A draft trunk: the weights of a cheaper copy of the model, derived from a packed trunk (`k3 pack --draft`), for a
draft source that proposes ids the exact model then verifies. Drafts never decide a token, so nothing here has to
match anything bit for bit, but all of it is deterministic. This module holds the derivation, the format
(docs/DRAFT-TRUNK.md, byte for byte), its reader and `draft_linear`, a draft tensor's product by a kernel backend's
int8_linear / int4_linear; it does not hold the writer (io/draft_pack.py), the `self` draft source, nor those kernels
(their arithmetic: native/kernels.h, docs/NUMERICS.md). Checked by tests/io/test_draft_trunk.py against an independent
re-derivation from the trunk's bf16 values.

The derivation: every 2-D BF16 tensor of the chosen layers' runs and of the model run (each projection, the router,
lm_head) is quantized from its bf16 values (exact in float32), row by row; the embedding is left out (a draft reads
embedding rows from the main trunk); every other tensor (1-D, F32: norms, biases, A_log, conv weights) is copied.
  int8_rows      per row: scale = float32(max|w|) / 127, a float32 division; code = round-half-to-even(float64(w) /
                 float64(scale)) clipped to [-127, 127], int8. A row of zeros has scale 0 and codes 0.
  int4_groups32  per row, groups of 32 columns (the last one padded with zeros to 32): scale = max|w| / 7 the same
                 way, code in [-7, 7], stored offset-binary: nibble = code + 8 (1..15), two to a byte, the even
                 column in the low nibble.
Dequantized: float32(code) * scale, one float32 rounding; |w - code * scale| <= scale / 2 up to the float64
quotient's rounding.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import __version__
from ..errors import TrunkError, UsageError
from ..files.aligned_io import ALIGN
from ..format.checkpoint import EMBED, HEAD
from ..format.safetensors_index import DTYPES
from ..interfaces import Param
from .codec import BLOCK
from .pack import _pread_full
from .trunk import MANIFEST, SEAL, TENSOR_ALIGN, Trunk, TrunkTensor, _align, _read_json, seal
from .trunk_reader import check_blocks

FORMAT, VERSION = "k3-draft-trunk", 1
DATA, PARTIAL = "draft.bin", "draft.bin.partial"   # beside MANIFEST ("manifest.json")
INT8, INT4, COPIED = "int8_rows", "int4_groups32", "copied"
KINDS = {"int8": INT8, "int4": INT4}               # --draft value -> the kind of its quantized tensors
LIMITS = {INT8: 127, INT4: 7}                      # codes lie in [-limit, limit]
GROUP = 32                                         # int4 columns per scale
STEP = 1 << 22                                     # elements (de)quantized at a time: float64 temporaries of 32 MB


@dataclass(frozen=True)
class DraftSpec:
    kind: str                   # "int8" or "int4" (KINDS)
    layers: tuple[int, ...]     # the layers the draft holds, ascending; the rest are absent (a draft skips them)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise UsageError(f"draft kind {self.kind!r} is not one k3 derives; choose {' or '.join(KINDS)}")
        if not all(type(L) is int and L >= 0 for L in self.layers) or list(self.layers) != sorted(set(self.layers)):
            raise UsageError(f"draft layers {list(self.layers)} are not distinct layer numbers in ascending order")


def parse_layers(spec: str | None, num_layers: int) -> tuple[int, ...]:
    """--draft-layers "0-11,40" as layer numbers, ascending; None: every layer. UsageError naming the bad part."""
    if spec is None:
        return tuple(range(num_layers))
    layers: set[int] = set()
    for part in spec.split(","):
        if not (m := re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part, re.ASCII)):
            raise UsageError(f"--draft-layers {spec!r}: {part.strip()!r} is not a layer number nor a range like 0-11")
        first, last = int(m[1]), int(m[2] or m[1])
        if first > last:
            raise UsageError(f"--draft-layers {spec!r}: {part.strip()!r} runs backwards (write {last}-{first})")
        if last >= num_layers:
            raise UsageError(f"--draft-layers {spec!r}: {part.strip()!r} names layer {last}, but the model has "
                             f"{num_layers} layers (0-{num_layers - 1})")
        layers.update(range(first, last + 1))
    return tuple(sorted(layers))


def default_dir(trunk_dir, kind: str) -> Path:
    return Path(trunk_dir) / f"draft-{kind}"


def source_id(trunk: Trunk) -> str:
    """The packed trunk's identity: its manifest's sha256 (of its canonical JSON without that field)."""
    return seal(trunk.manifest)[SEAL]


def trunk_layers(trunk: Trunk) -> int:
    return sum(key.startswith("layer.") for key in trunk.runs)


# ---- the derivation ------------------------------------------------------------------------------------------
def quantize(kind: str, w: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    """w float32 [rows, in] -> codes (int8 [rows, in] | packed uint8 [rows, groups * 16]) and float32 scales
    ([rows] | [rows, groups]), as the module docstring derives them. TrunkError naming `what` and the row when a
    row holds a NaN or an infinity (no finite scale covers it)."""
    limit, (rows, cols) = LIMITS[kind], w.shape
    if kind == INT4:
        grouped = np.pad(w, ((0, 0), (0, groups(cols) * GROUP - cols))).reshape(rows, -1, GROUP)
    else:
        grouped = w.reshape(rows, 1, cols)                                  # one group: the whole row
    scales = np.abs(grouped).max(axis=2, initial=0) / np.float32(limit)    # float32 [rows, groups]
    if not np.isfinite(scales).all():
        row = int(np.argwhere(~np.isfinite(scales))[0][0])
        raise TrunkError(f"{what}: row {row} holds a NaN or an infinity, so no draft can be derived from it: the "
                         "checkpoint is damaged (`k3 verify --deep` lists every such tensor)")
    divisor = np.where(scales == 0, np.float32(1), scales).astype(np.float64)[..., None]
    codes = np.clip(np.rint(grouped / divisor), -limit, limit).astype(np.int8)  # rint: half to even
    if kind == INT8:
        return codes.reshape(rows, cols), scales.reshape(rows)
    nibbles = (codes.reshape(rows, -1) + 8).astype(np.uint8)
    return nibbles[:, 0::2] | (nibbles[:, 1::2] << 4), scales


def groups(cols: int) -> int:
    return -(-cols // GROUP)


def unpack_int4(packed: np.ndarray) -> np.ndarray:
    """uint8 [rows, n] of offset-binary nibbles -> int8 codes [rows, 2n], the low nibble first."""
    codes = np.empty((packed.shape[0], 2 * packed.shape[1]), np.int8)
    codes[:, 0::2] = (packed & 15).astype(np.int8) - 8
    codes[:, 1::2] = (packed >> 4).astype(np.int8) - 8
    return codes


def quantized(t: TrunkTensor) -> bool:
    return t.dtype == "BF16" and len(t.shape) == 2


# ---- the plan: where each tensor's bytes go -------------------------------------------------------------------
def _parts(kind: str, t: TrunkTensor) -> list[tuple[str, int]]:
    """(part, bytes) of a tensor in a draft run, in order: codes then scales, or the copied data."""
    if not quantized(t):
        return [("data", t.nbytes)]
    rows, cols = t.shape
    if kind == INT8:
        return [("codes", rows * cols), ("scales", 4 * rows)]
    return [("codes", rows * groups(cols) * GROUP // 2), ("scales", 4 * rows * groups(cols))]


def _plan_run(run, kind: str, offset: int) -> dict:
    tensors, at = [], 0
    for t in run.tensors:
        if run.layer is None and t.name == EMBED:
            continue
        entry = {"name": t.name, "kind": kind if quantized(t) else COPIED, "dtype": t.dtype, "shape": list(t.shape)}
        for part, n in _parts(kind, t):
            at = _align(at, TENSOR_ALIGN)
            entry[part] = {"offset": at, "nbytes": n}
            at += n
        tensors.append(entry)
    return {"key": run.key, "layer": run.layer, "offset": offset, "length": at, "tensors": tensors}


def plan_draft(trunk: Trunk, spec: DraftSpec) -> tuple[list[dict], int]:
    """The draft's runs in file order (its layers ascending, then "model"), each at a 4096-aligned offset with its
    tensor table, and the data file's size."""
    runs, at = [], 0
    for source in [trunk.layer(L) for L in spec.layers] + [trunk.model]:
        runs.append(_plan_run(source, KINDS[spec.kind], _align(at, ALIGN)))
        at = runs[-1]["offset"] + runs[-1]["length"]
    return runs, _align(at, ALIGN)


def draft_bytes(trunk: Trunk, kind: str, layers) -> int:
    """Bytes draft.bin will have for a `kind` draft of `layers` of `trunk`: what the draft occupies, its runs and
    the padding between them (held in RAM, the runs alone are up to 4 KiB less each)."""
    return plan_draft(trunk, DraftSpec(kind, tuple(layers)))[1]


def manifest_of(trunk: Trunk, spec: DraftSpec, plan: list[dict], total: int, done: list | None = None) -> dict:
    """The draft's manifest (unsealed); `done`: each run's sha256 and block_sums, in plan order."""
    runs = [{**r, "sha256": d["sha256"], "block_sums": d["block_sums"]} for r, d in zip(plan, done)] if done else plan
    return {"format": FORMAT, "version": VERSION, "derived_by": f"k3 {__version__}", "kind": spec.kind,
            "group": GROUP, "alignment": ALIGN, "tensor_alignment": TENSOR_ALIGN, "block_bytes": BLOCK,
            "draft_file": DATA, "draft_bytes": total, "layers": list(spec.layers),
            "source": {"manifest_sha256": source_id(trunk), "directory": str(trunk.directory.resolve()),
                       "layers": trunk_layers(trunk)},
            "runs": runs}


def layout(m: dict) -> dict:
    """What of a draft manifest the source trunk and the spec decide: not its hashes, the k3 that wrote it, nor
    where the source trunk was."""
    runs = [{k: v for k, v in r.items() if k not in ("sha256", "block_sums")} for r in m.get("runs") or []]
    source = {k: v for k, v in (m.get("source") or {}).items() if k != "directory"}
    return {**{k: v for k, v in m.items() if k not in (SEAL, "derived_by")}, "source": source, "runs": runs}


def another_trunk(out: Path, source: dict, trunk: Trunk, remedy: str) -> TrunkError:
    return TrunkError(f"{out} holds a draft of another trunk: derived from {source.get('directory')} (manifest sha256 "
                      f"{str(source.get('manifest_sha256'))[:12]}…), not from {trunk.directory} (manifest sha256 "
                      f"{source_id(trunk)[:12]}…); {remedy}", file=out / MANIFEST)


# ---- reading a draft --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DraftTensor:
    name: str                   # relative to layers.{L}. in a layer run; the full name in the model run
    kind: str                   # INT8, INT4 or COPIED
    shape: tuple[int, ...]      # the trunk tensor's: [out, in] for a quantized matrix
    dtype: str                  # the trunk tensor's (BF16 for a quantized one)
    data: np.ndarray            # codes int8 [out, in] | packed uint8 [out, groups * 16] | the copied values
    scales: np.ndarray | None   # float32 [out] | [out, groups] | None

    def f32(self) -> np.ndarray:
        """Every value as float32, as Param.f32 (what an error report reads)."""
        return self.dequantized()

    def dequantized(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Rows [lo, hi) as float32 [rows, in]: float32(code) * scale; a copied tensor's values widened."""
        if self.kind == COPIED:
            return Param(self.data[lo:hi], self.dtype).f32()
        if self.kind == INT8:
            return self.data[lo:hi].astype(np.float32) * self.scales[lo:hi, None]
        codes = unpack_int4(self.data[lo:hi]).astype(np.float32)            # [rows, groups * 32]
        rows = codes.shape[0]
        return (codes.reshape(rows, -1, GROUP) * self.scales[lo:hi, :, None]).reshape(rows, -1)[:, :self.shape[1]]


def draft_linear(t: DraftTensor, x: np.ndarray, kernels) -> np.ndarray:
    """y = x · Wᵀ, float32 [T, out], for x float32 [T, in], from the codes as stored: `kernels`' (a KernelBackend)
    int8_linear or int4_linear by the tensor's kind, linear for a copied matrix. Every built-in backend gives the same
    bytes, at any thread count, for a row alone or in a batch (docs/NUMERICS.md)."""
    rows, cols = t.shape
    if x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != cols:
        raise ValueError(f"draft_linear of {t.name} [{rows}, {cols}] takes float32 [T, {cols}], got {x.dtype} "
                         f"{list(x.shape)}")
    if t.kind == INT8:
        return kernels.int8_linear(t.data, t.scales, x)
    if t.kind == INT4:
        return kernels.int4_linear(t.data, t.scales, cols, x)
    return kernels.linear(Param(t.data, t.dtype, t.name), x)


@dataclass(frozen=True)
class DraftRun:
    key: str                    # "layer.{L}" or "model"
    layer: int | None
    offset: int                 # in draft.bin, a multiple of ALIGN
    length: int
    sha256: str
    sums: tuple[int, ...]       # planes_checksum of each block_bytes block, as a raw trunk run's
    block_bytes: int
    tensors: tuple[dict, ...]   # the manifest's entries (proven against the plan)

    def block_sum(self, i: int) -> int:
        return self.sums[i]


def _tensor(e: dict, buf) -> DraftTensor:
    shape = tuple(e["shape"])
    if e["kind"] == COPIED:
        itemsize, dtype = DTYPES[e["dtype"]]
        data = np.frombuffer(buf, dtype, e["data"]["nbytes"] // itemsize, e["data"]["offset"]).reshape(shape)
        return DraftTensor(e["name"], COPIED, shape, e["dtype"], data, None)
    rows, cols = shape
    if e["kind"] == INT8:
        codes = np.frombuffer(buf, np.int8, rows * cols, e["codes"]["offset"]).reshape(rows, cols)
        scales = np.frombuffer(buf, np.float32, rows, e["scales"]["offset"])
    else:
        codes = np.frombuffer(buf, np.uint8, rows * groups(cols) * GROUP // 2, e["codes"]["offset"]).reshape(rows, -1)
        scales = np.frombuffer(buf, np.float32, rows * groups(cols), e["scales"]["offset"]).reshape(rows, -1)
    return DraftTensor(e["name"], e["kind"], shape, e["dtype"], codes, scales)


@dataclass
class DraftTrunk:
    directory: Path
    path: Path                  # draft.bin
    manifest: dict
    spec: DraftSpec
    num_layers: int             # the source trunk's
    runs: dict[str, DraftRun]

    def read(self, run: DraftRun) -> bytearray:
        """The run's bytes, every block checked against its checksum (UnsoundRunError naming the block and run)."""
        buf, fd = bytearray(run.length), os.open(self.path, os.O_RDONLY)
        try:
            _pread_full(fd, memoryview(buf), run.offset, self.path)
        finally:
            os.close(fd)
        check_blocks(run, memoryview(buf), 0, run.length, self.path)
        return buf

    def tensors(self, run: DraftRun) -> dict[str, DraftTensor]:
        buf = self.read(run)
        return {e["name"]: _tensor(e, buf) for e in run.tensors}

    def layer(self, layer: int) -> dict[str, DraftTensor] | None:
        """Layer `layer`'s tensors by relative name; None for a layer the draft leaves out."""
        if not 0 <= layer < self.num_layers:
            raise TrunkError(f"the trunk has no layer {layer}: it has {self.num_layers}", file=self.directory)
        run = self.runs.get(f"layer.{layer}")
        return None if run is None else self.tensors(run)

    def model(self) -> dict[str, DraftTensor]:
        """The model run's tensors by full name: lm_head quantized, the final norms copied (no embedding)."""
        return self.tensors(self.runs["model"])

    def head(self) -> DraftTensor:
        return self.model()[HEAD]


def _parse(m: dict, trunk: Trunk, where: Path) -> tuple[DraftSpec, dict[str, DraftRun], int]:
    """The spec, the runs and the data file's size of a sealed draft manifest of `trunk`, proven against the plan
    that deriving it from `trunk` makes; TrunkError naming the first difference."""
    try:
        spec = DraftSpec(m["kind"], tuple(m["layers"]))
        plan, total = plan_draft(trunk, spec)
        want = layout(manifest_of(trunk, spec, plan, total))
        if (got := layout(m)) != want:
            bad = next((w["key"] for g, w in zip(got["runs"], want["runs"]) if g != w), None)
            raise TrunkError("the manifest's tensor table is not what deriving this draft from the trunk lays out ("
                             + (f"run {bad} differs" if bad else "its header fields differ") + "); derive it again",
                             file=where)
        runs = {}
        for r in m["runs"]:
            sums = tuple(int(x, 16) for x in r["block_sums"])
            if len(sums) != -(-r["length"] // m["block_bytes"]):
                raise ValueError(f"run {r['key']}: {len(sums)} block checksums for {r['length']} bytes")
            runs[r["key"]] = DraftRun(r["key"], r["layer"], r["offset"], r["length"], str(r["sha256"]), sums,
                                      m["block_bytes"], tuple(r["tensors"]))
    except (KeyError, TypeError, ValueError, UsageError) as e:
        raise TrunkError(f"the draft manifest is malformed: {e}; derive it again", file=where) from None
    return spec, runs, total


def open_draft_trunk(draft_dir, trunk: Trunk) -> DraftTrunk:
    """The draft in `draft_dir`, checked for format, version, its own sha256, that it was derived from `trunk`,
    its tensor table against the plan, and draft.bin's size; no run is read yet (each is checked when read)."""
    directory = Path(draft_dir)
    where = directory / MANIFEST
    if not where.is_file():
        raise TrunkError("no draft trunk here (manifest.json is missing): derive one with `k3 pack MODEL_DIR "
                         "TRUNK_DIR --draft int8`", file=where)
    m = _read_json(where)
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise TrunkError(f'not a draft-trunk manifest (want "format": "{FORMAT}")', file=where)
    if m.get("version") != VERSION:
        raise TrunkError(f"draft manifest version {m.get('version')!r} is not one this k3 reads ({VERSION}); remove "
                         "the directory and derive it again", file=where)
    if m.get(SEAL) != seal(m)[SEAL]:
        raise TrunkError(f"the manifest is not the one k3 pack --draft wrote: its {SEAL} does not match its contents "
                         "(edited or damaged since); remove the directory and derive it again", file=where)
    if not isinstance(m.get("source"), dict) or m["source"].get("manifest_sha256") != source_id(trunk):
        raise another_trunk(directory, m["source"] if isinstance(m.get("source"), dict) else {}, trunk,
                            f"derive one for it with `k3 pack MODEL_DIR {trunk.directory} --draft {m.get('kind')}`")
    spec, runs, total = _parse(m, trunk, where)
    path = directory / DATA
    if not path.is_file():
        raise TrunkError(f"{DATA} is missing" + (" (deriving was interrupted: run `k3 pack --draft` again to finish)"
                                                 if (directory / PARTIAL).exists() else ""), file=path)
    if (size := path.stat().st_size) < total:
        bad = next(r for r in runs.values() if r.offset + r.length > size)
        raise TrunkError(f"{DATA} has {size} bytes but run {bad.key} needs bytes up to {bad.offset + bad.length}: "
                         "the file is truncated; remove the directory and derive it again", file=path)
    return DraftTrunk(directory, path, m, spec, trunk_layers(trunk), runs)
