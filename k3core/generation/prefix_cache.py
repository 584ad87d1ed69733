"""The prompt cache: decode states kept at checkpoints of every prompt the process has forwarded, in a radix tree
over ids, so a request resumes from the deepest checkpoint whose ids are a prefix of its own — whichever
conversation made it (MODEL.md §4.5: a state that consumed a prefix is the state forwarding that prefix gives).

Each node holds an edge of ids and, for each layer, the rows its attention state keeps per position over that
edge (`AttentionBackend.positional`: MLA's cached keys), once: every prefix through the node shares them. A
checkpoint node also holds the rest of the state at its end (KDA's S and conv history), whole. A state resumed
from a node is built from the rows along its path and its snapshot, so it owns its arrays; the tree is never
written into. Checkpoints (`positions`) come after every message boundary, at the positions a request names
(Anthropic cache_control), every `interval` ids of a long prompt, before its last id, and where a generation
ends; the passes that forward those positions keep the state there (Engine keep_at), never cut there.

RAM holds `ram_bytes` of node data, least recently used out; with a disk tier (prefix_disk.py) a node's data
is also written there, so what leaves RAM — or the process — is read back, its checksum checked, when asked
for. Checked by tests/generation/test_prefix_cache.py: the same ids and logits with the cache on and off, cold,
warm, after a restart, at every budget and in a batch.
"""
from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from ..errors import PluginError
from ..interfaces import AttentionBackend
from ..model.engine import DecodeState
from .prefix_disk import PrefixDisk, model_key, node_key

log = logging.getLogger("k3.prompt_cache")

DEFAULT_INTERVAL = 4096  # ids between checkpoints of a long prompt


@dataclass(eq=False)
class Node:
    parent: Node | None
    ids: tuple[int, ...]                   # the edge: the ids after the parent's end
    depth: int                             # ids from the root to this node's end
    key: str = ""                          # node_key of those ids: its file's name
    checkpoint: bool = False               # a state can resume at `depth`
    rows: dict | None = None               # "L.name" -> [len(ids), …] positional rows; None while not in RAM
    snapshot: dict | None = None           # "L.name" -> the rest of the state at `depth` (checkpoints only)
    on_disk: bool = False
    used: int = 0                          # the cache's clock at the last use of this node or a node below it
    children: dict[int, Node] = field(default_factory=dict)  # by the first id of their edge

    @property
    def resident(self) -> bool:
        return self.rows is not None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for part in (self.rows or {}, self.snapshot or {}) for a in part.values())

    def path(self) -> list[Node]:
        """The nodes from the root's child down to this one."""
        out, node = [], self
        while node.parent is not None:
            out.append(node)
            node = node.parent
        return out[::-1]


class PrefixCache:
    """Kept prompt states for one engine: `resume(prompt)` hands out a state holding the longest kept prefix of
    `prompt`; `keep(state)` keeps a state at the ids it holds; `positions(prompt, start)` says where forwarding a prompt
    should keep its state (Engine keep_at). Used from one thread at a time (a lock guards it from the rest)."""

    def __init__(self, engine, ram_bytes: int, interval: int = DEFAULT_INTERVAL, boundaries: Iterable[int] = (),
                 disk_dir=None, disk_bytes: int = 0):
        if interval < 1:
            raise ValueError(f"a prompt cache's checkpoint interval is 1 id or more, got {interval}")
        self.engine, self.ram_limit, self.interval = engine, int(ram_bytes), interval
        self.boundaries = frozenset(boundaries)
        for L, backend in self._layers():
            if engine.snapshot_names(L) and type(backend).keep_at is AttentionBackend.keep_at:
                raise PluginError(f"attention backend {backend.name!r} (layer {L}) cannot keep its state inside a "
                                  "pass (AttentionBackend.keep_at), which the prompt cache needs; run without one "
                                  "(--prompt-cache-gb 0 --prompt-cache off)")
        self.model = model_key(engine)
        self.root = Node(None, (), 0)
        self.ram = 0
        self.hits = self.misses = self.reused_tokens = self.stored_tokens = 0
        self._clock = itertools.count(1)
        self._lock = threading.RLock()
        self.disk = PrefixDisk(disk_dir, self.model, int(disk_bytes)) if disk_dir is not None and disk_bytes > 0 \
            else None
        if self.disk is not None:
            self._load_index()

    # ---- what a generation asks --------------------------------------------------------------------------

    def positions(self, prompt: Sequence[int], start: int, extra: Iterable[int] = ()) -> list[int]:
        """Where forwarding `prompt` from position `start` should keep the state (inside the passes): after each
        message boundary id, at `extra`, every `interval` ids, and before the prompt's last id (the same prompt
        again forwards one id; a resumed prompt must forward one for its logits); never where a checkpoint is
        already kept."""
        n = len(prompt)
        want = {i + 1 for i, t in enumerate(prompt) if t in self.boundaries}
        want |= set(range(self.interval, n, self.interval)) | {int(p) for p in extra} | {n - 1}
        with self._lock:
            kept = self._kept_depths(prompt)
        return sorted(p for p in want if start < p < n and p not in kept)

    def resume(self, prompt: Sequence[int]) -> DecodeState:
        """A state holding the longest kept strict prefix of `prompt` (a fresh one when none is kept); its
        arrays are its own. A kept node that cannot be read back is dropped and the next shorter one tried."""
        prompt = tuple(int(t) for t in prompt)
        with self._lock:
            while True:
                node = self._deepest_checkpoint(prompt)
                if node is None:
                    self.misses += 1
                    return self.engine.new_state()
                state = self._state_at(node)
                if state is not None:
                    self.hits += 1
                    self.reused_tokens += node.depth
                    return state

    def keep(self, state: DecodeState, position: int | None = None) -> None:
        """Keep `state` as a checkpoint at the ids it holds, or at `position` where a forward kept it (Engine
        keep_at); copies: the state goes on."""
        position = len(state.ids) if position is None else position
        arrays = self.engine.arrays_at(state, position)
        if not position:
            return
        with self._lock:
            node = self._insert(tuple(state.ids[:position]), arrays)
            if node is not None:
                self._touch(node)
                self._fit()

    def stats(self) -> dict:
        with self._lock:
            nodes = list(self._nodes())
            return {"prompt_cache_checkpoints": sum(n.checkpoint for n in nodes), "prompt_cache_hits": self.hits,
                    "prompt_cache_misses": self.misses, "prompt_cache_reused_tokens": self.reused_tokens,
                    "prompt_cache_stored_tokens": self.stored_tokens, "prompt_cache_ram_bytes": self.ram,
                    "prompt_cache_disk_bytes": self.disk.bytes if self.disk else 0,
                    "prompt_cache_dropped": self.disk.dropped if self.disk else 0}

    def where(self) -> str:
        """One line: where kept states go and what is kept already."""
        from ..units import human

        kept = self.stats()["prompt_cache_checkpoints"]
        disk = (f"on disk {self.disk.dir} ({human(self.disk.bytes)} of {human(self.disk.limit)}, {kept} checkpoints "
                "kept)" if self.disk is not None else "nothing on disk (--prompt-cache off)")
        return f"prompt cache: {human(self.ram_limit)} of RAM, {disk}"

    def clear(self) -> None:
        """Forget what RAM holds (the files stay: they are this model's, and another process may read them)."""
        with self._lock:
            for node in self._nodes():
                node.rows = node.snapshot = None
            self.ram = 0
            self.root.children.clear()
            if self.disk is not None:
                self._load_index()

    # ---- the tree -------------------------------------------------------------------------------------------

    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _walk(self, ids: tuple[int, ...]):
        """(node, matched) pairs down the tree along `ids`: each node whose whole edge matches, then possibly one
        whose edge matches only in part (matched < len(edge))."""
        node, at = self.root, 0
        while at < len(ids):
            child = node.children.get(ids[at])
            if child is None:
                return
            edge = child.ids
            matched = next((k for k in range(min(len(edge), len(ids) - at)) if edge[k] != ids[at + k]),
                           min(len(edge), len(ids) - at))
            yield child, matched
            if matched < len(edge):
                return
            node, at = child, at + len(edge)

    def _kept_depths(self, ids) -> set[int]:
        return {n.depth for n, matched in self._walk(tuple(ids)) if matched == len(n.ids) and n.checkpoint}

    def _deepest_checkpoint(self, prompt: tuple[int, ...]) -> Node | None:
        best = None
        for node, matched in self._walk(prompt):
            if matched == len(node.ids) and node.checkpoint and node.depth < len(prompt):
                best = node
        return best

    def _insert(self, ids: tuple[int, ...], arrays: list[dict]) -> Node | None:
        """The checkpoint node for `ids` (splitting an edge or adding one as needed); None when a node it needed
        could not be read back."""
        parent, at = self.root, 0
        for node, matched in self._walk(ids):
            if matched < len(node.ids):  # ids leave (or end inside) this edge: it splits there
                node = self._split(node, matched)
                if node is None:
                    return None
                parent, at = node, at + matched
                break
            parent, at = node, at + len(node.ids)
        if at == len(ids):  # the node exists: it becomes a checkpoint if it was not one
            if not parent.checkpoint:
                if not parent.resident and not self._read(parent):  # its file is rewritten with the snapshot
                    return None
                parent.checkpoint, parent.snapshot = True, self._snapshot(arrays)
                self.ram += sum(a.nbytes for a in parent.snapshot.values())
                self._save(parent)
            return parent
        node = Node(parent, ids[at:], len(ids), node_key(self.model, ids), True,
                    self._rows(arrays, at, len(ids)), self._snapshot(arrays))
        parent.children[node.ids[0]] = node
        self.ram += node.nbytes
        self.stored_tokens += len(node.ids)
        self._save(node)
        return node

    def _split(self, node: Node, k: int) -> Node | None:
        """Cut `node`'s edge after its first k ids: a new node (no checkpoint) holds them and their rows, `node`
        keeps the rest below it. None when `node` had to be read back and could not be (it is dropped)."""
        if not node.resident and not self._read(node):
            return None
        parent = node.parent
        upper = Node(parent, node.ids[:k], node.depth - len(node.ids) + k, used=node.used)
        upper.key = node_key(self.model, self._path_ids(parent) + upper.ids)
        upper.rows = {name: np.array(a[:k]) for name, a in node.rows.items()}
        node.rows = {name: np.array(a[k:]) for name, a in node.rows.items()}
        parent.children[upper.ids[0]] = upper
        node.parent, node.ids = upper, node.ids[k:]
        upper.children[node.ids[0]] = node
        self._save(upper)  # the upper part first: a crash before the second write leaves a node a scan discards
        self._save(node)
        return upper

    def _path_ids(self, node: Node) -> tuple[int, ...]:
        return tuple(t for n in node.path() for t in n.ids)

    # ---- states in, states out --------------------------------------------------------------------------------

    def _layers(self):
        e = self.engine
        return [(L, e.attention_for(L)) for L in range(e.config.num_hidden_layers)]

    def _rows(self, arrays: list[dict], a: int, b: int) -> dict:
        """Copies of positions a..b of every positional array (`arrays`: each layer's, Engine.arrays_at)."""
        return {f"{L}.{name}": np.array(arrays[L][name][a:b]) for L, backend in self._layers()
                for name in backend.positional}

    def _snapshot(self, arrays: list[dict]) -> dict:
        """Copies of every array that is not positional."""
        return {f"{L}.{name}": np.array(a) for L, backend in self._layers() for name, a in arrays[L].items()
                if name not in backend.positional}

    def _state_at(self, node: Node) -> DecodeState | None:
        """The state at checkpoint `node`, or None when a node on its path could not be read back (that node and
        everything below it are dropped)."""
        path = node.path()
        for n in path:
            if not self._ensure_rows(n, snapshot=n is node):
                return None
        self._touch(node)
        c, layers = self.engine.config, []
        try:
            for L, backend in self._layers():
                arrays = {}
                for name in backend.positional:
                    arrays[name] = np.concatenate([n.rows[f"{L}.{name}"] for n in path])
                prefix = f"{L}."
                arrays.update((k[len(prefix):], a) for k, a in node.snapshot.items() if k.startswith(prefix))
                layers.append(backend.state_from_arrays(c, L, arrays))
        except (KeyError, ValueError) as exc:  # a file of this model's key whose arrays the backend refuses
            log.warning("prompt cache: the state kept at %s does not load (%s); dropped", node.key[:16], exc)
            if self.disk is not None:
                self.disk.dropped += 1
            self._drop_subtree(node)
            return None
        self._fit(keep=path)
        return DecodeState(layers, [t for n in path for t in n.ids])

    # ---- RAM and disk ------------------------------------------------------------------------------------------

    def _touch(self, node: Node) -> None:
        tick = next(self._clock)
        for n in node.path():
            n.used = tick
        if self.disk is not None and node.on_disk:
            self.disk.touch(node.key)

    def _ensure_rows(self, node: Node, snapshot: bool = False) -> bool:
        """`node`'s data in RAM (read back from disk if it left); False when it could not be."""
        if node.resident and (not snapshot or node.snapshot is not None):
            return True
        return self._read(node)

    def _read(self, node: Node) -> bool:
        """`node`'s data read back from the disk tier into RAM; False (the node and everything below it dropped)
        when there is none or it is not what the node's place in the tree needs."""
        arrays = self.disk.read(node.key) if self.disk is not None and node.on_disk else None
        if arrays is not None and not self._fits(node, arrays):
            log.warning("prompt cache: %s does not hold the arrays its place in the tree needs; dropped",
                        node.key[:16])
            arrays = None
        if arrays is None:
            self._drop_subtree(node)
            return False
        positional = self._positional_names()
        self.ram -= node.nbytes
        node.rows = {k: a for k, a in arrays.items() if k in positional}
        node.snapshot = {k: a for k, a in arrays.items() if k not in positional} if node.checkpoint else None
        self.ram += node.nbytes
        return True

    def _fits(self, node: Node, arrays: dict) -> bool:
        """The arrays a file gave are those `node` holds: every positional one with a row per id of its edge,
        and the rest of a state when it is a checkpoint."""
        positional = self._positional_names()
        names = positional | ({f"{L}.{n}" for L, _ in self._layers() for n in self.engine.snapshot_names(L)}
                              if node.checkpoint else set())
        return set(arrays) == names and all(arrays[k].shape[:1] == (len(node.ids),) for k in positional)

    def _positional_names(self) -> set[str]:
        return {f"{L}.{name}" for L, b in self._layers() for name in b.positional}

    def _save(self, node: Node) -> None:
        """Write `node` to the disk tier (when there is one and its data is in RAM)."""
        if self.disk is None or not node.resident:
            return
        arrays = {**node.rows, **(node.snapshot or {})}
        parent = node.parent.key if node.parent is not self.root else None
        try:
            self.disk.write(node.key, parent, node.depth, node.ids, node.checkpoint, arrays)
            node.on_disk = True
        except OSError as exc:
            log.warning("prompt cache: cannot write %s (%s); it stays in RAM only", node.key[:16],
                        exc.strerror or exc)
            node.on_disk = False

    def _drop_subtree(self, node: Node) -> None:
        stack = [node]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            self.ram -= n.nbytes
            n.rows = n.snapshot = None
            if self.disk is not None and n.on_disk:
                self.disk.delete(n.key)
        if node.parent is not None:
            node.parent.children.pop(node.ids[0], None)

    def _fit(self, keep: Sequence[Node] = ()) -> None:
        """Evict, least recently used first, until RAM and disk are within their limits (never a node of `keep`).
        A node on disk leaves RAM only; one that is not (or a disk over its limit) goes when nothing below it is
        left."""
        pinned = set(map(id, keep))
        while self.ram > self.ram_limit:
            candidates = [n for n in self._nodes() if n.resident and id(n) not in pinned
                          and (n.on_disk or not n.children)]
            if not candidates:
                break
            victim = min(candidates, key=lambda n: (n.used, -n.depth))
            if victim.on_disk:
                self.ram -= victim.nbytes
                victim.rows = victim.snapshot = None
            else:
                self._drop_subtree(victim)
        while self.disk is not None and self.disk.bytes > self.disk.limit:
            leaves = [n for n in self._nodes() if not n.children and id(n) not in pinned]
            if not leaves:
                break
            self._drop_subtree(min(leaves, key=lambda n: (n.used, -n.depth)))

    def _load_index(self) -> None:
        """The tree as the disk tier holds it (no arrays read): entries whose parent is gone, whose ids do not hash
        to their name, or that hold neither a checkpoint nor a node below them are removed."""
        entries = sorted(self.disk.scan(), key=lambda e: e.depth)
        by_key = {None: self.root}
        ticks = {e.key: i for i, e in enumerate(sorted(entries, key=lambda e: e.used), start=1)}
        for e in entries:
            parent = by_key.get(e.parent)
            if parent is None or e.depth != parent.depth + len(e.ids) or e.ids[0] in parent.children \
                    or node_key(self.model, self._path_ids(parent) + e.ids) != e.key:
                self.disk.drop(e.key, "has no place in the tree (its parent is gone, or its ids are not its name)")
                continue
            node = Node(parent, e.ids, e.depth, e.key, e.checkpoint, on_disk=True, used=ticks[e.key])
            parent.children[e.ids[0]] = node
            by_key[e.key] = node
        for node in sorted(self._nodes(), key=lambda n: -n.depth):  # bottom up: a useless parent shows after its child
            if not node.checkpoint and not node.children:
                self.disk.delete(node.key)
                node.parent.children.pop(node.ids[0], None)
        self._clock = itertools.count(len(ticks) + 1)
        for node in sorted(self._nodes(), key=lambda n: -n.depth):  # a parent is as recent as its latest child
            node.parent.used = max(node.parent.used, node.used)
