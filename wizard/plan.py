"""What `k3 setup` will fetch and where it must fit: the source (hf://REPO[@REV], a directory, demo), the files
chosen from the Hub's listing (weight shards + config and tokenizer files; vision shards only on request),
the packed-trunk estimate, and the free-space preflight that refuses before the first byte.
Checked by tests/wizard/test_steps.py (the plan, the free-space refusal) and tests/wizard/test_dry_run_offline.py.
"""
from __future__ import annotations

import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from k3core.errors import K3Error, UsageError
from k3core.format.checkpoint import VISION_PREFIXES
from k3core.io.pack import packed_trunk_bytes
from k3core.machine.checks import TRUNK_BYTES as RELEASED_TRUNK_BYTES

from .demo import demo_bytes
from .hub import HubError
from .progress import human
from .state import DONE, PENDING, VERIFIED
from .verify import OFFICIAL_VISION, is_official, published_sizes, table_problems

META_SUFFIXES = (".json", ".model", ".py", ".jinja", ".tiktoken", ".txt")
INDEX = "model.safetensors.index.json"
HUB_INDEX = "model.safetensors.index.hub.json"   # the Hub's index, kept when the vision shards are left out
MARGIN = 256 << 20                               # free space kept beyond what the plan needs


class SpaceError(K3Error):
    exit_code = 2


@dataclass(frozen=True)
class Source:
    kind: str                   # hf | dir | demo
    repo: str | None = None
    revision: str | None = None
    path: Path | None = None

    def __str__(self) -> str:
        return f"hf://{self.repo}" if self.kind == "hf" else str(self.path) if self.kind == "dir" else "demo"


def parse_source(text: str) -> Source:
    if text == "demo":
        return Source("demo")
    if text.startswith("hf://"):
        repo, _, rev = text[5:].partition("@")
        if not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", repo) or ".." in repo or (_ and not rev):
            raise UsageError(f"--source {text!r}: write hf://OWNER/NAME or hf://OWNER/NAME@REVISION")
        return Source("hf", repo, rev or "main")
    if Path(text).is_dir():
        return Source("dir", path=Path(text).resolve())
    raise UsageError(f"--source {text!r}: give hf://OWNER/NAME[@REVISION], an existing checkpoint directory, or demo")


def record(remote: str | None, size: int, sha256=None, oid=None, kind="weights", origin="hub") -> dict:
    return {"remote": remote, "size": size, "sha256": sha256, "oid": oid, "kind": kind, "origin": origin,
            "status": PENDING, "bytes": 0}


@dataclass
class Plan:
    files: dict[str, dict]                     # local name -> record (see record())
    trunk_bytes: int                           # the packed trunk, estimated
    official: bool = False
    vision: list[str] = field(default_factory=list)     # vision shards (fetched only with --vision)
    skipped: list[str] = field(default_factory=list)    # listed but not needed (README, images, other formats)
    fetch_bytes: int | None = None             # bytes to bring in (default: every record's size)
    vision_bytes: int = 0                      # size of the vision shards

    def facts(self) -> dict:
        return {"trunk_bytes": self.trunk_bytes, "official": self.official, "vision_shards": self.vision,
                "skipped": self.skipped}


# ---- hf://REPO[@REV] -------------------------------------------------------------------------------
def _tensors(header: dict):
    return ((k, v) for k, v in header.items() if k != "__metadata__" and isinstance(v, dict))


def plan_hub(hub, sha: str, vision: bool, jobs: int = 4) -> Plan:
    files, skipped = [], []
    for f in hub.listing(sha):
        root, suffix = "/" not in f.path and not f.path.startswith("."), os.path.splitext(f.path)[1]
        wanted = root and f.path != HUB_INDEX and (suffix == ".safetensors" or suffix in META_SUFFIXES)
        (files if wanted else skipped).append(f)
    weights = [f for f in files if f.path.endswith(".safetensors")]
    if not weights:
        raise HubError(f"{hub.repo}@{sha[:12]}: no *.safetensors files at the top of the repository")
    official = is_official(hub.repo)
    if official:   # the published table must agree with the Hub before anything is fetched
        if diffs := table_problems({f.path: f.size for f in weights}, vision=True):
            raise HubError(f"{hub.repo}@{sha[:12]}: the Hub's listing disagrees with the published shard sizes of "
                           f"the released checkpoint ({'; '.join(f'{k}: {v}' for k, v in list(diffs.items())[:3])}"
                           f"{' …' if len(diffs) > 3 else ''}); refusing to download")
        vision_names, trunk = list(OFFICIAL_VISION), int(RELEASED_TRUNK_BYTES)
    else:          # other repositories and mirrors: read each shard's header (ranged GETs, no tensor data)
        with ThreadPoolExecutor(max(1, jobs)) as pool:
            headers = dict(zip((w.path for w in weights), pool.map(lambda w: hub.read_header(w.path, sha), weights)))
        vision_names = [n for n, h in headers.items()
                        if any(True for _ in _tensors(h)) and all(k.startswith(VISION_PREFIXES) for k, _ in _tensors(h))]
        trunk = packed_trunk_bytes(headers)
    out = {}
    for f in files:
        is_vision = f.path in vision_names
        if is_vision and not vision:
            continue
        kind = "vision" if is_vision else "weights" if f.path.endswith(".safetensors") else "meta"
        out[f.path] = record(f.path, f.size, f.sha256, None if f.sha256 else f.oid, kind)
    if not vision and INDEX in out and any(v in {f.path for f in weights} for v in vision_names):
        out[HUB_INDEX] = out.pop(INDEX)              # kept as the Hub sent it; INDEX is written without vision
        out[INDEX] = record(None, 0, kind="derived", origin="derived")
    vision_bytes = sum(f.size for f in weights if f.path in vision_names)
    return Plan(out, trunk, official, vision_names, [f.path for f in skipped], vision_bytes=vision_bytes)


def plan_published(vision: bool) -> Plan:
    """The released checkpoint's weight shards by the published size table k3 ships, without the Hub: what an
    offline `--dry-run` plans with. The config and tokenizer files are not in the table (a few MB)."""
    out, vision_bytes = {}, 0
    for name, size in published_sizes().items():
        is_vision = name in OFFICIAL_VISION
        vision_bytes += size if is_vision else 0
        if vision or not is_vision:
            out[name] = record(name, size, kind="vision" if is_vision else "weights")
    return Plan(out, int(RELEASED_TRUNK_BYTES), official=True, vision=list(OFFICIAL_VISION), vision_bytes=vision_bytes)


# ---- a local directory, the demo --------------------------------------------------------------------
def plan_local(directory: Path) -> Plan:
    """Use a checkpoint in place: k3core must open it; sizes come from disk, hashes are measured."""
    trunk = packed_trunk_bytes(directory)
    out = {}
    for p in sorted(directory.iterdir()):
        suffix = p.suffix
        if p.is_file() and not p.name.startswith(".") and (suffix == ".safetensors" or suffix in META_SUFFIXES):
            kind = "weights" if suffix == ".safetensors" else "meta"
            out[p.name] = dict(record(None, p.stat().st_size, kind=kind, origin="local"), status=DONE)
    names = {n for n in out if n.endswith(".safetensors")}
    return Plan(out, trunk, official=bool(names) and names <= set(published_sizes()))


def plan_demo() -> Plan:
    size = demo_bytes()
    return Plan({}, size, fetch_bytes=size)   # the packed trunk is at most the whole (tiny) model


# ---- space -----------------------------------------------------------------------------------------
def remaining_bytes(files: dict[str, dict]) -> int:
    """Bytes still to arrive (finished files and recorded partial bytes count as there)."""
    return sum(r["size"] - (r.get("bytes") or 0) for r in files.values() if r["status"] not in (DONE, VERIFIED))


def _existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(_existing(path)).free


def space_check(needs: list[tuple[Path, int, str]]) -> tuple[bool, str]:
    """`needs` = (directory, bytes, what), grouped by filesystem: (everything fits, what was found)."""
    groups: dict[int, list] = {}
    for where, nbytes, what in needs:
        groups.setdefault(os.stat(_existing(where)).st_dev, []).append((where, nbytes, what))
    for items in groups.values():
        where = _existing(items[0][0])
        need, free = sum(n for _, n, _ in items), free_bytes(where)
        parts = " + ".join(f"{what} {human(n)}" for _, n, what in items)
        if need + MARGIN > free:
            return False, (f"not enough free space: {parts} = {human(need)} (+{human(MARGIN)} to spare) must fit on "
                           f"the filesystem of {where}, which has {human(free)} free. Free some space, choose another "
                           "--dest, put the packed trunk on another drive with --trunk-dir, or skip packing with "
                           "--no-pack")
    lines = []
    for items in groups.values():
        where = _existing(items[0][0])
        parts = " + ".join(f"{what} {human(n)}" for _, n, what in items)
        lines.append(f"{parts} = {human(sum(n for _, n, _ in items))} needed, {human(free_bytes(where))} free "
                     f"on {where}")
    return True, "; ".join(lines) + ": fits"


def preflight(needs: list[tuple[Path, int, str]]) -> str:
    """space_check, refusing (exit 2) before anything is fetched when something does not fit."""
    fits, text = space_check(needs)
    if not fits:
        raise SpaceError(text + "; nothing was downloaded")
    return text
