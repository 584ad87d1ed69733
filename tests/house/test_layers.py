"""The house keeps to its plan. Every import in k3core/, serve/, ui/ and wizard/ (at any depth: inside a
function too, and under `if TYPE_CHECKING:`) is an edge of one graph, and:

- the graph has no cycle (one that runs works only by import order; one through `if TYPE_CHECKING:`, which never
  runs, still ties files that cannot be read apart): the test names its modules and edges;
- an import between two rooms of k3core (one under `if TYPE_CHECKING:` too) is one the rooms table allows — one
  downward stack, so the front door never imports the command line, the core never a built-in plugin by name, a
  room never one above it;
- a built-in plugin imports k3core.plugin_api and nothing else of k3; the plugin manager imports no plugin;
- serve/, ui/ and wizard/ import only the front door, its errors (k3core.errors), the plugin API and the public
  modules of the rooms each one lists in FRONT_ENDS; k3core imports none of them nor a web framework; serve never
  imports ui;
- importing the front door loads no argument parser, web framework, CLI module or plugin.
The rooms table is the one docs/ARCHITECTURE.md shows: this test reads it there (rooms_table).
"""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("k3core", "serve", "ui", "wizard")

# room -> the rooms it may import: the table in docs/ARCHITECTURE.md, "The rooms of k3core". A room is a folder of
# k3core, or one of its top-level modules; "native" is the C++ extension k3core._native, "version" is
# `from k3core import __version__` (k3core/__init__.py, which imports nothing at load).
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
TABLE_HEAD = "| room | what lives there | may import |"


def _room_name(cell_name: str) -> str:
    name = cell_name.removesuffix(".py").rstrip("/")
    return {"_native": "native", "__init__": "version"}.get(name, name)


def rooms_table(text: str) -> tuple[set[str], dict[str, set[str]]]:
    """(base, room -> the rooms it may import) as the table in `text` says, `base` expanded."""
    base_line = re.search(r"\*base\* there stands for (.*?)\.\n\n", text, re.S)
    assert base_line, f"{ARCHITECTURE.name} no longer says what *base* stands for"
    base = {_room_name(n) for n in re.findall(r"`([^`]+)`", base_line.group(1))}
    rows = text[text.index(TABLE_HEAD):].split("\n\n", 1)[0].splitlines()[2:]
    table = {}
    for row in rows:
        cells = row.split(" | ")
        allowed = {_room_name(n) for n in re.findall(r"`([^`]+)`", cells[-1])}
        if re.match(r"\|? ?base\b", cells[-1].strip()):
            allowed |= base
        for name in re.findall(r"`([^`]+)`", cells[0]):
            table[_room_name(name)] = allowed
    return base, table


BASE, ROOMS = rooms_table(ARCHITECTURE.read_text())
# what each front end may import of k3core: the front door and its errors, the plugin API, and these public modules
FRONT_DOOR = {"k3core", "k3core.api", "k3core.errors", "k3core.plugin_api"}
FRONT_ENDS = {
    "serve": {"k3core.cli.options", "k3core.report.logs", "k3core.files.limits", "k3core.generation.batch",
              "k3core.text.chat", "k3core.generation.channels", "k3core.generation.structured",
              "k3core.text.openai_messages"},
    "ui": {"k3core.cli.options", "k3core.report.logs", "k3core.report.run", "k3core.units", "k3core.plan.profile",
           "k3core.io.codec", "k3core.format.notes", "k3core.generation.channels"},
    "wizard": {"k3core.cli.options", "k3core.report.logs", "k3core.report.meters", "k3core.units",
               "k3core.files.limits", "k3core.files.atomic", "k3core.format.checkpoint", "k3core.format.notes",
               "k3core.format.safetensors_index", "k3core.format.scan", "k3core.format.tensor_sums", "k3core.io.codec", "k3core.io.pack",
               "k3core.plan.profile", "k3core.machine.checks", "k3core.machine.cost"},
}
WEB = ("fastapi", "gradio", "uvicorn", "starlette")


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = modules()
API_NAMES = set(ast.literal_eval(next(
    n.value for n in ast.parse((ROOT / "k3core" / "api.py").read_text()).body
    if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "__all__")))


def _type_checking_nodes(tree) -> set[int]:
    return {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)}


def _target(module: str, name: str | None) -> str | None:
    """The module an import names: `module` itself, or its submodule `name`; k3core's lazy names go to the api."""
    if name and f"{module}.{name}" in MODULES:
        return f"{module}.{name}"
    if module == "k3core" and name:
        return {"_native": "k3core._native", "__version__": "k3core.__version__"}.get(
            name, "k3core.api" if name in API_NAMES else "k3core")
    return module


def imports_of(module: str, type_checking: bool = False) -> list[tuple[int, str]]:
    """(line, imported module) for every import in `module` that runs (relative ones resolved); with `type_checking`,
    those under `if TYPE_CHECKING:` too."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    skip = set() if type_checking else _type_checking_nodes(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module
            out += [(node.lineno, t) for a in node.names if (t := _target(base, a.name))]
    return out


def edges() -> dict[str, set[str]]:
    """module -> the modules of the four packages it imports, under `if TYPE_CHECKING:` too (a name inside a module
    counts as the module)."""
    def owner(name):
        while name and name not in MODULES and name not in ("k3core._native", "k3core.__version__"):
            name = name.rpartition(".")[0]
        return name or None
    return {m: {o for _, i in imports_of(m, type_checking=True) if (o := owner(i)) and o != m} for m in MODULES}


def room(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "k3core":
        return parts[0]
    if len(parts) == 1:
        return "version"  # k3core/__init__.py: __version__ and the lazy front door
    return {"_native": "native", "__version__": "version"}.get(parts[1], parts[1])


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]; counter[0] += 1; stack.append(root); on.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1; stack.append(w); on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop(); on.discard(w); component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def describe(component: list[str], graph) -> str:
    inside = set(component)
    return "cycle: " + "; ".join(f"{m} -> {', '.join(sorted(graph[m] & inside))}" for m in component)


def test_no_import_cycle_anywhere():
    graph = edges()
    found = cycles(graph)
    assert not found, "\n".join(describe(c, graph) for c in found)


def test_the_cycle_finder_names_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert [describe(c, graph) for c in cycles(graph)] == ["cycle: a -> b; b -> c; c -> a"]


def test_every_room_is_in_the_table_and_the_table_points_down():
    rooms = {room(m) for m in MODULES if m.startswith("k3core")}
    assert rooms <= set(ROOMS), f"rooms without a row in ROOMS: {sorted(rooms - set(ROOMS))}"
    assert not cycles(ROOMS), "the table of rooms has a cycle"


def test_rooms_import_only_the_rooms_below_them():
    wrong = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {i} ({room(m)} may not import {room(i)})"
             for m in MODULES if m.startswith("k3core") for line, i in imports_of(m, type_checking=True)
             if i.startswith("k3core") and room(i) != room(m) and room(i) not in ROOMS[room(m)]]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("front_end", sorted(FRONT_ENDS))
def test_front_ends_use_the_front_door_and_public_modules(front_end):
    allowed = FRONT_DOOR | FRONT_ENDS[front_end]
    wrong = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {i}" for m in MODULES if m.split(".")[0] == front_end
             for line, i in imports_of(m) if i.startswith("k3core") and i not in allowed
             and not (i == "k3core.__version__" and front_end == "wizard")]
    assert not wrong, "\n".join(wrong)


def test_the_core_knows_no_front_end_and_the_server_no_page():
    wrong = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {i}" for m in MODULES if m.startswith("k3core")
             for line, i in imports_of(m) if i.split(".")[0] in ("ui", "wizard", "serve", *WEB)]
    wrong += [f"{MODULES[m].relative_to(ROOT)}:{line} imports {i}" for m in MODULES if m.startswith("serve")
              for line, i in imports_of(m) if i.split(".")[0] in ("ui", "wizard", "gradio")]
    assert not wrong, "\n".join(wrong)


def test_builtin_plugins_see_only_the_plugin_api_and_the_manager_imports_none():
    graph = edges()
    wrong = [f"{m} imports {i}" for m in MODULES if m.startswith("k3core.plugins.")
             for i in graph[m] if i.startswith("k3core") and i != "k3core.plugin_api"]
    wrong += [f"{m} imports {i}" for m in MODULES if not m.startswith("k3core.plugins")
              for i in graph[m] if i.startswith("k3core.plugins")]
    assert not wrong, "\n".join(wrong)


def test_importing_the_front_door_loads_no_parser_web_framework_cli_or_plugin():
    code = ("import sys, json, k3core; from k3core import open_engine, ChatSession, EngineConfig; "
            "print(json.dumps(sorted(sys.modules)))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                       cwd=ROOT).stdout)
    bad = [m for m in loaded if m.split(".")[0] in ("argparse", "tqdm", *WEB)
           or m.startswith(("k3core.cli", "k3core.plugins", "k3core.testing"))]
    assert not bad and "k3core.api" in loaded, bad


def test_no_argparse_namespace_configures_the_ui():
    hits = [f"{p.relative_to(ROOT)}" for p in sorted((ROOT / "ui").rglob("*.py")) if "Namespace" in p.read_text()]
    assert not hits
    text = (ROOT / "ui" / "host.py").read_text() + (ROOT / "ui" / "app.py").read_text()
    assert "args" not in {n.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name)}


def test_each_room_says_what_lives_there():
    folders = sorted(p.parent.name for p in (ROOT / "k3core").glob("*/__init__.py"))
    assert {"cli", "files", "format", "io", "machine", "model", "plan", "plugins", "report", "testing", "testmodel",
            "text"} <= set(folders)
    for folder in folders:
        doc = ast.get_docstring(ast.parse((ROOT / "k3core" / folder / "__init__.py").read_text()))
        assert doc and len(doc) > 60, folder
    unpackaged = sorted({p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "k3core").rglob("*.py")
                         if not (p.parent / "__init__.py").exists()})
    assert not unpackaged, f"folders without __init__.py (not packaged): {unpackaged}"
