"""Conformance checks of a trunk placer class: every tensor it hands out is the checkpoint's own bytes
(each layer, in order, over several passes; the model-level tensors; embedding rows; every lm_head
row once, in order), its plan rows and counters are sound, and ids and logit bytes are identical to
the built-in `resident` placer at several budgets. Placers that need a packed trunk get one."""
from __future__ import annotations

from functools import partial

import numpy as np

from ..errors import UsageError
from ..hookspecs import hookimpl
from ..interfaces import Budget, PluginContext
from ..format.checkpoint import HEAD, PREFIX, layer_prefix, layer_trunk_specs, model_specs, open_checkpoint
from ..plugin_manager import choose_attention, get_plugin_manager
from . import models
from .checks import Check, CheckFailed, expect
from .engines import greedy_run


def offering(cls):
    """An in-process plugin that offers `cls` through k3_trunk_placers."""
    class Offer:
        @hookimpl
        def k3_trunk_placers(self):
            return [cls]
    return Offer()


def budgets(shape: str, config) -> list[Budget]:
    """With a packed trunk: nothing pinned, some layers, every layer; and no trunk at all."""
    trunk = models.packed_trunk(shape)
    n = config.num_hidden_layers
    return [Budget(cache_gb=1.0, trunk_dir=trunk, pinned_layers=k, ring_slots=ring)
            for k, ring in ((0, 2), (n // 2, 3), (n, 2))] + [Budget(cache_gb=1.0)]


def _contexts(cls, checkpoint, shape, options):
    """(budget, context) for each budget this placer can plan for (a UsageError means it needs another)."""
    out = []
    for budget in budgets(shape, checkpoint.config):
        ctx = PluginContext(checkpoint, budget, cls.Options.build(options, f"trunk placer {cls.name!r}"))
        try:
            cls.plan(ctx)
        except UsageError:
            continue
        out.append((budget, ctx))
    if not out:
        raise CheckFailed("plan() refused every budget: with and without a packed trunk, pinned or not")
    return out


def _same(param, want: np.ndarray, what: str) -> None:
    have = np.asarray(param.data)
    if have.shape != want.shape or have.tobytes() != want.tobytes():
        raise CheckFailed(f"{what}: not the checkpoint's bytes (shape {have.shape}, expected {want.shape})")


def serves_the_checkpoint_bytes(cls, options) -> None:
    for shape in ("tiny", "small"):
        ckpt = open_checkpoint(models.model(shape))
        try:
            c, index = ckpt.config, ckpt.index
            pm = get_plugin_manager()
            attention = {kind: choose_attention(pm, kind, kind) for kind in c.attention_kinds}
            for budget, ctx in _contexts(cls, ckpt, shape, options):
                where = f"{shape} model, {budget.pinned_layers if budget.trunk_dir else 'no'} pinned"
                placer = cls(ctx)
                try:
                    for visit in range(2):  # layers are handed out in order, pass after pass
                        for L in range(c.num_hidden_layers):
                            w = placer.layer(L)
                            for spec in layer_trunk_specs(c, L, attention[c.attention_kind(L)]):
                                _same(w[spec.name], index.read(layer_prefix(L) + spec.name),
                                      f"{where}, pass {visit}: layer {L} {spec.name}")
                        m = placer.model()
                        for spec in model_specs(c):
                            if spec.name not in (HEAD, PREFIX + "embed_tokens.weight"):
                                _same(m[spec.name], index.read(spec.name), f"{where}: {spec.name}")
                        ids = [0, c.vocab_size - 1, 7, 7]
                        embed = index.read(PREFIX + "embed_tokens.weight")[ids]
                        rows = placer.embed_rows(ids)
                        want = (embed.astype(np.uint32) << 16).view(np.float32)
                        expect(rows.dtype == np.float32 and rows.tobytes() == want.tobytes(),
                               f"{where}: embed_rows({ids}) is not those rows widened to float32")
                        head, at = index.read(HEAD), 0
                        for row, block in placer.head_blocks():
                            expect(row == at, f"{where}: lm_head block starts at row {row}, expected {at}")
                            _same(block, head[row:row + block.shape[0]], f"{where}: lm_head rows {row}..")
                            at += block.shape[0]
                        expect(at == head.shape[0], f"{where}: lm_head blocks cover {at} of {head.shape[0]} rows")
                finally:
                    placer.close()
        finally:
            ckpt.close()



def plan_and_counters(cls, options) -> None:
    ckpt = open_checkpoint(models.model("tiny"))
    try:
        for budget, ctx in _contexts(cls, ckpt, "tiny", options):
            rows = cls.plan(ctx)
            expect(isinstance(rows, list) and all(len(r) == 3 and isinstance(r[1], int) and r[1] >= 0
                                                  for r in rows),
                   f"plan() must return (item, bytes >= 0, detail) rows, got {rows!r}")
            placer = cls(ctx)
            try:
                placer.layer(0)
                read = placer.stats().get("trunk_bytes_read")
                expect(isinstance(read, int) and not isinstance(read, bool) and read >= 0,
                       f"stats()['trunk_bytes_read'] must be an int >= 0, got {read!r} (see plugin_api.PLACER_STATS)")
            finally:
                placer.close()
    finally:
        ckpt.close()



def _read_after(cls, ctx, passes: int) -> int:
    """trunk_bytes_read once `passes` passes (every layer, the model tensors, lm_head) are done and the placer is
    closed (so no read-ahead is still in flight)."""
    placer = cls(ctx)
    try:
        for _ in range(passes):
            for L in range(ctx.config.num_hidden_layers):
                placer.layer(L)
            placer.model()
            for _ in placer.head_blocks():
                pass
    finally:
        placer.close()
    return placer.stats()["trunk_bytes_read"]


def streamed_bytes_is_a_pass(cls, options) -> None:
    ckpt = open_checkpoint(models.model("tiny"))
    try:
        for budget, ctx in _contexts(cls, ckpt, "tiny", options):
            said = cls.streamed_bytes(ctx)
            read = _read_after(cls, ctx, 2) - _read_after(cls, ctx, 1)
            expect(said == read, f"{budget.pinned_layers if budget.trunk_dir else 'no'} layers pinned: "
                   f"streamed_bytes() says a pass reads {said!r} bytes of trunk, one more pass read {read} "
                   "(trunk_bytes_read): what --prefill-chunk auto weighs")
    finally:
        ckpt.close()


def same_ids_as_resident(cls, options) -> None:
    for shape in ("tiny", "small"):
        want = greedy_run(models.model(shape), trunk_placer="resident")
        ckpt = open_checkpoint(models.model(shape))
        try:
            chosen = [b for b, _ in _contexts(cls, ckpt, shape, options)]
        finally:
            ckpt.close()
        for b in chosen:
            got = greedy_run(models.model(shape), plugins=[offering(cls)], trunk_placer=cls.name,
                             trunk=b.trunk_dir, pin_layers=b.pinned_layers, ring=b.ring_slots,
                             placer_options=options)
            where = f"{shape} model, " + (f"{b.pinned_layers} layers pinned, ring {b.ring_slots}" if b.trunk_dir
                                          else "no packed trunk")
            expect(got[0] == want[0], f"{where}: ids {got[0]} instead of the resident placer's {want[0]}")
            expect(got[1] == want[1], f"{where}: the logit bytes differ from the resident placer's")


def placer_checks(cls, options=None) -> list[Check]:
    """Every check of trunk placer class `cls` (with its `options`)."""
    who = f"trunk placer {cls.name!r}"
    return [Check(f"{who}: hands out the checkpoint's own bytes for every layer, pass after pass, the embedding "
                  "rows and every lm_head row", partial(serves_the_checkpoint_bytes, cls, options)),
            Check(f"{who}: plan() rows and stats()['trunk_bytes_read'] are sound",
                  partial(plan_and_counters, cls, options)),
            Check(f"{who}: streamed_bytes() is what one more pass reads",
                  partial(streamed_bytes_is_a_pass, cls, options)),
            Check(f"{who}: ids and logit bytes identical to the resident placer at several budgets",
                  partial(same_ids_as_resident, cls, options))]
