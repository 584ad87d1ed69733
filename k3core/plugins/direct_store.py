"""The `direct` expert store: read each selected expert from its shard every time it is used.

One positioned read per expert when its six tensors form one gap-free run (as in the released
shards, checked from the headers), else six. A short read is an error, never zeros.
"""
from __future__ import annotations

import os
import time

import numpy as np

from ..checkpoint import EXPERT_PARTS, expert_prefix
from ..errors import UnsoundRunError
from ..hookspecs import hookimpl
from ..interfaces import ExpertStore, ExpertWeights


class DirectStore(ExpertStore):
    name = "direct"
    description = "read the selected experts from disk on every use; no cache"

    def __init__(self, checkpoint, config, options):
        super().__init__(checkpoint, config, options)
        self._fds: dict = {}
        self._layouts: dict = {}
        self.requests = self.bytes_read = 0
        self.read_seconds = 0.0

    def _layout(self, layer: int, expert: int):
        """The reads for one expert: [(file, offset, length, [(part, TensorInfo, offset in buffer)])]."""
        key = (layer, expert)
        if key not in self._layouts:
            infos = [self.checkpoint.index[expert_prefix(layer, expert) + part] for part in EXPERT_PARTS]
            gap_free = all(a.file == b.file and a.offset + a.nbytes == b.offset for a, b in zip(infos, infos[1:]))
            if gap_free:
                first = infos[0]
                runs = [(first.file, first.offset, sum(i.nbytes for i in infos),
                         [(p, i, i.offset - first.offset) for p, i in zip(EXPERT_PARTS, infos)])]
            else:
                runs = [(i.file, i.offset, i.nbytes, [(p, i, 0)]) for p, i in zip(EXPERT_PARTS, infos)]
            self._layouts[key] = runs
        return self._layouts[key]

    def _fd(self, path):
        if path not in self._fds:
            self._fds[path] = os.open(path, os.O_RDONLY)
        return self._fds[path]

    def fetch(self, layer, experts):
        out = []
        for e in experts:
            parts = {}
            for path, offset, length, pieces in self._layout(layer, e):
                start = time.perf_counter()
                buf = os.pread(self._fd(path), length, offset)
                self.read_seconds += time.perf_counter() - start
                if len(buf) != length:
                    raise UnsoundRunError(f"short read of expert {e} of layer {layer}: {len(buf)} of {length} "
                                          f"bytes from {path} at offset {offset}; the generated ids are unsound")
                self.bytes_read += length
                for part, info, at in pieces:
                    parts[part] = np.frombuffer(buf, np.uint8, info.nbytes, at).reshape(info.shape)
            self.requests += 1
            out.append(ExpertWeights(layer, e, *(parts[p] for p in EXPERT_PARTS)))
        return out

    def stats(self):
        return {"expert_requests": self.requests, "expert_bytes_read": self.bytes_read,
                "expert_read_seconds": self.read_seconds, "resident_hits": 0}

    def close(self):
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


@hookimpl(trylast=True)
def k3_expert_stores():
    return [DirectStore]
