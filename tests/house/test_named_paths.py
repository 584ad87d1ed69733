"""Every repository path the code and the docs name exists.

Where: every line (comments, docstrings, messages and code alike) of every .py and .md file outside tests/ that
git knows, tracked or new and not ignored.

What counts as a path: a word of letters, digits and `_ . - /` (full stops at its end dropped) that holds a `/`
and either ends in one of EXTENSIONS or starts with one of FOLDERS, e.g. `io/tensor_sums.py`, `k3core/pack.py`,
`wizard/data/demo-model`. Not checked: anything inside a URL; a path outside the repository (starting with `/`,
`~` or `../`); a pattern or placeholder (holding `* { } < > $`, or a part in capitals with no extension, as in
DIR/FILE); a path under build/ or a .venv folder; the few paths of other projects in ELSEWHERE.

When it exists: as a file or folder relative to the repository's root, to k3core/, to the citing file's own
folder or to any top-level folder (so `io/pack.py` or `generation/structured.py` written inside k3core counts). A path
with no extension may also name the files of that stem: `serve/app` for serve/app.py,
`tests/fixtures/oracles/demo-chat0` for its .json and .npz.
"""
from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXTENSIONS = (".py", ".md", ".cpp", ".h", ".hpp", ".json", ".jsonl", ".txt", ".toml", ".yaml", ".sh", ".bin",
              ".npz", ".svg")
FOLDERS = ("k3core", "native", "wizard", "ui", "serve", "tests", "docs", "demo", "benchmarks", "scripts")
ELSEWHERE = {
    "pydoc_data/topics.py": "CPython's standard library",
    "docs/data/speed-2026-08.md": "kimi-k3-in-c",
    "my_store/__init__.py": "the plugin package docs/plugins/tutorial.md builds",
    "tests/test_my_store.py": "the plugin package docs/plugins/tutorial.md builds",
}
URL = re.compile(r"\w+://\S+")
WORD = re.compile(r"[\w./~*{}<>$-]*/[\w./~*{}<>$-]*")
CAPITALS = re.compile(r"[A-Z][A-Z0-9_]*")
OUTSIDE = ("/", "~", "../", "build/", ".venv")


def paths_named(line: str) -> list[str]:
    """The repository paths a line of text names, by the rule in this module's docstring."""
    out = []
    for word in WORD.findall(URL.sub(" ", line)):
        path = word.rstrip(".").removeprefix("./")
        parts = path.split("/")
        if path.startswith(OUTSIDE) or any(c in path for c in "*{}<>$~") or path in ELSEWHERE \
                or any(CAPITALS.fullmatch(part) for part in parts):
            continue
        if path.endswith(EXTENSIONS) or parts[0] in FOLDERS:
            out.append(path)
    return out


@cache
def listed() -> tuple[str, ...]:
    """The files git knows: tracked, or new and not ignored."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return tuple(name for name in out.splitlines() if (ROOT / name).is_file())


@cache
def bases() -> tuple[Path, ...]:
    """The folders a path may be relative to, besides the citing file's own: the root, k3core/, each top-level one."""
    return (ROOT, ROOT / "k3core", *sorted({ROOT / name.split("/")[0] for name in listed() if "/" in name}))


def exists(path: str, citing: Path) -> bool:
    """Whether `path`, said in the file `citing`, names a file or folder of the repository."""
    for base in (citing.parent, *bases()):
        if (base / path).exists():
            return True
        if not Path(path).suffix and any((base / path).parent.glob(Path(path).name + ".*")):
            return True
    return False


def test_every_path_the_code_and_docs_name_exists():
    missing = []
    for name in (n for n in listed() if n.endswith((".py", ".md")) and not n.startswith("tests/")):
        for number, line in enumerate((ROOT / name).read_text().splitlines(), 1):
            missing += [f"{name}:{number} names {path}, which does not exist"
                        for path in paths_named(line) if not exists(path, ROOT / name)]
    assert not missing, "\n".join(missing)


def test_the_rule_finds_stale_paths_and_skips_the_rest():
    stale = "io/tensor_sums.py, io/writer.py, k3core/pack.py, tests/wizard/test_plan.py and tests/wizard/test_state.py."
    assert paths_named(stale) == ["io/tensor_sums.py", "io/writer.py", "k3core/pack.py", "tests/wizard/test_plan.py",
                                  "tests/wizard/test_state.py"]
    assert not any(exists(path, ROOT / "k3core" / "io" / "trunk.py") for path in paths_named(stale))
    skipped = ("https://example.com/a/b.py ~/.config/k3/profile.json /tmp/x.json ../shared/y.md build/k3.so "
               "tests/*.py docs/{A,B}.md DIR/FILE MODEL/config.json <dir>/config.json $HOME/k3.toml input/output")
    assert paths_named(skipped) == []
    assert all(exists(path, ROOT / "k3core" / "io" / "trunk.py") for path in
               ("format/tensor_sums.py", "serve/app", "tests/fixtures/oracles/demo-chat0", "wizard/data/demo-model"))
