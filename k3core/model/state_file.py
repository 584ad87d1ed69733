"""Decode-state files: a conversation's KDA states, conv histories, MLA caches and consumed ids,
saved so a chat can continue later exactly where it stopped (bit for bit).

A state belongs to one model: the file carries the config's and the shards' fingerprint and is
refused, naming the difference, when loaded into another. npz without pickles; written as any output a user
names (k3core/files/atomic.py output_file: atomic over a file, through a device or FIFO, no temporary file left).
"""
from __future__ import annotations

import hashlib
import json

import numpy as np

from ..errors import K3Error
from ..files.atomic import output_file
from ..files.limits import SMALL_FILE_BYTES, loads_limited, too_large
from ..io.trunk import fingerprint
from .engine import DecodeState

FORMAT, VERSION = "k3-state", 1


class StateFileError(K3Error):
    """A state file that is unreadable, of another format, or from another model."""

    exit_code = 2


def model_fingerprint(engine) -> dict:
    """The config, and the shards (names, sizes, header hashes and sampled data hashes)."""
    config = json.dumps(engine.config.to_dict() | {"layout": None}, sort_keys=True).encode()
    return {"config_sha256": hashlib.sha256(config).hexdigest(),
            "weights_sha256": fingerprint(engine.checkpoint)["shards_sha256"]}


def save_state(path, engine, state, extra: dict | None = None, what: str = "state file") -> None:
    """Write `state` (and `extra`, JSON-able, e.g. the conversation) to `path`; `what` (chat's "/save") names it in
    errors: UsageError for a directory, OutputError for a failed write."""
    arrays = {"ids": np.asarray(state.ids, np.int64)}
    for L, layer_state in enumerate(state.layers):
        for name, value in engine.attention_for(L).state_arrays(layer_state).items():
            arrays[f"layer{L}.{name}"] = value
    meta = {"format": FORMAT, "version": VERSION, "model": model_fingerprint(engine), "extra": extra or {}}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    with output_file(path, what) as f:
        np.savez(f, **arrays)


MAX_STATE_BYTES = 64 << 30  # a state file larger than this is refused before it is read


def _read_arrays(path) -> dict:
    """Every array of the npz, read with pickles refused; anything unreadable is StateFileError: a missing file, a
    directory or a file that cannot be opened named as such, and "not a k3 state file" only for a file that opens."""
    import zipfile

    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise StateFileError(f"{path}: the file does not exist") from None
    except IsADirectoryError:
        raise StateFileError(f"{path}: is a directory") from None
    except OSError as exc:
        raise StateFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        with f:
            with zipfile.ZipFile(f) as z:   # a file object given is left open
                size = sum(i.file_size for i in z.infolist())
                if size > MAX_STATE_BYTES:
                    raise StateFileError(f"{path}: {size:,} bytes unpacked, over the limit of {MAX_STATE_BYTES:,}")
                if any(i.filename == "meta.npy" and i.file_size > SMALL_FILE_BYTES for i in z.infolist()):
                    raise too_large(f"{path}: its 'meta' member", SMALL_FILE_BYTES, "a state file's metadata")
                if bad := z.testzip():
                    raise StateFileError(f"{path}: the member {bad!r} is damaged (its CRC does not match)")
            f.seek(0)
            with np.load(f, allow_pickle=False) as data:
                return {k: data[k] for k in data.files}
    except StateFileError:
        raise
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, RuntimeError) as exc:
        raise StateFileError(f"{path}: not a k3 state file ({type(exc).__name__}: {str(exc)[:200]})") from None


def _meta(path, arrays) -> dict:
    raw = arrays.pop("meta", None)
    if raw is None:
        raise StateFileError(f"{path}: not a k3 state file (no 'meta' member)")
    meta = None
    if raw.dtype == np.uint8 and raw.ndim == 1:
        try:
            meta = loads_limited(raw.tobytes(), f"{path}: its 'meta' member")
        except ValueError:
            pass
    if not isinstance(meta, dict):
        raise StateFileError(f"{path}: its 'meta' member is not a JSON object")
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise StateFileError(f"{path}: format {meta.get('format')!r} version {meta.get('version')!r}, "
                             f"this k3 reads {FORMAT!r} version {VERSION}")
    for key, kind in (("model", dict), ("extra", dict)):
        if not isinstance(meta.get(key), kind):
            raise StateFileError(f"{path}: meta key {key!r} is missing or not a {kind.__name__}")
    return meta


def load_state(path, engine):
    """(DecodeState, extra) from a file written by save_state for this very model. The whole file is checked
    — zip integrity, every member's name, dtype, shape and finiteness, ids in the vocabulary and within the
    context — before anything is returned, so a bad file never replaces a good conversation."""
    arrays = _read_arrays(path)
    meta = _meta(path, arrays)
    ours = model_fingerprint(engine)
    differ = [k.split("_")[0] for k in ours if meta["model"].get(k) != ours[k]]
    if differ:
        raise StateFileError(f"{path} was saved with another model ({' and '.join(differ)} differ from "
                             f"{engine.checkpoint.root}); it cannot continue here")
    ids = arrays.pop("ids", None)
    if ids is None or ids.dtype != np.int64 or ids.ndim != 1:
        raise StateFileError(f"{path}: member 'ids' is missing or not a 1-D int64 array")
    if len(ids) and (ids.min() < 0 or ids.max() >= engine.config.vocab_size):
        raise StateFileError(f"{path}: member 'ids' holds ids outside 0..{engine.config.vocab_size - 1}")
    if len(ids) > engine.max_context:
        raise StateFileError(f"{path}: {len(ids)} ids, over this engine's context limit of {engine.max_context}")
    layers = []
    for L in range(engine.config.num_hidden_layers):
        prefix = f"layer{L}."
        mine = {k[len(prefix):]: arrays.pop(k) for k in [k for k in arrays if k.startswith(prefix)]}
        for name, a in mine.items():
            if a.dtype.kind == "f" and not np.isfinite(a).all():
                raise StateFileError(f"{path}: member {prefix + name!r} holds NaN or infinite values")
        try:
            layers.append(engine.attention_for(L).state_from_arrays(engine.config, L, mine))
        except KeyError as exc:
            raise StateFileError(f"{path}: member {prefix + str(exc.args[0])!r} is missing") from None
        except ValueError as exc:
            raise StateFileError(f"{path}: {exc}") from None
    if arrays:
        raise StateFileError(f"{path}: unexpected member(s) {', '.join(map(repr, sorted(arrays)[:5]))}")
    state = DecodeState(layers, [int(t) for t in ids])
    for L, layer in enumerate(state.layers):  # every position the ids claim must be in each cache
        held = engine.attention_for(L).state_arrays(layer)
        if "keys" in held and len(held["keys"]) != len(ids):
            raise StateFileError(f"{path}: layer {L} caches {len(held['keys'])} positions, but {len(ids)} ids")
    return state, meta["extra"]
