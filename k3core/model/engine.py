"""The engine: the Kimi K3 forward pass over the layers (MODEL.md §4) on a decode state.

Placement, expert reads, attention and kernels are plugins (chosen by engine_config.resolve); this file
only wires the residual stream (AttnRes), the layer order (one layer: layer.py) and the decode state together.
Whoever wants to watch a pass (progress, routing) passes Observers (observer.py) as an argument; nothing is
stored on the engine.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ..errors import InputError, K3Error, PluginError, UsageError
from .attnres import Residual, fold
from ..format.checkpoint import PREFIX, expert_bytes
from ..interfaces import DraftTarget
from ..plan.engine_config import EngineConfig, resolve
from .draft_weights import DraftKernels, DraftPlacer, draft_topk, open_draft
from .finite import BindCheck, check_embed_rows, head_error, output_error
from .layer import decoder_layer

if TYPE_CHECKING:
    from ..format.config import Config
    from ..interfaces import AttentionBackend, ExpertStore, KernelBackend, TrunkPlacer, Weights
    from ..plan.budget import Plan
    from ..plugin_manager import K3PluginManager
    from .observer import Observer


@dataclass
class DecodeState:
    """What incremental decode carries: each layer's attention state, and the ids consumed."""

    layers: list
    ids: list[int] = field(default_factory=list)
    mark: int | None = None  # len(ids) at Engine.mark: positions after it can be rolled back
    # what a forward with keep_at kept: position -> each layer's state arrays as they stood there (Engine.arrays_at)
    taken: dict = field(default_factory=dict)

    def copy(self) -> "DecodeState":
        """A deep copy without the mark."""
        return DecodeState(copy.deepcopy(self.layers), list(self.ids))


class Engine:
    """A loaded model. `forward` consumes new ids into a DecodeState and returns logits.

    Built by `k3core.open_engine(EngineConfig(...))`: the memory plan is made, shown to `on_plan` and
    checked before any weight is loaded."""

    config: Config              # the checkpoint's config.json (config_in: the EngineConfig it was opened with)
    kernels: KernelBackend
    placer: TrunkPlacer
    store: ExpertStore

    def __init__(self, config: EngineConfig, *, pm: K3PluginManager | None = None,
                 on_plan: Callable[[Plan], object] | None = None, available: int | None = None) -> None:
        r = resolve(config, pm)
        try:
            self.checkpoint, self.kernels = r.checkpoint, r.kernels
            self.config = r.checkpoint.config
            self._attention, self.notices = r.attention, r.notices
            draft = open_draft(r)
            self.plan = r.plan(available)
            if on_plan is not None:
                on_plan(self.plan)
            self.plan.check()
            if config.threads is not None:
                self.kernels.set_threads(config.threads)
            for family, threads in config.kernel_threads.items():
                self.kernels.set_family_threads(family, threads)
            self.placer = r.placer(r.placer_ctx)
            try:
                self.store = r.store(r.store_ctx)
            except BaseException:
                self.placer.close()
                raise
        except BaseException:
            r.checkpoint.close()
            raise
        self.config_in = config = r.config  # with max_context "auto", the context the plan chose
        self.max_context, self.prefill_chunk = config.max_context, config.prefill_chunk
        self.sequences, self.speculate = config.sequences, config.speculate
        self.tokens_forwarded = self.forward_passes = 0
        self._bound = BindCheck()  # what the placer hands out, checked for NaN and infinity (model/finite.py)
        self._snapshots: dict[int, list[str]] = {}  # layer -> its state arrays that are not positional
        self.cache_only = False  # the model routes as the checkpoint says; a cache-only draft model does not
        self.draft: DraftModel | None = None  # the model on a draft trunk (--draft-trunk): what `self` drafts run
        if draft is not None:
            try:
                self.draft = DraftModel(self, DraftPlacer(self.placer, draft, self.config.num_hidden_layers),
                                        draft_topk(config, self.config.num_experts_per_token), config.draft_cache_only)
            except BaseException:
                self.close()
                raise

    def attention_for(self, layer: int) -> AttentionBackend:
        return self._attention[self.config.attention_kind(layer)]

    def new_state(self) -> DecodeState:
        c = self.config
        return DecodeState([self.attention_for(L).new_state(c, L) for L in range(c.num_hidden_layers)])

    def draft_target(self) -> DraftTarget:
        """What this engine offers a draft source (DraftSource.attach)."""
        return DraftTarget(self.config, self.draft, self.embed, self.head_logits)

    def check_ids(self, ids: Sequence[int]) -> None:
        bad = [(i, t) for i, t in enumerate(ids) if not (isinstance(t, (int, np.integer)) and 0 <= t < self.config.vocab_size)]
        if bad:
            shown = ", ".join(f"id {t} at position {i}" for i, t in bad[:5])
            raise InputError(f"token ids must be in 0..{self.config.vocab_size - 1} for this model: {shown}"
                             + (f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""))

    def forward(self, ids: Sequence[int], state: DecodeState, all_logits: bool = False,
                observers: Sequence[Observer] = (), keep_at: Sequence[int] = ()) -> np.ndarray:
        """Consume `ids` after what `state` holds; logits [T, V] if all_logits else [V] (last). `keep_at`: as
        forward_batch's, for this one sequence."""
        return self.forward_batch([(ids, state)], all_logits, observers, [keep_at])[0]

    def forward_batch(self, batch: Sequence[tuple[Sequence[int], DecodeState]],
                      all_logits: bool | Sequence[bool] = False, observers: Sequence[Observer] = (),
                      keep_at: Sequence[Sequence[int]] | None = None) -> list[np.ndarray]:
        """Advance several independent sequences in one pass: `batch` is [(ids, state)], each state its own.
        Every trunk layer is bound once and every distinct expert read once for all the rows; attention runs
        per sequence. Each sequence's logits (as `forward` returns them; `all_logits` for all or, as a list,
        per sequence) are the bits it gets alone. `keep_at`, per sequence: positions (counting every id its state
        holds) inside its rows at which its state is kept in `state.taken` (a prompt cache's checkpoints), for
        `arrays_at` — without cutting the pass there."""
        self._check_batch(batch)
        keeps = self._ask_keep(batch, keep_at)
        every = [bool(all_logits)] * len(batch) if isinstance(all_logits, (bool, int)) else [bool(a) for a in all_logits]
        if len(every) != len(batch):
            raise InputError(f"all_logits names {len(every)} sequences, the batch has {len(batch)}")
        c, kr = self.config, self.kernels
        ids = [int(t) for seq, _ in batch for t in seq]
        ends = np.cumsum([len(seq) for seq, _ in batch]).tolist()
        starts = [0, *ends[:-1]]
        rows = self.placer.embed_rows(ids)
        check_embed_rows(rows, ids)
        stream = Residual(rows)
        hidden = [o for o in observers if getattr(o, "hidden_layers", ())]  # no sum is made unless one asks
        for L in range(c.num_hidden_layers):
            for o in observers:
                o.on_layer(L, c.num_hidden_layers)
            w = self._bound.layer(L, self.placer.layer(L))
            segments = [(a, b, state.layers[L]) for a, b, (_, state) in zip(starts, ends, batch)]
            decoder_layer(L, w, stream, segments, c, kr, self.attention_for(L), self.store, observers, self.cache_only)
            if not np.isfinite(stream.prefix).all():  # say where, instead of sampling from NaN logits
                raise output_error(L, w)
            if asking := [o for o in hidden if L in o.hidden_layers]:
                plain = stream.plain_sum()
                spans = [(a, b, len(state.ids)) for a, b, (_, state) in zip(starts, ends, batch)]
                for o in asking:
                    o.on_hidden(L, plain, spans)
        model = self._bound.model(self.placer.model())
        h = stream.mix(kr, fold(model, PREFIX + "output_attn_res"), c.rms_norm_eps)
        wanted = [range(a, b) if all_ else range(b - 1, b) for a, b, all_ in zip(starts, ends, every)]
        if not all(every):
            h = h[[i for r in wanted for i in r]]
        logits = self._head(h, model)
        for (seq, state), positions in zip(batch, keeps):
            if positions:
                self._take(state, positions)
            state.ids.extend(int(t) for t in seq)
        self.tokens_forwarded += len(ids)
        self.forward_passes += 1
        out, at = [], 0
        for r, all_ in zip(wanted, every):
            out.append(logits[at:at + len(r)] if all_ else logits[at])
            at += len(r)
        return out

    def _head(self, h: np.ndarray, model: Weights) -> np.ndarray:
        """Logits [T, V] of the rows `h` entering the final norm: the norm, then lm_head block by block."""
        kr, c = self.kernels, self.config
        x = kr.rmsnorm(h, model.vec(PREFIX + "norm.weight"), c.rms_norm_eps)
        logits = np.empty((x.shape[0], c.vocab_size), np.float32)
        for row, block in self.placer.head_blocks():
            logits[:, row:row + block.shape[0]] = part = kr.linear(block, x)
            if not np.isfinite(part).all():  # x is finite: the block's rows, or an overflow
                raise head_error(row, block, part)
        return logits

    def head_logits(self, h: np.ndarray) -> np.ndarray:
        """The model's final norm and lm_head on hidden rows `h` float32 [T, H]: logits [T, V] (a draft head's)."""
        h = np.ascontiguousarray(h, np.float32)
        if h.ndim != 2 or h.shape[1] != self.config.hidden_size:
            raise InputError(f"head_logits takes float32 [T, {self.config.hidden_size}], got {list(h.shape)}")
        return self._head(h, self._bound.model(self.placer.model()))

    def embed(self, ids: Sequence[int]) -> np.ndarray:
        """The model's embedding rows of `ids`, float32 [T, H] (a draft head's input)."""
        self.check_ids(ids)
        return self.placer.embed_rows([int(t) for t in ids])

    def _ask_keep(self, batch, keep_at) -> list[list[int]]:
        """Each sequence's keep_at positions inside its rows, relative to its first row, asked of every layer whose
        state has arrays that are not positional (a positional array keeps every row anyway)."""
        keeps = [[] for _ in batch]
        for i, ((seq, state), positions) in enumerate(zip(batch, keep_at or [])):
            keeps[i] = sorted({int(p) - len(state.ids) for p in positions if 0 < p - len(state.ids) < len(seq)})
            if keeps[i]:
                for L, layer_state in enumerate(state.layers):
                    if self.snapshot_names(L):
                        self.attention_for(L).keep_at(layer_state, keeps[i])
        return keeps

    def snapshot_names(self, L: int) -> list[str]:
        """The state arrays of layer L that are not positional (kept whole at a checkpoint)."""
        if L not in self._snapshots:
            backend = self.attention_for(L)
            self._snapshots[L] = [n for n in backend.state_arrays(backend.new_state(self.config, L))
                                  if n not in backend.positional]
        return self._snapshots[L]

    def _take(self, state: DecodeState, positions: Sequence[int]) -> None:
        """After a pass that kept `positions` (relative to its first row): the arrays each layer held there."""
        start = len(state.ids)
        for L, layer_state in enumerate(state.layers):
            backend = self.attention_for(L)
            whole = self.snapshot_names(L)
            kept = backend.kept(layer_state) if whole else {}
            held = backend.state_arrays(layer_state)
            for p in positions:
                arrays = {name: held[name][:start + p] for name in backend.positional}  # views: rows stay put
                if whole:
                    if p not in kept:
                        raise PluginError(f"attention backend {backend.name!r} kept no state at row {p} of the "
                                          f"pass, which keep_at asked of it (layer {L})")
                    arrays.update(kept[p])
                state.taken.setdefault(start + p, []).append(arrays)

    def arrays_at(self, state: DecodeState, position: int | None = None) -> list[dict[str, np.ndarray]]:
        """Each layer's state arrays (views: copy what you keep) at `position`: where the state stands (None), or
        one a forward kept (keep_at), handed out once."""
        if position is None or position == len(state.ids):
            return [self.attention_for(L).state_arrays(s) for L, s in enumerate(state.layers)]
        if position not in state.taken:
            raise K3Error(f"no state kept at position {position} (kept: {sorted(state.taken)}); ask keep_at first")
        return state.taken.pop(position)

    def _check_batch(self, batch: Sequence[tuple[Sequence[int], DecodeState]]) -> None:
        if not batch:
            raise InputError("nothing to forward: the batch is empty")
        if len(batch) > self.sequences:
            raise InputError(f"a batch of {len(batch)} sequences, over the {self.sequences} this engine's memory plan "
                             "reserves decode state for (EngineConfig.sequences, --sequences)")
        if len({id(state) for _, state in batch}) < len(batch):
            raise InputError("one decode state appears twice in a batch: each sequence needs its own")
        for seq, _ in batch:
            if len(seq) == 0:
                raise InputError("nothing to forward: the id list is empty")
            self.check_ids(seq)

    def mark(self, state: DecodeState) -> None:
        """Remember `state`'s position: `rollback` can then return it to any position forwarded after it."""
        for L, layer_state in enumerate(state.layers):
            self.attention_for(L).mark(layer_state)
        state.mark = len(state.ids)

    def rollback(self, state: DecodeState, kept: int) -> None:
        """Keep the marked position plus the first `kept` ids forwarded since (bit for bit the state that
        forwarding only those gives) and drop the mark; `kept` = all of them only drops it."""
        if state.mark is None:
            raise K3Error("rollback without a mark: call Engine.mark(state) before the pass to undo")
        forwarded = len(state.ids) - state.mark
        if not 0 <= kept <= forwarded:
            raise K3Error(f"rollback to {kept} of the {forwarded} positions forwarded since the mark")
        for L, layer_state in enumerate(state.layers):
            self.attention_for(L).rollback(layer_state, kept, self.config, self.kernels)
        del state.ids[state.mark + kept:]
        state.mark = None

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Teacher forcing: the logits at every position of `ids` from a fresh state, [T, V]."""
        return self.forward(ids, self.new_state(), all_logits=True)

    def stats(self) -> dict:
        return {**self.placer.stats(), **self.store.stats(), "tokens_forwarded": self.tokens_forwarded,
                "forward_passes": self.forward_passes}

    def close(self) -> None:
        self.store.close()
        self.placer.close()
        self.checkpoint.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DraftModel(Engine):
    """`target`'s graph on the draft weights `placer` holds with `top_k` routed experts per token — with `cache_only`,
    among those the store holds at the time (it then reads no expert) — : new_state, forward, logits, mark and
    rollback as the engine's (model/engine.py), each state the draft model's own. Draft models of one placer share its
    weights (read once)."""

    def __init__(self, target: Engine, placer: DraftPlacer, top_k: int, cache_only: bool = False):
        most = target.config.num_experts_per_token
        if not (isinstance(top_k, int) and 1 <= top_k <= most):
            raise UsageError(f"the draft's routed experts per token must be an integer in 1..{most} (the model "
                             f"routes each token to {most}), got {top_k!r}")
        self.checkpoint, self.store, self._attention = target.checkpoint, target.store, target._attention
        self.config = replace(target.config, num_experts_per_token=top_k)
        self.kernels, self.placer = DraftKernels(target.kernels, placer.kind), placer
        self.max_context, self.prefill_chunk = target.max_context, target.prefill_chunk
        self.sequences, self.speculate, self.cache_only = 1, target.speculate, cache_only
        self.tokens_forwarded = self.forward_passes = 0
        self._bound, self._snapshots = BindCheck(), {}
        self._kept: list[DecodeState] = []     # states of ended generations, the longest-unused first
        self._in_use, self._most = 0, target.sequences  # states out at once, and alive at once, at most (the plan's)
        self._touched = placer.held + self.config.moe_layers * top_k * expert_bytes(self.checkpoint)  # one id's
        self._read = [0, 0]  # [bytes its forwards read (experts, embedding rows), ids forwarded]

    def forward_batch(self, batch, all_logits=False, observers=(), keep_at=None):
        before = self._disk_bytes()
        out = super().forward_batch(batch, all_logits, observers, keep_at)
        self._read[0] += self._disk_bytes() - before
        self._read[1] += sum(len(ids) for ids, _ in batch)
        return out

    def _disk_bytes(self) -> int:
        """What the shared store and the engine's placer (the embedding rows) have read so far."""
        return self.store.stats().get("expert_bytes_read", 0) + self.placer.target.stats().get("trunk_bytes_read", 0)

    def forward_cost(self) -> tuple[float, float]:
        """(bytes touched in RAM, bytes read from disk) of forwarding one id: the draft trunk and top_k experts a MoE
        layer; and the bytes its forwards have read per id so far (experts, embedding rows; 0 before any)."""
        return float(self._touched), self._read[0] / self._read[1] if self._read[1] else 0.0

    def take_state(self, prompt: Sequence[int]) -> DecodeState:
        """A state for a generation after `prompt`: the kept one holding the longest strict prefix of it (a
        conversation's next turn goes on from its last), else a fresh one."""
        prompt = list(prompt)
        fits = [s for s in self._kept if len(s.ids) < len(prompt) and prompt[:len(s.ids)] == s.ids]
        best = max(fits, key=lambda s: len(s.ids), default=None)
        if best is not None:
            self._kept.remove(best)
        self._in_use += 1
        return best if best is not None else self.new_state()

    def keep_state(self, state: DecodeState) -> None:
        """A generation gives its state back (without a mark); the longest-unused kept states go so that no more than
        the plan's `sequences` are alive."""
        if state.mark is not None:
            raise K3Error("keep_state: the state holds a mark; roll it back first")
        self._in_use = max(0, self._in_use - 1)
        self._kept.append(state)
        del self._kept[:max(0, len(self._kept) + self._in_use - self._most)]

    def close(self) -> None:
        """The checkpoint, the store and the embedding are the engine's: it closes them."""
