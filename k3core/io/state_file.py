"""Decode-state files: a conversation's KDA states, conv histories, MLA caches and consumed ids,
saved so a chat can continue later exactly where it stopped (bit for bit).

A state belongs to one model: the file carries the config's and the shards' fingerprint and is
refused, naming the difference, when loaded into another. npz without pickles; atomic writes.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from ..errors import K3Error
from .trunk import fingerprint

FORMAT, VERSION = "k3-state", 1


class StateFileError(K3Error):
    """A state file that is unreadable, of another format, or from another model."""

    exit_code = 2


def model_fingerprint(engine) -> dict:
    """The config, and the shards (names, sizes, header hashes and sampled data hashes)."""
    config = json.dumps(engine.config.to_dict() | {"layout": None}, sort_keys=True).encode()
    return {"config_sha256": hashlib.sha256(config).hexdigest(),
            "weights_sha256": fingerprint(engine.checkpoint)["shards_sha256"]}


def save_state(path, engine, state, extra: dict | None = None) -> None:
    """Write `state` (and `extra`, JSON-able, e.g. the conversation) to `path` atomically."""
    arrays = {"ids": np.asarray(state.ids, np.int64)}
    for L, layer_state in enumerate(state.layers):
        for name, value in engine.attention_for(L).state_arrays(layer_state).items():
            arrays[f"layer{L}.{name}"] = value
    meta = {"format": FORMAT, "version": VERSION, "model": model_fingerprint(engine), "extra": extra or {}}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, target)


def load_state(path, engine):
    """(DecodeState, extra) from a file written by save_state for this very model."""
    from ..model.engine import DecodeState

    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        meta = json.loads(arrays.pop("meta").tobytes())
    except (OSError, ValueError, KeyError) as exc:
        raise StateFileError(f"{path}: not a k3 state file ({exc})") from None
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise StateFileError(f"{path}: format {meta.get('format')!r} version {meta.get('version')!r}, "
                             f"this k3 reads {FORMAT!r} version {VERSION}")
    ours = model_fingerprint(engine)
    differ = [k.split("_")[0] for k in ours if meta["model"].get(k) != ours[k]]
    if differ:
        raise StateFileError(f"{path} was saved with another model ({' and '.join(differ)} differ from "
                             f"{engine.checkpoint.root}); it cannot continue here")
    layers = []
    for L in range(engine.config.num_hidden_layers):
        prefix = f"layer{L}."
        mine = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
        try:
            layers.append(engine.attention_for(L).state_from_arrays(engine.config, L, mine))
        except (KeyError, ValueError) as exc:
            raise StateFileError(f"{path}: {exc}") from None
    return DecodeState(layers, [int(t) for t in arrays["ids"]]), meta.get("extra", {})
