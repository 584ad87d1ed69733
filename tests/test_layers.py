"""The rooms of the house keep to their doors: ui/, wizard/ and serve/ reach k3core only through the front
door (`k3core`) and, as plugins, `k3core.plugin_api`; the built-in plugins see only `k3core.plugin_api`; no
core module names a built-in plugin; k3core imports none of the front ends; serve/ never imports ui/; no
argparse Namespace configures the UI."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in a file of the k3 tree (relative ones resolved)."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = list(package[:len(package) - node.level + 1]) if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            if node.module is None:
                out += [(node.lineno, f"{module}.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, module))
    return out


def files(folder: str):
    return sorted((ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("folder", ["ui", "wizard", "serve"])
def test_ui_and_wizard_use_only_the_front_door_and_the_plugin_api(folder):
    wrong = [f"{p.relative_to(ROOT)}:{line} imports {m}" for p in files(folder) for line, m in imports(p)
             if m.startswith("k3core") and m not in ("k3core", "k3core.plugin_api")]
    assert not wrong, "\n".join(wrong)


def test_the_core_knows_no_front_end_and_the_server_no_page():
    wrong = [f"{p.relative_to(ROOT)}:{line} imports {m}" for p in files("k3core") for line, m in imports(p)
             if m.split(".")[0] in ("ui", "wizard", "serve", "fastapi", "gradio", "uvicorn", "starlette")]
    wrong += [f"{p.relative_to(ROOT)}:{line} imports {m}" for p in files("serve") for line, m in imports(p)
              if m.split(".")[0] in ("ui", "wizard", "gradio")]
    assert not wrong, "\n".join(wrong)


def test_builtin_plugins_see_only_the_plugin_api():
    wrong = [f"{p.relative_to(ROOT)}:{line} imports {m}" for p in files("k3core/plugins") if p.name != "__init__.py"
             for line, m in imports(p) if m.startswith("k3core") and m != "k3core.plugin_api"]
    assert not wrong, "\n".join(wrong)


def test_no_core_module_names_a_builtin_plugin():
    wrong = [f"{p.relative_to(ROOT)}:{line} imports {m}" for p in files("k3core")
             if "plugins" not in p.relative_to(ROOT / "k3core").parts and p.name != "plugin_manager.py"
             for line, m in imports(p) if m.startswith("k3core.plugins")]
    assert not wrong, "\n".join(wrong)


def test_no_argparse_namespace_configures_the_ui():
    hits = [f"{p.relative_to(ROOT)}" for p in files("ui") if "Namespace" in p.read_text()]
    assert not hits
    text = (ROOT / "ui" / "host.py").read_text() + (ROOT / "ui" / "app.py").read_text()
    assert "args" not in {n.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name)}


def test_each_room_says_what_lives_there():
    for folder in ("model", "io", "text", "cli", "plugins", "testing"):
        doc = ast.get_docstring(ast.parse((ROOT / "k3core" / folder / "__init__.py").read_text()))
        assert doc and len(doc) > 60, folder
