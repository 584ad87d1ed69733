"""The generated checkpoints the conformance checks run on: the `tiny` (MODEL.md §9) and `small` test
models, and a packed trunk of each, written once per process into a temporary directory (or
K3_TESTING_DIR, kept between runs) and reused."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

from ..io.draft_pack import derive_draft
from ..io.draft_trunk import DraftSpec, default_dir, trunk_layers
from ..io.pack import pack
from ..io.trunk import load_trunk
from ..testmodel.make import make_model


@lru_cache(maxsize=None)
def _root() -> Path:
    if os.environ.get("K3_TESTING_DIR"):
        root = Path(os.environ["K3_TESTING_DIR"])
        root.mkdir(parents=True, exist_ok=True)
        return root
    root = Path(tempfile.mkdtemp(prefix="k3-testing-"))
    atexit.register(shutil.rmtree, root, True)
    return root


@lru_cache(maxsize=None)
def model(shape: str = "tiny") -> Path:
    """A generated checkpoint of `shape` (the same bytes every time)."""
    return make_model(_root() / shape, shape, 0, "nested", if_missing=True)


@lru_cache(maxsize=None)
def packed_trunk(shape: str = "tiny") -> Path:
    """`k3 pack` of model(shape)."""
    out = _root() / f"{shape}-trunk"
    pack(model(shape), out)
    return out


@lru_cache(maxsize=None)
def draft_trunk(shape: str = "tiny") -> Path:
    """`k3 pack --draft int8` of packed_trunk(shape): every layer, in TRUNK/draft-int8."""
    trunk = packed_trunk(shape)
    derive_draft(trunk, DraftSpec("int8", tuple(range(trunk_layers(load_trunk(trunk))))))
    return default_dir(trunk, "int8")


def scratch(name: str) -> Path:
    """A fresh empty directory for one check."""
    path = _root() / "scratch" / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path
