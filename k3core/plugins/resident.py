"""The `resident` trunk placer: every trunk tensor read into RAM once, at open.

No packed trunk is needed; RAM must hold the whole trunk (the memory plan says how much). Tensors are
read with large parallel O_DIRECT reads (aligned_io.read_spans) straight into the buffers they then live
in: no page-cache copy, no second copy. Each is checked against the checksum recorded for the checkpoint
(TensorSums), on every core, before the first token.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..plugin_api import (DTYPES, HEAD, PREFIX, VISION_PREFIXES, Param, PlanRow, Span, TensorSums, TrunkPlacer,
                          Weights, hookimpl, layer_prefix, read_spans)

EXPERTS = "block_sparse_moe.experts."


def _is_model_level(name: str) -> bool:
    return not name.startswith(PREFIX + "layers.") and not name.startswith(VISION_PREFIXES)


def _is_trunk(name: str) -> bool:
    return not name.startswith(VISION_PREFIXES) and EXPERTS not in name


def _param(buf, skip: int, t, key: str) -> Param:
    """The tensor `t` over its own buffer; copied only if the file puts it at an offset its dtype cannot view."""
    itemsize, dtype = DTYPES[t.dtype]
    data = np.frombuffer(buf, dtype, t.nbytes // itemsize, skip).reshape(t.shape)
    return Param(data if skip % itemsize == 0 else data.copy(), t.dtype, key)


class ResidentPlacer(TrunkPlacer):
    name = "resident"
    description = "the whole trunk in RAM; no packed trunk needed"

    def __init__(self, ctx):
        super().__init__(ctx)
        index, config = self.checkpoint.index, self.config
        start = time.perf_counter()
        layers: list[dict[str, Param]] = [{} for _ in range(config.num_hidden_layers)]
        wanted = []  # (layers dict or None for the model level, key, name)
        for name in index.names():
            if _is_model_level(name):
                wanted.append((None, name, name))
            elif name.startswith(PREFIX + "layers."):
                layer = int(name[len(PREFIX + "layers."):].split(".", 1)[0])
                rel = name[len(layer_prefix(layer)):]
                if not rel.startswith(EXPERTS) and layer < config.num_hidden_layers:
                    wanted.append((layer, rel, name))
        infos = [index[name] for *_, name in wanted]
        sums = TensorSums.load(index)
        read = read_spans([Span(t.file, t.offset, t.nbytes, f"trunk tensor {t.name}") for t in infos])
        with ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="k3-trunk-check") as pool:
            list(pool.map(lambda t, r: sums.check(t, memoryview(r[0])[r[1]:r[1] + t.nbytes], "the resident trunk"),
                          infos, read))
        model: dict[str, Param] = {}
        for (layer, key, _), t, (buf, skip) in zip(wanted, infos, read):
            (model if layer is None else layers[layer])[key] = _param(buf, skip, t, key)
        self.bytes_read = sum(t.nbytes for t in infos)
        # one Weights per layer, handed out pass after pass: the engine scans its small tensors once (model/finite.py)
        self._layers = [Weights(layer_prefix(L), params) for L, params in enumerate(layers)]
        self._model = Weights("", model)
        self.load_seconds = time.perf_counter() - start

    def layer(self, layer):
        return self._layers[layer]

    @classmethod
    def plan(cls, ctx):
        index = ctx.checkpoint.index
        total = sum(index[n].nbytes for n in index.names() if _is_trunk(n))
        return [PlanRow("trunk, all resident", total, f"{ctx.config.num_hidden_layers} layers + embedding and head")]

    def model(self):
        return self._model

    def embed_rows(self, ids):
        embed = self._model[PREFIX + "embed_tokens.weight"]
        return Param(embed.data[np.asarray(ids, dtype=np.int64)], embed.dtype).f32()

    def head_blocks(self):
        yield 0, self._model[HEAD]

    def stats(self):
        return {"trunk_bytes_read": self.bytes_read, "trunk_load_seconds": self.load_seconds,
                "pinned_layers": self.config.num_hidden_layers}


@hookimpl(trylast=True)
def k3_trunk_placers():
    return [ResidentPlacer]
