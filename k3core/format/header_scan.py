"""The fast path of the safetensors index: headers and index json in the layout the safetensors and
Hugging Face writers produce, checked in place with numpy instead of json.loads (MODEL.md §6 asks for
497,220 tensors in well under a second). Anything not in that exact layout returns None, and the
json.loads path in safetensors_index decides; tests/format/test_safetensors_index.py holds both to one answer.
"""
import json
import re
from typing import NamedTuple

import numpy as np

from ..files.limits import MAX_JSON_DEPTH, nesting_depth

# ---- bytes as numpy: words[i] is the little-endian u64 of the 8 bytes at offset i ----------------
_U = np.uint64
_M, _MASK = _U(0x9E3779B97F4A7C15), np.array([(1 << 8 * r) - 1 for r in range(9)], np.uint64)


def word_view(buf):
    """Every 8-byte window of `buf` as one u64; `buf` must end in 8 spare bytes."""
    return np.ndarray((len(buf) - 7,), "<u8", buf, 0, (1,))


def mix(h):
    h = (h ^ (h >> _U(31))) * _M
    return h ^ (h >> _U(29))


_R = (mix(np.arange(1, 8193, dtype=np.uint64) * _M) | _U(1)).reshape(4096, 2)   # odd, per word and seed


def _at(words, checks):
    """True if, for every (positions, literal) in `checks`, the literal's bytes start at every position."""
    pos, want, mask = [], [], []
    for p, lit in checks:
        for k in range(0, len(lit), 8):
            pos.append(p + k)
            want.append(int.from_bytes(lit[k:k + 8], "little"))
            mask.append(_MASK[len(lit[k:k + 8])])
    if not pos:
        return True
    rep = [len(p) for p in pos]
    got = words[np.concatenate(pos)] & np.repeat(np.array(mask, np.uint64), rep)
    return not (got ^ np.repeat(np.array(want, np.uint64), rep)).any()


def fingerprints(words, start, stop, chunk=16384):
    """Two independent 64-bit hashes of each span [start, stop), shape (2, n): Σ_k R_k·g(w_k) over its
    8-byte words w_k, g a bijection with g(0) = 0 (so zero padding adds nothing), then the length mixed in.
    Equal bytes give equal hashes; different bytes the same pair with probability ~2^-128."""
    out, last = [np.empty((2, 0), np.uint64)], len(words) - 1
    for i in range(0, len(start), chunk):  # chunks keep the temporaries in cache
        s, e = start[i:i + chunk], stop[i:i + chunk]
        n, h = e - s, np.zeros((2, len(s)), np.uint64)
        short, longest, far = int(n.min(initial=0)), int(n.max(initial=0)), int(s.max(initial=0))
        for k in range(0, longest, 8):
            w = words[s + k if far + k <= last else np.minimum(s + k, e)]   # rows past their end: masked
            if k + 8 > short:
                w &= _MASK[np.minimum(np.maximum(n - k, 0), 8)]
            g = w * _M
            h += (g ^ (g >> _U(32))) * _R[k // 8 % len(_R), :, None]
        out.append(mix(h ^ n.astype(np.uint64)))
    return np.concatenate(out, axis=1)


_ZERO, _LO, _HI, _SIX = (_U(0x0101010101010101 * b) for b in (0x30, 0x0F, 0xF0, 0x06))
_TOP = np.array([((1 << 8 * r) - 1) << (64 - 8 * r) for r in range(9)], np.uint64)   # the top r bytes
_FILL = _ZERO & ~_TOP                                                             # '0' in the others


def _numbers(words, a, first, stop):
    """The decimal integers at [first, stop) -- 1..16 digits, no leading zero, first >= 8 -- or None if
    any is not one. Each is read right-aligned from the 8-byte words ending at its last digit."""
    n = stop - first
    if not len(n) or first.min() < 8 or n.min() < 1 or n.max() > 16 or ((a[first] == 48) & (n > 1)).any():
        return None
    value = np.zeros(len(n), np.uint64)
    for k, scale in ((8, 1), (16, 10**8)):      # the last eight digits, then the eight before them
        r = np.minimum(np.maximum(n - (k - 8), 0), 8)
        x = (words[np.maximum(stop - k, 0)] & _TOP[r]) | _FILL[r]      # bytes left of the number: '0'
        if (((x & _HI) ^ _ZERO) | (((x + _SIX) & _HI) ^ _ZERO)).any():
            return None                                                  # a byte that is not a digit
        v = x & _LO                                                      # eight digits, first in byte 0
        v = v * _U(10) + (v >> _U(8))                                    # pairs, then quads, then all 8
        v = ((v & _U(0xFF000000FF)) * _U(100 + (10**6 << 32)) + ((v >> _U(16)) & _U(0xFF000000FF))
             * _U(1 + (10**4 << 32))) >> _U(32)
        value += v * _U(scale)
    return value.astype(np.int64)


# ---- one header as columns --------------------------------------------------------------------
class Table(NamedTuple):
    """One header's tensors, in header order; each name is the UTF-8 span blob[start:stop]."""
    blob: bytes | bytearray
    start: np.ndarray
    stop: np.ndarray
    kinds: list                                 # the distinct (dtype, shape) pairs
    kind: np.ndarray                            # per tensor: index into kinds
    begin: np.ndarray                           # per tensor: data_offsets, relative to byte 8 + N
    end: np.ndarray

    def name(self, i):
        return bytes(self.blob[self.start[i]:self.stop[i]]).decode()

    def names(self):
        pairs = zip(self.start.tolist(), self.stop.tolist())
        if not self.blob.isascii():             # byte offsets are not str offsets
            return [bytes(self.blob[x:y]).decode() for x, y in pairs]
        s = self.blob.decode("ascii")
        return [s[x:y] for x, y in pairs]


def string_blob(strings):
    """(blob, start, stop) holding `strings` as UTF-8 spans, with 8 spare bytes."""
    enc = [x.encode() for x in strings]
    size = np.array([len(e) for e in enc], np.int64)
    return b"".join(enc) + bytes(8), np.cumsum(size) - size, np.cumsum(size)


def fp_of(strings):
    blob, start, stop = string_blob(strings)
    return fingerprints(word_view(blob), start, stop)


_T1, _T2, _T3, _T4 = b'":{"dtype":"', b'","shape":[', b'],"data_offsets":[', b']},"'
_DIMS = re.compile(r"(?:(?:0|[1-9][0-9]*)(?:,(?:0|[1-9][0-9]*))*)?")
_JSON = json.JSONDecoder()


def metadata_ok(meta) -> bool:
    """A header's "__metadata__" is what the safetensors format allows: an object of string -> string."""
    return isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())


def parse_compact(buf, size):
    """Columns of a header written exactly as the safetensors library writes it -- `{"__metadata__":{…},
    "name":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},…}`, space padded, ASCII, no escapes --
    found from the positions of its quotes; None for anything else (then json.loads decides)."""
    pos, end = 1, size
    while end > 0 and buf[end - 1] == 32:
        end -= 1
    if buf.startswith(b'{"__metadata__":'):
        head = bytes(buf[:min(size, 4096)])
        if nesting_depth(head) > MAX_JSON_DEPTH:
            return None                          # json.loads would recurse: the json path refuses it
        try:
            meta, pos = _JSON.raw_decode(head.decode("ascii") if head.isascii() else "", 16)
        except ValueError:
            return None
        if not metadata_ok(meta):
            return None                          # the json path names the field
        pos += 1
    a, words = np.frombuffer(buf, np.uint8), word_view(buf)
    body = a[pos:end]
    if (buf[pos - 1] not in b"{," or buf[end - 3:end] != b"]}}" or buf.find(b'"__metadata__"', pos, end) >= 0
            or ((body - 32) > 95).any() or (body == 92).any()):
        return None                              # another layout, or a control, non-ASCII or escape byte
    q = np.flatnonzero(body == 34) + pos        # every '"': ten per entry
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
    fp = fingerprints(words, k0, k1)
    _, rep, kind = np.unique(fp[0], return_index=True, return_inverse=True)
    if (fp[1] != fp[1, rep][kind]).any():
        return None                              # two kinds share half a fingerprint: let json decide
    kinds = []
    for r in rep:
        dt, _, dims = bytes(buf[k0[r]:k1[r]]).decode().partition(_T2.decode())
        if not _DIMS.fullmatch(dims):
            return None
        kinds.append((dt, tuple(int(x) for x in dims.split(",")) if dims else ()))
    return Table(buf, q0 + 1, q1, kinds, kind.ravel(), offsets[:n], offsets[n:])



class WeightMap(NamedTuple):
    fp: np.ndarray                              # (2, n): per entry, a fingerprint of (name, file)
    files: list[str]                            # the distinct shard files it names


def pair(name_fp, file_fp):
    return mix(name_fp ^ mix(file_fp))


_WS = "[ \t\n\r]*"
_OPEN = re.compile(_WS + ":" + _WS + r"\{")
_COLON, _COMMA, _BLANK = (re.compile(_WS + x + _WS) for x in (":", ",", ""))


def _find(a, lo, hi, test, chunk=1 << 20):
    """Positions i in [lo, hi) where test(a[i]), scanned in chunks so no temporary is as large as `a`."""
    return np.concatenate([np.empty(0, np.int64)] + [np.flatnonzero(test(a[i:min(i + chunk, hi)])) + i
                                                     for i in range(lo, hi, chunk)])


def weight_map_compact(raw):
    """The weight_map of an index json (`raw` + 8 spare bytes) in which every entry is formatted alike
    and nothing is escaped, its strings fingerprinted where they lie; None otherwise. The rest of the
    document, with the weight_map cut out, goes through json.loads."""
    key = raw.find(b'"weight_map"') + 12
    m = _OPEN.match(raw[key:key + 256].decode()) if key >= 12 and raw.isascii() and b"\\" not in raw else None
    if not m:
        return None
    a, words, start = np.frombuffer(raw, np.uint8), word_view(raw), key + m.end()
    q = _find(a, start, len(a), lambda x: x == 34)
    stop = raw.find(b"}", start)                 # the weight_map ends at the first '}' outside a string
    while stop >= 0 and np.searchsorted(q, stop) % 2:
        stop = raw.find(b"}", stop + 1)
    q = q[q < stop]
    n = len(q) // 4
    if n == 0 or len(q) != 4 * n:
        return None
    q0, q1, q2, q3 = (q[k::4] for k in range(4))   # "name" : "file" ,
    ctrl = len(_find(a, q0[0], q3[-1], lambda x: x < 32))
    for x, y, pat in ((q1, q2, _COLON), (q3[:-1], q0[1:], _COMMA)):
        gap = raw[x[0] + 1:y[0]] if len(x) else b""
        alike = len(x) and np.all(y - x == y[0] - x[0]) and _at(words, ((x + 1, gap),))
        if len(x) and not (alike and pat.fullmatch(gap.decode())):
            return None
        ctrl -= len(x) * sum(c < 32 for c in gap)
    if ctrl or not _BLANK.fullmatch(raw[start:q0[0]].decode() + raw[q3[-1] + 1:stop].decode()):
        return None                              # a control character inside a string, or junk at the edges
    rest_text = raw[:start - 1].decode() + "0" + raw[stop + 1:-8].decode()
    if nesting_depth(rest_text) > MAX_JSON_DEPTH:
        return None                              # json.loads would recurse: the json path refuses it
    try:
        rest = json.loads(rest_text)
    except ValueError:
        return None
    if not (isinstance(rest, dict) and type(rest.get("weight_map")) is int):
        return None                              # what we cut out was not the weight_map json.loads sees
    file_fp = fingerprints(words, q2 + 1, q3)
    runs = np.flatnonzero(np.append(True, (file_fp[:, 1:] != file_fp[:, :-1]).any(axis=0)))
    files = {tuple(file_fp[:, r]): raw[q2[r] + 1:q3[r]].decode() for r in runs.tolist()}
    if len(set(files.values())) != len(files):
        return None
    return WeightMap(pair(fingerprints(words, q0 + 1, q1), file_fp), sorted(set(files.values())))
