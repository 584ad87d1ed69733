"""The `resident` trunk placer: every trunk tensor read into RAM once, at open.

No packed trunk is needed; RAM must hold the whole trunk (the memory plan says how much).
"""
from __future__ import annotations

import time

import numpy as np

from ..plugin_api import HEAD, PREFIX, VISION_PREFIXES, Param, PlanRow, TrunkPlacer, Weights, hookimpl, layer_prefix

EXPERTS = "block_sparse_moe.experts."


def _is_model_level(name: str) -> bool:
    return not name.startswith(PREFIX + "layers.") and not name.startswith(VISION_PREFIXES)


def _is_trunk(name: str) -> bool:
    return not name.startswith(VISION_PREFIXES) and EXPERTS not in name


class ResidentPlacer(TrunkPlacer):
    name = "resident"
    description = "the whole trunk in RAM; no packed trunk needed"

    def __init__(self, ctx):
        super().__init__(ctx)
        index, config = self.checkpoint.index, self.config
        start = time.perf_counter()
        self._layers: list[dict[str, Param]] = [{} for _ in range(config.num_hidden_layers)]
        model: dict[str, Param] = {}
        self.bytes_read = 0
        for name in index.names():
            if _is_model_level(name):
                model[name] = self._load(index, name, name)
                continue
            if not name.startswith(PREFIX + "layers."):
                continue
            layer = int(name[len(PREFIX + "layers."):].split(".", 1)[0])
            rel = name[len(layer_prefix(layer)):]
            if rel.startswith(EXPERTS) or layer >= config.num_hidden_layers:
                continue
            self._layers[layer][rel] = self._load(index, name, rel)
        self._model = Weights("", model)
        self.load_seconds = time.perf_counter() - start

    def _load(self, index, name, rel) -> Param:
        info = index[name]
        data = np.array(index.read(name))  # a private copy: resident, independent of the file
        self.bytes_read += data.nbytes
        return Param(data, info.dtype, rel)

    def layer(self, layer):
        return Weights(layer_prefix(layer), self._layers[layer])

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
