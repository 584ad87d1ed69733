"""Header-only index of a directory of safetensors shards (SPEC §6): name → file, dtype, shape, span.

`open` reads each shard's 8-byte length and JSON header and nothing else, and raises CheckpointError
naming file and tensor for every SPEC §6 rule. It does not convert dtypes (BF16 stays uint16 bits)
or cache tensors; `read` maps one span on demand. Headers laid out as safetensors writes them are
checked with numpy, anything else through json.loads; tests/test_safetensors_index.py runs both paths.
"""
import hashlib
import json
import math
import mmap
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from k3core.errors import CheckpointError

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


# ---- byte spans as numpy: `words[i]` is the little-endian u64 of the 8 bytes at offset i ----------
_U = np.uint64
_M, _MASK = _U(0x9E3779B97F4A7C15), np.array([(1 << 8 * r) - 1 for r in range(9)], np.uint64)
_R = np.random.default_rng(0x6B33).integers(0, 2**64, (4096, 2), np.uint64, endpoint=False) | _U(1)


def _words(buf):
    """Every 8-byte window of `buf` (which must end in 8 spare bytes) as one u64."""
    return np.ndarray((len(buf) - 7,), "<u8", buf, 0, (1,))


def _at(words, checks):
    """True if, for every (positions, literal) in `checks`, the literal's bytes start at every position."""
    pos, want, mask = [], [], []
    for p, lit in checks:
        for k in range(0, len(lit), 8):
            chunk = lit[k:k + 8]
            pos.append(p + k)
            want.append(np.full(len(p), int.from_bytes(chunk, "little"), np.uint64))
            mask.append(np.full(len(p), _MASK[len(chunk)]))
    return not ((words[np.concatenate(pos)] & np.concatenate(mask)) ^ np.concatenate(want)).any()


def _mix(h):
    h = (h ^ (h >> _U(31))) * _M
    return h ^ (h >> _U(29))


def _fingerprints(words, start, stop, chunk=16384):
    """Two independent 64-bit hashes of each span [start, stop), shape (2, n); equal bytes, equal hashes.
    Each word w_k is scrambled by a bijection g with g(0) = 0 and summed as Σ R_k·g(w_k), so zero
    padding past a span's end adds nothing; the length is mixed in last."""
    out, last = [np.empty((2, 0), np.uint64)], len(words) - 1
    for i in range(0, len(start), chunk):
        s, e = start[i:i + chunk], stop[i:i + chunk]
        n, h = e - s, np.zeros((2, len(s)), np.uint64)
        short, longest, far = int(n.min(initial=0)), int(n.max(initial=0)), int(s.max(initial=0))
        for k in range(0, longest, 8):
            w = words[s + k if far + k <= last else np.minimum(s + k, e)]   # rows past their end: masked
            if k + 8 > short:
                w &= _MASK[np.clip(n - k, 0, 8)]
            g = w * _M
            h += (g ^ (g >> _U(32))) * _R[k // 8 % len(_R), :, None]
        out.append(_mix(h ^ n.astype(np.uint64)))
    return np.concatenate(out, axis=1)


def _same(words, start, stop, start2, stop2):
    """Per pair, whether span [start, stop) and span [start2, stop2) hold the same bytes."""
    n, last = stop - start, len(words) - 1
    eq = n == stop2 - start2
    for k in range(0, int(n.max(initial=0)), 8):
        m = _MASK[np.clip(n - k, 0, 8)]
        eq &= (words[np.minimum(start + k, last)] & m) == (words[np.minimum(start2 + k, last)] & m)
    return eq


_ZERO, _LO, _HI, _SIX = (_U(0x0101010101010101 * b) for b in (0x30, 0x0F, 0xF0, 0x06))
_TOP = np.array([((1 << 8 * r) - 1) << (64 - 8 * r) for r in range(9)], np.uint64)   # the top r bytes
_FILL = _ZERO & ~_TOP                                                             # '0' in the others


def _numbers(words, a, first, stop):
    """The decimal integers at [first, stop) (1..16 digits, no leading zero), or None if any is not one."""
    n = stop - first
    if not len(n) or n.min() < 1 or n.max() > 16 or ((a[first] == 48) & (n > 1)).any():
        return None
    value = np.zeros(len(n), np.uint64)
    for k, scale in ((8, 1), (16, 10**8)):      # the last eight digits, then the eight before them
        r = np.clip(n - (k - 8), 0, 8)
        x = (words[np.maximum(stop - k, 0)] & _TOP[r]) | _FILL[r]      # right-aligned, '0'-filled
        if (((x & _HI) ^ _ZERO) | (((x + _SIX) & _HI) ^ _ZERO)).any():
            return None                                                  # a byte that is not a digit
        v = x & _LO                                                      # eight digits, first in byte 0
        v = v * _U(10) + (v >> _U(8))
        v = ((v & _U(0xFF000000FF)) * _U(100 + (10**6 << 32)) + ((v >> _U(16)) & _U(0xFF000000FF)) * _U(1 + (10**4 << 32))) >> _U(32)
        value += v * _U(scale)
    return value.astype(np.int64)


class _Table(NamedTuple):
    """One header's tensors as columns; each name is the UTF-8 span blob[start:stop]."""
    blob: bytes | bytearray
    start: np.ndarray
    stop: np.ndarray
    kinds: list                                 # the distinct (dtype, shape) pairs
    kind: np.ndarray                            # per tensor: index into kinds
    begin: np.ndarray                           # per tensor: data_offsets, relative to byte 8 + N
    end: np.ndarray

    def name(self, i):
        return bytes(self.blob[self.start[i]:self.stop[i]]).decode("utf-8")

    def names(self):
        s = self.blob.decode("utf-8", "replace") if self.blob.isascii() else None
        pairs = zip(self.start.tolist(), self.stop.tolist())
        return [s[x:y] for x, y in pairs] if s is not None else [self.blob[x:y].decode() for x, y in pairs]


def _blob(names):
    """(blob, start, stop) holding `names` as UTF-8 spans, padded with 8 spare bytes."""
    enc = [n.encode("utf-8") for n in names]
    stop = np.cumsum([len(e) for e in enc], dtype=np.int64)
    return b"".join(enc) + bytes(8), stop - np.array([len(e) for e in enc], np.int64), stop


# ---- headers: the layout safetensors writes, checked in place -------------------------------------
_T1, _T2, _T3, _T4 = b'":{"dtype":"', b'","shape":[', b'],"data_offsets":[', b']},"'
_DIMS = re.compile(r"(?:(?:0|[1-9][0-9]*)(?:,(?:0|[1-9][0-9]*))*)?")
_JSON = json.JSONDecoder()


def _parse_compact(buf, size):
    """Columns of a header that is exactly `{"__metadata__":{…},"name":{"dtype":"F32","shape":[2,3],
    "data_offsets":[0,24]},…}` plus space padding, ASCII without escapes; else None (use json)."""
    pos, end = 1, size
    while end > 0 and buf[end - 1] == 32:
        end -= 1
    if buf.startswith(b'{"__metadata__":'):
        head = bytes(buf[:min(size, 4096)])
        try:
            pos = _JSON.raw_decode(head.decode("ascii") if head.isascii() else "", 16)[1] + 1
        except ValueError:
            return None
    a, words = np.frombuffer(buf, np.uint8), _words(buf)
    body = a[pos:end]
    if buf[pos - 1] not in b"{," or buf[end - 3:end] != b"]}}" or ((body - 32) > 95).any() or (body == 92).any():
        return None                              # not this layout, or a control, non-ASCII or escape byte
    q = np.flatnonzero(body == 34) + pos        # every '"': ten per entry when nothing is escaped
    n = len(q) // 10
    if n == 0 or len(q) != 10 * n or q[0] != pos:
        return None
    q0, q1, q4, q5, q8, q9 = (q[k::10] for k in (0, 1, 4, 5, 8, 9))
    if not _at(words, ((q1, _T1), (q5, _T2), (q8 - 2, _T3), (q0[1:] - 3, _T4))):
        return None
    commas = np.flatnonzero(body == 44) + pos
    first, last = q9 + 3, np.append(q0[1:] - 3, end - 3)   # "begin,end" sits in [first, last)
    comma = commas[np.minimum(np.searchsorted(commas, first), len(commas) - 1)]
    offsets = _numbers(words, a, np.concatenate([first, comma + 1]), np.concatenate([comma, last]))
    if offsets is None:
        return None
    k0, k1 = q4 + 1, q8 - 2                      # kind span: DT","shape":[dims
    _, rep, kind = np.unique(_fingerprints(words, k0, k1)[0], return_index=True, return_inverse=True)
    if not _same(words, k0, k1, k0[rep][kind], k1[rep][kind]).all():
        return None                              # two kinds with one fingerprint: let json decide
    kinds = []
    for r in rep:
        dt, _, dims = bytes(buf[k0[r]:k1[r]]).decode().partition(_T2.decode())
        if not _DIMS.fullmatch(dims):
            return None
        kinds.append((dt, tuple(int(x) for x in dims.split(",")) if dims else ()))
    return _Table(buf, q0 + 1, q1, kinds, kind.ravel(), offsets[:n], offsets[n:])


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
    """Columns of any valid header (the reference for _parse_compact), or CheckpointError."""
    try:
        obj = json.loads(bytes(h).decode("utf-8"), object_pairs_hook=_unique_pairs)
    except UnicodeDecodeError:
        raise CheckpointError("header is not valid UTF-8", file=path) from None
    except _Twice as e:
        raise CheckpointError("header lists the same tensor twice", file=path, tensor=e.args[0]) from None
    except ValueError as e:
        raise CheckpointError(f"header is not valid JSON: {e}", file=path) from None
    if not isinstance(obj, dict):
        raise CheckpointError("header is not a JSON object", file=path)
    names, kinds, kind, offsets = [], {}, [], []
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
        offsets.append(offs)
    offsets = np.array(offsets, np.int64).reshape(-1, 2)
    return _Table(*_blob(names), list(kinds), np.array(kind, np.int64), offsets[:, 0], offsets[:, 1])


def _check_spans(t, path, data_len):
    """The rules both paths share: known dtype, begin <= end, span = numel × itemsize, inside the file."""
    need = np.empty(len(t.kinds), np.int64)
    for k, (dt, shape) in enumerate(t.kinds):
        if dt not in DTYPES:
            raise CheckpointError(f"unknown dtype {dt!r}", file=path, tensor=t.name(int(np.argmax(t.kind == k))))
        nbytes = math.prod(shape) * DTYPES[dt][0]
        need[k] = nbytes if nbytes < _LIMIT else -1
    need = need[t.kind]
    for bad, why in ((t.begin > t.end, lambda i: f"data_offsets [{t.begin[i]}, {t.end[i]}] run backwards"),
                     (t.end - t.begin != need, lambda i: f"span of {t.end[i] - t.begin[i]} bytes, but {t.kinds[t.kind[i]][0]} "
                                                         f"{list(t.kinds[t.kind[i]][1])} needs {need[i]}"),
                     (t.end > data_len, lambda i: f"span ends at data byte {t.end[i]}, past end of file "
                                                  f"(data region holds {data_len})")):
        if bad.any():
            i = int(np.argmax(bad))
            raise CheckpointError(why(i), file=path, tensor=t.name(i))


def _read_header(path):
    """(ShardFile, buffer holding the N header bytes then 64 spare bytes)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size < 8:
            raise CheckpointError(f"file of {size} bytes is too short for a safetensors header", file=path)
        n = int.from_bytes(os.pread(fd, 8, 0), "little")
        if n == 0 or 8 + n > size:
            raise CheckpointError(f"header length {n} is zero or runs past end of file ({size} bytes)", file=path)
        buf = bytearray(n + 64)
        got = os.preadv(fd, [memoryview(buf)[:n]], 8)
    finally:
        os.close(fd)
    if got != n:
        raise CheckpointError("file shrank while its header was read", file=path)
    return ShardFile(path, size, n, hashlib.sha256(memoryview(buf)[:n]).hexdigest()), buf


# ---- model.safetensors.index.json ----------------------------------------------------------------
class _WeightMap(NamedTuple):
    fp: np.ndarray                              # (2, n): per entry, a fingerprint of (name, file)
    files: list[str]                            # the distinct shard files it names


def _pair(name_fp, file_fp):
    return _mix(name_fp ^ _mix(file_fp))


_WS = "[ \t\n\r]*"
_OPEN = re.compile(_WS + ":" + _WS + r"\{")
_COLON, _COMMA, _BLANK = (re.compile(_WS + x + _WS) for x in (":", ",", ""))


def _weight_map_compact(raw):
    """The weight_map of an index (`raw` + 8 spare bytes) whose entries are all formatted alike, ASCII
    without escapes; else None.
    Its strings stay in place as spans; the rest of the document goes through json.loads."""
    key = raw.find(b'"weight_map"') + 12
    m = _OPEN.match(raw[key:key + 256].decode()) if key >= 12 and raw.isascii() and b"\\" not in raw else None
    if not m:
        return None
    a, words, start = np.frombuffer(raw, np.uint8), _words(raw), key + m.end()
    q = np.flatnonzero(a[start:] == 34) + start
    stop = raw.find(b"}", start)                 # the weight_map ends at the first '}' outside a string
    while stop >= 0 and np.searchsorted(q, stop) % 2:
        stop = raw.find(b"}", stop + 1)
    q = q[q < stop]
    n = len(q) // 4
    if n == 0 or len(q) != 4 * n:
        return None
    q0, q1, q2, q3 = (q[k::4] for k in range(4))
    ctrl = np.count_nonzero(a[start:stop] < 32) - np.count_nonzero(a[start:q0[0]] < 32) - np.count_nonzero(a[q3[-1]:stop] < 32)
    for x, y, pat in ((q1, q2, _COLON), (q3[:-1], q0[1:], _COMMA)):   # name-to-file gaps, entry-to-entry gaps
        gap = raw[x[0] + 1:y[0]] if len(x) else b""
        if len(x) and not (np.all(y - x == y[0] - x[0]) and pat.fullmatch(gap.decode()) and _at(words, ((x + 1, gap),))):
            return None
        ctrl -= len(x) * sum(c < 32 for c in gap)
    if ctrl or not _BLANK.fullmatch(raw[start:q0[0]].decode() + raw[q3[-1] + 1:stop].decode()):
        return None                              # a control character inside a string, or junk at the edges
    try:
        rest = json.loads(raw[:start - 1].decode() + "0" + raw[stop + 1:-8].decode())
    except ValueError:
        return None
    if not (isinstance(rest, dict) and type(rest.get("weight_map")) is int):
        return None
    file_fp = _fingerprints(words, q2 + 1, q3)
    runs = np.flatnonzero(np.append(True, (file_fp[:, 1:] != file_fp[:, :-1]).any(axis=0)))
    files = {tuple(file_fp[:, r]): raw[q2[r] + 1:q3[r]].decode() for r in runs.tolist()}
    if len(set(files.values())) != len(files):
        return None
    return _WeightMap(_pair(_fingerprints(words, q0 + 1, q1), file_fp), sorted(set(files.values())))


def _weight_map(path):
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        raw = bytearray(size + 8)
        f.readinto(memoryview(raw)[:size])
    fast = _weight_map_compact(raw)
    if fast:
        return fast
    try:
        wm = json.loads(raw[:-8].decode("utf-8")).get("weight_map")
    except (ValueError, AttributeError) as e:
        raise CheckpointError(f"not a JSON object: {e}", file=path) from None
    if not (isinstance(wm, dict) and wm and all(isinstance(v, str) for v in wm.values())):
        raise CheckpointError('"weight_map" is missing, empty, or maps a tensor to a non-string', file=path)
    blob, start, stop = _blob(list(wm))
    files = sorted(set(wm.values()))
    fps = {f: _fingerprints(_words(f.encode() + bytes(8)), np.array([0]), np.array([len(f.encode())]))[:, 0] for f in files}
    return _WeightMap(_pair(_fingerprints(_words(blob), start, stop), np.array([fps[f] for f in wm.values()]).T), files)


# ---- the index ------------------------------------------------------------------------------------
class ShardIndex:
    """Every tensor of a shard directory: name → file, dtype, shape and absolute byte span.
    Rows are numpy columns; the name → row dict is built on the first lookup by name."""

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
        with ThreadPoolExecutor(2) as pool:     # headers are read and hashed while the index is parsed
            ahead = {p.name: pool.submit(_read_header, p) for p in sorted(directory.glob("*.safetensors"))}
            if index_path.is_file():
                wm = _weight_map(index_path)
                listed = sorted(wm.files, key=lambda f: Path(f).name)
                for f in listed:
                    if not (directory / f).is_file():
                        raise CheckpointError(f"shard named in {INDEX_JSON} does not exist", file=directory / f)
            else:
                listed = list(ahead)
            if not listed:
                raise CheckpointError(f"no *.safetensors shards and no {INDEX_JSON}", file=directory)
            files, tables, kinds, parts, fps = [], [], {}, [], []
            for f in listed:
                shard, buf = (ahead[f] if f in ahead else pool.submit(_read_header, directory / f)).result()
                t = _parse_compact(buf, shard.header_len) or _parse_json(memoryview(buf)[:shard.header_len], shard.path)
                _check_spans(t, shard.path, shard.size - 8 - shard.header_len)
                remap = np.array([kinds.setdefault(k, len(kinds)) for k in t.kinds], np.int32)
                files.append(shard)
                tables.append(t)
                parts.append((remap[t.kind], t.begin + 8 + shard.header_len, t.end - t.begin))
                fps.append(_fingerprints(_words(t.blob), t.start, t.stop))
        index = cls(directory, files, tables, list(kinds), *(np.concatenate(c) for c in zip(*parts)))
        name_fp = np.concatenate(fps, axis=1)
        index._check_unique(name_fp[0])
        if wm is not None:
            file_fp = [_fingerprints(_words(f.encode() + bytes(8)), np.array([0]), np.array([len(f.encode())])) for f in listed]
            here = sum(_pair(fp, ffp).sum(axis=1) for fp, ffp in zip(fps, file_fp))
            if len(wm.fp[0]) != len(index) or (here != wm.fp.sum(axis=1)).any():
                index._explain_weight_map(index_path, listed)
        return index

    def _name(self, row):
        f = int(self._file_of[row])
        return self._tables[f].name(row - int(np.searchsorted(self._file_of, f)))

    def _check_unique(self, fp):
        """No name twice: equal fingerprints are candidates, compared as strings."""
        srt = np.sort(fp)
        if not (srt[1:] == srt[:-1]).any():
            return
        order = np.argsort(fp, kind="stable")
        for i in np.flatnonzero(fp[order][1:] == fp[order][:-1]):
            a, b = int(order[i]), int(order[i + 1])
            if self._name(a) == self._name(b):
                fa, fb = (self.files[self._file_of[r]].path for r in (a, b))
                raise CheckpointError("header lists the same tensor twice" if fa == fb else
                                      f"tensor is in two shards: {fa.name} and {fb.name}", file=fb, tensor=self._name(b))

    def _explain_weight_map(self, index_path, listed):
        """The fingerprints disagree: find the first entry that does, exactly, and say which."""
        wm = json.loads(index_path.read_bytes())["weight_map"]
        here = {n: f for f, t in zip(listed, self._tables) for n in t.names()}
        for name, f in wm.items():
            h = here.pop(name, None)
            if h != f:
                found = f"its header is in {h}" if h else "no shard header lists it"
                raise CheckpointError(f"{INDEX_JSON} assigns it to {f}, but {found}", file=index_path, tensor=name)
        for name, f in here.items():
            raise CheckpointError(f"tensor is missing from {INDEX_JSON}", file=self.directory / f, tensor=name)

    @property
    def _rows(self):
        if self._where is None:
            where = {}
            for t in self._tables:
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
        row = self._rows.get(name)
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
