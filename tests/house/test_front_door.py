"""The front door stays small (issue 43): at most 30 everyday names, each importable from `k3core`, and no error
class but K3Error (the others are imported from k3core.errors, or from the room that raises them)."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from k3core import api

ROOT = Path(__file__).resolve().parents[2]
PLACES = ("k3core", "serve", "ui", "wizard", "tests", "benchmarks", "examples", "demo", "scripts")


def test_the_front_door_has_at_most_30_names():
    assert len(set(api.__all__)) == len(api.__all__) <= 30, sorted(api.__all__)


@pytest.mark.parametrize("name", api.__all__)
def test_each_name_is_importable_from_k3core(name):
    scope = {}
    exec(f"from k3core import {name}", scope)
    assert scope[name] is getattr(api, name)


def test_no_error_class_but_k3error_is_in_the_front_door():
    classes = {n: getattr(api, n) for n in api.__all__ if isinstance(getattr(api, n), type)}
    assert [n for n, c in classes.items() if issubclass(c, BaseException)] == ["K3Error"]


def test_every_name_imported_from_k3core_is_in_the_front_door():
    """A name `from k3core import` does not offer fails only when that line runs: this finds one anywhere first."""
    wrong = []
    for path in sorted(p for place in PLACES for p in (ROOT / place).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in ("k3core", "k3core.api") and not node.level:
                wrong += [f"{path.relative_to(ROOT)}:{node.lineno} imports {a.name} from {node.module}"
                          for a in node.names if not hasattr(importlib.import_module(node.module), a.name)]
    assert not wrong, "\n".join(wrong)
