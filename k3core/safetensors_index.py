"""Header-only index of a directory of safetensors shards (SPEC §6): names → file, dtype, shape, span.

`open` reads each shard's 8-byte length and JSON header and nothing else; every rule it enforces
raises CheckpointError naming the file and tensor. It does not convert dtypes (BF16 stays raw
uint16 bits), load or cache tensors; `read` maps one span on demand. Headers in the layout
safetensors writes take a vectorised path; anything else goes through json.loads, with the same
result (tests/test_safetensors_index.py checks both against struct-decoded fixtures).
"""
import hashlib
import json
import math
import mmap
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from k3core.errors import CheckpointError

DTYPES = {"U8": (1, np.dtype("u1")), "I8": (1, np.dtype("i1")), "BF16": (2, np.dtype("<u2")),
          "F16": (2, np.dtype("<f2")), "F32": (4, np.dtype("<f4")), "F64": (8, np.dtype("<f8")),
          "I32": (4, np.dtype("<i4")), "I64": (8, np.dtype("<i8"))}
INDEX_JSON = "model.safetensors.index.json"
_LIMIT = 2**62                    # offsets and sizes beyond this cannot be a real file


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    file: Path                    # absolute path of its shard
    dtype: str                    # safetensors dtype string
    shape: tuple[int, ...]
    offset: int                   # absolute: 8 + N + data_offsets[0]
    nbytes: int


@dataclass(frozen=True)
class ShardFile:
    path: Path
    size: int                     # bytes on disk
    header_len: int               # N
    header_sha256: str            # of the N header bytes


class _Columns(NamedTuple):
    """One header's tensors as columns, in header order."""
    names: list[str]
    kinds: list[tuple[str, tuple[int, ...]]]   # the distinct (dtype, shape) pairs
    kind: np.ndarray                           # per tensor: index into kinds
    begin: np.ndarray                          # per tensor: data_offsets, relative to byte 8 + N
    end: np.ndarray


# ---- fast path: the exact bytes safetensors writes, checked with numpy instead of parsed ----------
_T1, _T2, _T3, _T4 = b'":{"dtype":"', b'","shape":[', b'],"data_offsets":[', b']},"'
_DIMS = re.compile(r"(?:(?:0|[1-9][0-9]*)(?:,(?:0|[1-9][0-9]*))*)?")
_COLS = np.arange(38)             # "begin,end" with at most 18 digits each
_POW10 = np.array([10**k for k in range(19)] + [0], dtype=np.int64)   # _POW10[-1] == 0
_JSON = json.JSONDecoder()


def _at(a, pos, lit):
    """True if the bytes `lit` sit at every position in `pos` of uint8 array `a`."""
    return bool((a[pos[:, None] + np.arange(len(lit))] == np.frombuffer(lit, np.uint8)).all())


def _parse_compact(h):
    """Columns of a header laid out exactly as `{"__metadata__":{…},"name":{"dtype":"F32","shape":[2,3],
    "data_offsets":[0,24]},…}` + space padding (ASCII, no escapes); None for any other layout."""
    try:
        s = h.decode("ascii")
    except UnicodeDecodeError:
        return None
    pos = 1
    if s.startswith('{"__metadata__":'):
        try:
            pos = _JSON.raw_decode(s, 16)[1] + 1
        except ValueError:
            return None
    end = len(s.rstrip(" "))
    a = np.frombuffer(h + b" " * 64, np.uint8)    # padded so windows never run off the end
    body = a[pos:end]
    if not s.startswith(("{", ","), pos - 1) or s[end - 3:end] != "]}}" or (body < 32).any() or (body == 92).any():
        return None
    q = np.flatnonzero(body == 34) + pos          # every '"'; ten per entry when there are no escapes
    n = len(q) // 10
    if n == 0 or len(q) != 10 * n or q[0] != pos:
        return None
    q0, q1, q4, q5, q8, q9 = (q[k::10] for k in (0, 1, 4, 5, 8, 9))
    if not (_at(a, q1, _T1) and _at(a, q5, _T2) and _at(a, q8 - 2, _T3) and _at(a, q0[1:] - 3, _T4)):
        return None
    # data_offsets "begin,end": digits parsed in place, [n, 38] windows
    first = q9 + 3
    ln = np.append(q0[1:] - 3, end - 3) - first
    w = a[first[:, None] + _COLS]
    comma = np.argmax(w == 44, axis=1)
    j, c, ln2 = _COLS[None, :], comma[:, None], ln[:, None]
    digit = (w >= 48) & (w <= 57)
    rows = np.arange(n)
    ok = (comma >= 1) & (comma <= 18) & (ln - comma >= 2) & (ln - comma <= 19)
    ok &= (digit | (j == c) | (j >= ln2)).all(axis=1)
    ok &= ~((w[:, 0] == 48) & (comma > 1)) & ~((w[rows, np.minimum(comma + 1, 37)] == 48) & (ln - comma > 2))
    if not ok.all():                              # leading zeros, other separators, > 18 digits
        return None
    d = w.astype(np.int64) - 48
    begin = (d * _POW10[np.where(j < c, c - 1 - j, -1)]).sum(axis=1)
    stop = (d * _POW10[np.where((j > c) & (j < ln2), ln2 - 1 - j, -1)]).sum(axis=1)
    # names and the distinct `DT","shape":[dims` strings
    names = [s[x + 1:y] for x, y in zip(q0.tolist(), q1.tolist())]
    kind_text = [s[x + 1:y] for x, y in zip(q4.tolist(), (q8 - 2).tolist())]
    ids = {k: i for i, k in enumerate(dict.fromkeys(kind_text))}
    kinds = []
    for k in ids:
        dt, _, dims = k.partition(_T2.decode())
        if not _DIMS.fullmatch(dims):
            return None
        kinds.append((dt, tuple(int(x) for x in dims.split(",")) if dims else ()))
    kind = np.fromiter(map(ids.__getitem__, kind_text), np.int64, n)
    return _Columns(names, kinds, kind, begin, stop)


# ---- reference path: json.loads and a check per entry ---------------------------------------------
class _Twice(Exception):
    pass


def _unique_pairs(pairs):
    d = dict(pairs)
    if len(d) != len(pairs):
        raise _Twice(next(k for i, (k, _) in enumerate(pairs) if k in dict(pairs[:i])))
    return d


def _ints(v):
    return isinstance(v, list) and all(type(x) is int and 0 <= x < _LIMIT for x in v)


def _parse_json(h, path):
    """Columns of any valid header, or CheckpointError naming what is wrong."""
    try:
        obj = json.loads(h.decode("utf-8"), object_pairs_hook=_unique_pairs)
    except UnicodeDecodeError:
        raise CheckpointError("header is not valid UTF-8", file=path) from None
    except _Twice as e:
        raise CheckpointError("header lists the same tensor twice", file=path, tensor=e.args[0]) from None
    except ValueError as e:
        raise CheckpointError(f"header is not valid JSON: {e}", file=path) from None
    if not isinstance(obj, dict):
        raise CheckpointError("header is not a JSON object", file=path)
    names, kinds, kind, begin, end = [], {}, [], [], []
    for name, e in obj.items():
        if name == "__metadata__":
            continue
        e = e if isinstance(e, dict) else {}
        dt, shape, offs = e.get("dtype"), e.get("shape"), e.get("data_offsets")
        if not (isinstance(dt, str) and _ints(shape) and _ints(offs) and len(offs) == 2):
            raise CheckpointError('entry is not {"dtype": str, "shape": [int >= 0, …], '
                                  '"data_offsets": [begin, end]}', file=path, tensor=name)
        names.append(name)
        kind.append(kinds.setdefault((dt, tuple(shape)), len(kinds)))
        begin.append(offs[0])
        end.append(offs[1])
    return _Columns(names, list(kinds), np.array(kind, np.int64), np.array(begin, np.int64), np.array(end, np.int64))


def _check_spans(c, path, data_len):
    """The rules both paths share: known dtype, begin <= end, span == numel × itemsize, inside the file."""
    need = np.empty(len(c.kinds), np.int64)
    for k, (dt, shape) in enumerate(c.kinds):
        if dt not in DTYPES:
            raise CheckpointError(f"unknown dtype {dt!r}", file=path, tensor=c.names[int(np.argmax(c.kind == k))])
        nbytes = math.prod(shape) * DTYPES[dt][0]
        need[k] = nbytes if nbytes < _LIMIT else -1
    need = need[c.kind]
    for bad, why in ((c.begin > c.end, lambda i: "data_offsets begin > end"),
                     (c.end - c.begin != need, lambda i: f"span of {c.end[i] - c.begin[i]} bytes, but "
                      f"{c.kinds[c.kind[i]][0]} {list(c.kinds[c.kind[i]][1])} needs {need[i]}"),
                     (c.end > data_len, lambda i: f"span ends at byte {c.end[i]} of a data region of {data_len}"
                      " (past end of file)")):
        if bad.any():
            i = int(np.argmax(bad))
            raise CheckpointError(why(i), file=path, tensor=c.names[i])


def _read_header(path):
    """(ShardFile, header bytes) from the first 8 + N bytes of `path`."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size < 8:
            raise CheckpointError(f"file of {size} bytes is too short for a safetensors header", file=path)
        n = int.from_bytes(os.pread(fd, 8, 0), "little")
        if n == 0 or 8 + n > size:
            raise CheckpointError(f"header length {n} is zero or runs past end of file ({size} bytes)", file=path)
        h = os.pread(fd, n, 8)
    finally:
        os.close(fd)
    if len(h) != n:
        raise CheckpointError("file shrank while reading its header", file=path)
    return ShardFile(path, size, n, hashlib.sha256(h).hexdigest()), h


# ---- model.safetensors.index.json -----------------------------------------------------------------
_WS = "[ \t\n\r]*"
_OPEN = re.compile(_WS + ":" + _WS + r"\{")
_COLON, _COMMA, _BLANK = (re.compile(_WS + x + _WS) for x in (":", ",", ""))


def _weight_map_compact(raw):
    """(names, files) of a weight_map whose entries are all formatted alike and hold no escapes, else None.
    Only the weight_map's strings are sliced out; the rest of the document goes through json.loads."""
    try:
        s = raw.decode("ascii")
    except UnicodeDecodeError:
        return None
    key = s.find('"weight_map"')
    m = _OPEN.match(s, key + 12) if key >= 0 and "\\" not in s else None
    if not m:
        return None
    a = np.frombuffer(raw, np.uint8)
    start = m.end()
    q = np.flatnonzero(a[start:] == 34) + start
    closes = np.flatnonzero(a[start:] == 125) + start
    outside = closes[np.searchsorted(q, closes) % 2 == 0]
    if not len(outside):
        return None
    stop = int(outside[0])                         # the '}' closing the weight_map
    q = q[q < stop]
    n = len(q) // 4
    if n == 0 or len(q) != 4 * n:
        return None
    q0, q1, q2, q3 = (q[k::4] for k in range(4))
    gaps = []
    for x, y, pat in ((q1, q2, _COLON), (q3[:-1], q0[1:], _COMMA)):   # between name and file; between entries
        if len(x) and not (np.all(y - x == y[0] - x[0]) and pat.fullmatch(s, x[0] + 1, y[0])
                           and _at(a, x + 1, raw[x[0] + 1:y[0]])):
            return None
        gaps.append(s[x[0] + 1:y[0]] if len(x) else "")
    edge = s[start:q0[0]] + s[q3[-1] + 1:stop]
    ctrl = sum(ch < " " for ch in edge) + n * sum(ch < " " for ch in gaps[0]) + (n - 1) * sum(ch < " " for ch in gaps[1])
    if not _BLANK.fullmatch(edge) or np.count_nonzero(a[start:stop] < 32) != ctrl:
        return None                                # a control character inside a string
    try:
        rest = json.loads(s[:start - 1] + "0" + s[stop + 1:])
    except ValueError:
        return None
    if not (isinstance(rest, dict) and type(rest.get("weight_map")) is int):
        return None
    names = [s[x + 1:y] for x, y in zip(q0.tolist(), q1.tolist())]
    files = [s[x + 1:y] for x, y in zip(q2.tolist(), q3.tolist())]
    return names, files


def _weight_map(path):
    raw = path.read_bytes()
    fast = _weight_map_compact(raw)
    if fast:
        return fast
    try:
        wm = json.loads(raw.decode("utf-8")).get("weight_map")
    except (ValueError, AttributeError) as e:
        raise CheckpointError(f"not a JSON object: {e}", file=path) from None
    if not (isinstance(wm, dict) and wm and all(isinstance(v, str) for v in wm.values())):
        raise CheckpointError('"weight_map" is missing, empty, or maps a tensor to a non-string', file=path)
    return list(wm), list(wm.values())


# ---- the index ------------------------------------------------------------------------------------
class ShardIndex:
    """Every tensor of a shard directory: name → file, dtype, shape and absolute byte span."""

    def __init__(self, directory, files, where, file_of, kinds, kind, offset, nbytes):
        self.directory, self.files, self._where = directory, files, where   # where: name → row
        self._file_of, self._kinds, self._kind = file_of, kinds, kind       # per row, as columns
        self._offset, self._nbytes, self._maps = offset, nbytes, {}

    @classmethod
    def open(cls, directory):
        """Index `directory`: the shards its model.safetensors.index.json lists, else every *.safetensors."""
        directory = Path(directory).resolve()
        if not directory.is_dir():
            raise CheckpointError("checkpoint directory does not exist", file=directory)
        index_path, wm = directory / INDEX_JSON, None
        if index_path.is_file():
            wm = _weight_map(index_path)
            listed = sorted(set(wm[1]), key=lambda f: Path(f).name)
            for f in listed:
                if not (directory / f).is_file():
                    raise CheckpointError(f"shard listed in {INDEX_JSON} does not exist", file=directory / f)
            paths = [directory / f for f in listed]
        else:
            paths = sorted(directory.glob("*.safetensors"), key=lambda p: p.name)
        if not paths:
            raise CheckpointError(f"no *.safetensors shards and no {INDEX_JSON}", file=directory)
        files, where, parts, kinds = [], {}, [], {}
        for path in paths:
            shard, h = _read_header(path)
            c = _parse_compact(h) or _parse_json(h, path)
            _check_spans(c, path, shard.size - 8 - shard.header_len)
            base = len(where)
            where.update(zip(c.names, range(base, base + len(c.names))))
            if len(where) != base + len(c.names):
                cls._raise_duplicate(paths, parts, c, path)
            remap = np.array([kinds.setdefault(k, len(kinds)) for k in c.kinds], np.int32)
            files.append(shard)
            parts.append((c, remap[c.kind], c.begin + 8 + shard.header_len))
        index = cls(directory, files, where,
                    np.repeat(np.arange(len(files), dtype=np.int32), [len(c.names) for c, _, _ in parts]),
                    list(kinds), np.concatenate([k for _, k, _ in parts]), np.concatenate([o for _, _, o in parts]),
                    np.concatenate([c.end - c.begin for c, _, _ in parts]))
        if wm:
            index._check_weight_map(index_path, *wm, {f: i for i, f in enumerate(listed)})
        return index

    @staticmethod
    def _raise_duplicate(paths, parts, c, path):
        earlier = {name: paths[i] for i, (p, _, _) in enumerate(parts) for name in p.names}
        name = next((n for n in c.names if n in earlier), None)
        if name is not None:
            raise CheckpointError(f"tensor is in two shards: {earlier[name].name} and {path.name}", file=path, tensor=name)
        seen = set()
        name = next(n for n in c.names if n in seen or seen.add(n))
        raise CheckpointError("header lists the same tensor twice", file=path, tensor=name)

    def _check_weight_map(self, index_path, names, wfiles, fid):
        """Every weight_map entry names the shard whose header holds it, and every tensor has one."""
        rows = np.fromiter(map(self._where.get, names, [-1] * len(names)), np.int64, len(names))
        want = np.fromiter(map(fid.__getitem__, wfiles), np.int64, len(names))
        have = np.where(rows >= 0, self._file_of[rows], -1)
        if (have != want).any():
            i = int(np.argmax(have != want))
            found = f"its header is in {self.files[have[i]].path.name}" if have[i] >= 0 else "no shard header lists it"
            raise CheckpointError(f"{INDEX_JSON} assigns it to {wfiles[i]}, but {found}", file=index_path, tensor=names[i])
        covered = np.zeros(len(self), bool)
        covered[rows] = True
        if not covered.all():
            row = int(np.argmin(covered))
            name = next(n for n, r in self._where.items() if r == row)
            raise CheckpointError(f"tensor is missing from {INDEX_JSON}", file=self.files[self._file_of[row]].path, tensor=name)

    def __contains__(self, name):
        return name in self._where

    def __len__(self):
        return len(self._where)

    def names(self):
        return iter(self._where)

    def __getitem__(self, name):
        row = self._where.get(name)
        if row is None:
            raise CheckpointError(f"no such tensor in {self.directory}", file=self.directory, tensor=name)
        dtype, shape = self._kinds[self._kind[row]]
        return TensorInfo(name, self.files[self._file_of[row]].path, dtype, shape,
                          int(self._offset[row]), int(self._nbytes[row]))

    def _map(self, path):
        mm = self._maps.get(path)
        if mm is None:
            with open(path, "rb") as f:
                mm = self._maps[path] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return mm

    def read(self, name):
        """The tensor as a read-only array viewing the mapped file (BF16 as uint16 bits); no other span is touched."""
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
            except BufferError:       # arrays from read() still view it; unmapped when they go
                pass
        self._maps.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
