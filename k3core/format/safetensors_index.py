"""Header-only index of a directory of safetensors shards (MODEL.md §6): name → file, dtype, shape, span.

`open` reads each shard's 8-byte length and JSON header (never tensor data) and raises CheckpointError
naming file and tensor for every MODEL.md §6 rule; it neither converts dtypes (BF16 stays uint16 bits) nor
caches tensors. Headers and index json as the safetensors/HF writers lay them out are checked in place
with numpy, anything else by json.loads (the reference); tests/format/test_safetensors_index.py checks both.
"""
import errno
import hashlib
import json
import math
import mmap
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import CheckpointError, UnsoundRunError
from .header_scan import (Table, fingerprints, fp_of, metadata_ok, pair, parse_compact, string_blob,
                                word_view, weight_map_compact, WeightMap)
from ..files.limits import INDEX_FILE_BYTES, loads_limited, read_json_limited, read_limited

DTYPES = {"U8": (1, np.dtype("u1")), "I8": (1, np.dtype("i1")), "BF16": (2, np.dtype("<u2")),
          "F16": (2, np.dtype("<f2")), "F32": (4, np.dtype("<f4")), "F64": (8, np.dtype("<f8")),
          "I32": (4, np.dtype("<i4")), "I64": (8, np.dtype("<i8"))}
INDEX_JSON = "model.safetensors.index.json"
_LIMIT = 2**62                                  # no offset or size of a real file gets here


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    file: Path                                  # absolute path of its shard
    dtype: str                                  # safetensors dtype string
    shape: tuple[int, ...]
    offset: int                                 # absolute: 8 + N + data_offsets[0]
    nbytes: int


@dataclass(frozen=True)
class ShardFile:
    path: Path
    size: int                                   # bytes on disk
    header_len: int                             # N
    header_sha256: str                          # of the N header bytes


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is, in words (from its st_mode)."""
    return next((what for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                                         (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                                         (stat.S_ISBLK, "a block device")) if test(mode)), "not a regular file")


class _Twice(Exception):
    """Raised by `hook`, a json.loads object_pairs_hook, for a key given twice (json keeps the last)."""

    def hook(pairs):
        if len(d := dict(pairs)) != len(pairs):
            raise _Twice(next(k for i, (k, _) in enumerate(pairs) if k in dict(pairs[:i])))
        return d


MAX_HEADER = 100_000_000  # bytes; the released K3's largest shard header is under 1 MB


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _ints(v):
    return isinstance(v, list) and all(type(x) is int and 0 <= x < _LIMIT for x in v)


def _parse_json(h, path):
    """Columns of any header json.loads accepts (the reference for parse_compact), or CheckpointError."""
    try:
        obj = loads_limited(bytes(h).decode("utf-8"), path, object_pairs_hook=_Twice.hook)
    except UnicodeDecodeError:
        raise CheckpointError("header is not valid UTF-8", file=path) from None
    except _Twice as e:
        raise CheckpointError("header lists it twice", file=path, tensor=e.args[0]) from None
    except ValueError as e:
        raise CheckpointError(f"header is not valid JSON: {e}", file=path) from None
    if not isinstance(obj, dict):
        raise CheckpointError("header is not a JSON object", file=path)
    names, kinds, kind, offsets = [], {}, [], []
    for name, e in obj.items():
        if name == "__metadata__":
            if not metadata_ok(e):
                raise CheckpointError(f'field "__metadata__" is {_short(e)}: the safetensors format allows only an '
                                      'object of string -> string there', file=path)
            continue
        e = e if isinstance(e, dict) else {}
        dt, shape, offs = e.get("dtype"), e.get("shape"), e.get("data_offsets")
        if not (isinstance(dt, str) and _ints(shape) and _ints(offs) and len(offs) == 2):
            raise CheckpointError('entry is not {"dtype": str, "shape": [int >= 0, …], '
                                  '"data_offsets": [begin, end]}', file=path, tensor=name)
        names.append(name)
        kind.append(kinds.setdefault((dt, tuple(shape)), len(kinds)))
        offsets.append(offs)
    offsets = np.array(offsets, np.int64).reshape(-1, 2)
    return Table(*string_blob(names), list(kinds), np.array(kind, np.int64), offsets[:, 0], offsets[:, 1])


def _check_spans(t, path, data_len):
    """The rules after parsing, shared by both paths: known dtype; begin <= end; span = numel × itemsize;
    span inside the file; no two spans share a byte (the safetensors library refuses overlaps too; two
    tensors on the same bytes would read each other's values). Gaps between spans are allowed."""
    need = np.empty(len(t.kinds), np.int64)
    for k, (dt, shape) in enumerate(t.kinds):
        if dt not in DTYPES:
            raise CheckpointError(f"unknown dtype {dt!r}", file=path, tensor=t.name(int(np.argmax(t.kind == k))))
        nbytes = math.prod(shape) * DTYPES[dt][0]
        need[k] = nbytes if nbytes < _LIMIT else -1
    need = need[t.kind]
    for bad, why in ((t.begin > t.end, lambda i: f"data_offsets [{t.begin[i]}, {t.end[i]}] run backwards"),
                     (t.end - t.begin != need, lambda i: f"span of {t.end[i] - t.begin[i]} bytes, but "
                      f"{t.kinds[t.kind[i]][0]} {list(t.kinds[t.kind[i]][1])} needs {need[i]}"),
                     (t.end > data_len, lambda i: f"span ends at data byte {t.end[i]}, past end of file "
                      f"(its data region holds {data_len})")):
        if bad.any():
            i = int(np.argmax(bad))
            raise CheckpointError(why(i), file=path, tensor=t.name(i))
    filled = np.flatnonzero(t.end > t.begin)
    order = filled[np.argsort(t.begin[filled], kind="stable")]
    clash = np.flatnonzero(t.begin[order[1:]] < t.end[order[:-1]])
    if clash.size:
        a, b = int(order[clash[0]]), int(order[clash[0] + 1])
        raise CheckpointError(f"data_offsets [{t.begin[b]}, {t.end[b]}] overlap those of {t.name(a)!r} "
                              f"[{t.begin[a]}, {t.end[a]}]", file=path, tensor=t.name(b))


def _load_shard(path):
    """(ShardFile, its Table, fingerprints of its names), from the first 8 + N bytes of `path`."""
    try:  # O_NONBLOCK: a FIFO named like a shard must not hang the open (no effect on a regular file)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        why = "a symlink to nothing" if exc.errno == errno.ENOENT and os.path.islink(path) else exc.strerror
        raise CheckpointError(f"cannot open: {why}", file=path) from None
    try:
        if not stat.S_ISREG((st := os.fstat(fd)).st_mode):
            raise CheckpointError(f"not a regular file ({file_kind(st.st_mode)}): a shard must be one", file=path)
        size = st.st_size
        if size < 8:
            raise CheckpointError(f"file of {size} bytes is too short for a safetensors header", file=path)
        n = int.from_bytes(os.pread(fd, 8, 0), "little")
        if n == 0 or 8 + n > size:
            raise CheckpointError(f"header length {n} is zero or runs past end of file ({size} bytes)", file=path)
        if n > MAX_HEADER:
            raise CheckpointError(f"header length {n:,} is over the limit of {MAX_HEADER:,} bytes (the safetensors "
                                  "library's too)", file=path)
        buf = bytearray(n + 64)                  # spare bytes for whole-word reads near the end
        if os.preadv(fd, [memoryview(buf)[:n]], 8) != n:
            raise CheckpointError("file shrank while its header was read", file=path)
    except OSError as exc:  # EIO from a failing disk, and the like
        raise CheckpointError(f"cannot read the header: {exc.strerror} (errno {exc.errno})", file=path) from None
    finally:
        os.close(fd)
    shard = ShardFile(path, size, n, hashlib.sha256(memoryview(buf)[:n]).hexdigest())
    t = parse_compact(buf, n) or _parse_json(memoryview(buf)[:n], path)
    _check_spans(t, path, size - 8 - n)
    return shard, t, fingerprints(word_view(t.blob), t.start, t.stop)


def shard_spans(path) -> tuple[ShardFile, np.ndarray, np.ndarray, list[str]]:
    """One shard's header, its tensors' absolute byte spans [start, end) sorted by start, and their names."""
    shard, t, _ = _load_shard(path)
    order = np.argsort(t.begin, kind="stable")
    base, names = 8 + shard.header_len, t.names()
    return shard, t.begin[order].astype(np.int64) + base, t.end[order].astype(np.int64) + base, \
        [names[i] for i in order.tolist()]


def _weight_map(path):
    raw = bytearray(read_limited(path, INDEX_FILE_BYTES, "a shard index"))
    raw += bytes(8)                              # spare bytes for whole-word reads near the end
    if fast := weight_map_compact(raw):
        return fast
    try:
        wm = loads_limited(raw[:-8].decode("utf-8"), path).get("weight_map")
    except (ValueError, AttributeError) as e:
        raise CheckpointError(f"not a JSON object: {e}", file=path) from None
    if not (isinstance(wm, dict) and wm and all(isinstance(v, str) for v in wm.values())):
        raise CheckpointError('"weight_map" is missing, empty, or maps a tensor to a non-string', file=path)
    return WeightMap(pair(fp_of(list(wm)), fp_of(list(wm.values()))), sorted(set(wm.values())))


# ---- the index ----------------------------------------------------------------------------------
class ShardIndex:
    """Every tensor of a shard directory: name → file, dtype, shape and absolute byte span, held as
    numpy columns; the name → row dict is built on the first lookup by name."""

    def __init__(self, directory, files, tables, kinds, kind, offset, nbytes):
        self.directory, self.files, self._tables = directory, files, tables
        self._kinds, self._kind, self._offset, self._nbytes = kinds, kind, offset, nbytes
        self._file_of = np.repeat(np.arange(len(files), dtype=np.int32), [len(t.start) for t in tables])
        self._where, self._maps = None, {}

    @classmethod
    def open(cls, directory):
        """Index `directory`: the shards its model.safetensors.index.json names, else every *.safetensors."""
        directory = Path(directory).resolve()
        if not directory.is_dir():
            raise CheckpointError("checkpoint directory does not exist", file=directory)
        index_path, wm = directory / INDEX_JSON, None
        pool = ThreadPoolExecutor(2)             # shards are parsed while the index json is
        try:
            ahead = {p.name: pool.submit(_load_shard, p) for p in sorted(directory.glob("*.safetensors"))}
            if index_path.is_file():
                wm = _weight_map(index_path)
                listed = sorted(wm.files, key=lambda f: Path(f).name)
                for f in listed:  # plain names only: an index must not reach outside its directory
                    if f != Path(f).name or f in ("", ".", "..") or "\\" in f:
                        raise CheckpointError(f"{INDEX_JSON} names the shard {f!r}: not a plain file name in this "
                                              "directory", file=index_path)
                    if not os.path.lexists(directory / f):  # anything else there: _load_shard says what it is
                        raise CheckpointError(f"shard named in {INDEX_JSON} does not exist", file=directory / f)
            else:
                listed = list(ahead)
            if not listed:
                raise CheckpointError(f"no *.safetensors shards and no {INDEX_JSON}", file=directory)
            files, tables, fps = zip(*((ahead.get(f) or pool.submit(_load_shard, directory / f)).result()
                                       for f in listed))
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        kinds, parts = {}, []
        for shard, t in zip(files, tables):
            remap = np.array([kinds.setdefault(k, len(kinds)) for k in t.kinds], np.int32)
            parts.append((remap[t.kind], t.begin + 8 + shard.header_len, t.end - t.begin))
        index = cls(directory, list(files), list(tables), list(kinds), *map(np.concatenate, zip(*parts)))
        index._check_unique(np.concatenate([fp[0] for fp in fps]))
        if wm is not None:
            file_fp = fp_of(listed)
            here = sum(pair(fp, file_fp[:, i:i + 1]).sum(axis=1) for i, fp in enumerate(fps))
            if len(wm.fp[0]) != len(index) or (here != wm.fp.sum(axis=1)).any():
                index._explain_weight_map(index_path, listed)
        return index

    def _name(self, row):
        f = int(self._file_of[row])
        return self._tables[f].name(row - int(np.searchsorted(self._file_of, f)))

    def _check_unique(self, fp):
        """No name twice: rows with equal fingerprints are candidates, compared by name."""
        if not (np.diff(np.sort(fp)) == 0).any():
            return
        order = np.argsort(fp, kind="stable")
        for i in np.flatnonzero(np.diff(fp[order]) == 0):
            a, b = int(order[i]), int(order[i + 1])
            if self._name(a) == self._name(b):
                fa, fb = (self.files[self._file_of[r]].path for r in (a, b))
                why = f"tensor is in two shards: {fa.name} and {fb.name}" if fa != fb else "header lists it twice"
                raise CheckpointError(why, file=fb, tensor=self._name(b))

    def _explain_weight_map(self, index_path, listed):
        """The weight_map and the headers disagree as multisets of (name, file): name the first entry
        where they do. (A disagreement json.loads would hide -- a repeated key -- is none.)"""
        here = {n: f for f, t in zip(listed, self._tables) for n in t.names()}
        for name, f in read_json_limited(index_path, INDEX_FILE_BYTES, "a shard index")["weight_map"].items():
            if (h := here.pop(name, None)) != f:
                found = f"its header is in {h}" if h else "no shard header lists it"
                raise CheckpointError(f"{INDEX_JSON} assigns it to {f}, but {found}", file=index_path, tensor=name)
        for name, f in here.items():
            raise CheckpointError(f"tensor is missing from {INDEX_JSON}", file=self.directory / f, tensor=name)

    @property
    def _rows(self):
        """name → row, built once; the header buffers it is built from are then dropped."""
        if self._where is None and (tables := self._tables) is not None:   # None: another thread built it
            where = {}
            for t in tables:
                where.update(zip(t.names(), range(len(where), len(where) + len(t.start))))
            self._where, self._tables = where, None
        return self._where

    def __contains__(self, name):
        return name in self._rows

    def __len__(self):
        return len(self._kind)

    def names(self):
        return iter(self._rows)

    def __getitem__(self, name):
        if (row := self._rows.get(name)) is None:
            raise CheckpointError("no such tensor in the checkpoint", file=self.directory, tensor=name)
        dtype, shape = self._kinds[self._kind[row]]
        return TensorInfo(name, self.files[self._file_of[row]].path, dtype, shape,
                          int(self._offset[row]), int(self._nbytes[row]))

    def _map(self, path):
        """The shard mapped, once; a shard gone or resized since it was indexed is UnsoundRunError (exit 4):
        whatever was computed from this index may have read other bytes."""
        if (mm := self._maps.get(path)) is None:
            indexed = next(f.size for f in self.files if f.path == path)
            try:
                with open(path, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    if size != indexed:
                        raise UnsoundRunError(f"{path} is {size} bytes, but {indexed} when it was indexed: it was "
                                              "replaced or cut after k3 opened it; the run stops")
                    mm = self._maps[path] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except OSError as exc:
                raise UnsoundRunError(f"{path}: {exc.strerror} since it was indexed (deleted or moved while k3 ran); "
                                      "the run stops") from None
        return mm

    def read(self, name):
        """The tensor as a read-only array over the mapped shard (BF16 as uint16 bits); touches only its span."""
        t = self[name]
        itemsize, dtype = DTYPES[t.dtype]
        return np.frombuffer(self._map(t.file), dtype, t.nbytes // itemsize, t.offset).reshape(t.shape)

    def read_bytes(self, name):
        t = self[name]
        return self._map(t.file)[t.offset:t.offset + t.nbytes]

    def close(self):
        for mm in self._maps.values():
            try:
                mm.close()
            except BufferError:                 # arrays from read() still view it; unmapped when they go
                pass
        self._maps.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
