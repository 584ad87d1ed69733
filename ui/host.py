"""The one engine a `k3 ui` process serves: opened like `k3 chat` (MODEL_DIR or the saved profile),
guarded by one lock (one forward pass at a time), and reopened with new memory budgets from the
Memory tab. It knows nothing of browser sessions (ui/chat.py) or of Gradio (ui/app.py).
"""
from __future__ import annotations

import copy
import threading

from k3core.model import budget
from k3core.model.budget import check_plan, memory_plan, resolve_budget
from k3core.cli.common import budget_options, open_engine
from k3core.errors import UsageError
from k3core.io.profile import Profile, load_profile, save_profile
from k3core.text.tokenizer import load_tokenizer

PRESET_CHOICES = ["laptop", "desktop", "workstation", "server", "max", "auto", "custom"]


class EngineHost:
    def __init__(self, args):
        """`args`: the parsed `k3 ui` flags (k3core.cli.common.add_engine_args plus --tok)."""
        self.lock = threading.Lock()
        self.engine = open_engine(args)  # fills args.model, trunk and budgets from the profile if needed
        self.args = args
        self.tokenizer = load_tokenizer(getattr(args, "tok", None) or args.model)
        self.generation = 0  # bumped by reload(): decode states of an older generation are void

    @property
    def budget(self) -> dict:
        """The budgets in force (auto resolved to the preset it picked), the trunk and the model."""
        a = self.args
        b = resolve_budget(a.preset, a.trunk_gb, a.cache_gb)
        named = a.preset and a.trunk_gb is None and a.cache_gb is None
        return {"preset": b.preset if named else "custom", "trunk_gb": b.trunk_gb if a.trunk else None,
                "cache_gb": b.cache_gb, "trunk": a.trunk, "model": a.model}

    def _with(self, preset: str | None, trunk_gb: float | None, cache_gb: float | None):
        """A copy of the flags with other budgets: a named preset, or "custom" with explicit GB."""
        if preset not in PRESET_CHOICES:
            raise UsageError(f"preset must be one of {', '.join(PRESET_CHOICES)}, got {preset!r}")
        a = copy.copy(self.args)
        named = preset != "custom"
        a.preset = preset if named else None
        a.trunk_gb = None if named or not a.trunk or not trunk_gb else float(trunk_gb)  # 0 / blank: not given
        a.cache_gb = None if named or cache_gb in (None, "") else float(cache_gb)
        return a

    def preview(self, preset: str | None, trunk_gb=None, cache_gb=None):
        """The memory plan these budgets would give (budget.Plan), without loading anything. The
        running engine's own memory counts as used in `available`."""
        a = self._with(preset, trunk_gb, cache_gb)
        e = self.engine
        return memory_plan(e.checkpoint, type(e.placer), type(e.store), budget_options(a), a.max_context)

    def reload(self, preset: str | None, trunk_gb=None, cache_gb=None, save: bool = False):
        """Close the engine and open it again with these budgets (the old ones come back if the new
        ones fail). Call with no turn running: it takes the engine lock. Returns the new plan."""
        a = self._with(preset, trunk_gb, cache_gb)
        self._check_fits(a)  # before anything is closed: a refusal leaves the running engine as it was
        self._reopen(a)
        if save:
            self.save_profile()
        return self.engine.plan

    def _check_fits(self, a) -> None:
        """The new budgets' plan against what is free once the running engine's memory is released."""
        e = self.engine
        check_plan(memory_plan(e.checkpoint, type(e.placer), type(e.store), budget_options(a), a.max_context,
                               available=budget.mem_available() + e.plan.total))

    def open_profile(self):
        """Switch to the model, trunk and budgets of the saved profile (what `k3 setup` just wrote)."""
        a = copy.copy(self.args)
        a.model = a.trunk = a.tok = a.preset = a.trunk_gb = a.cache_gb = a.pin_layers = None
        self._reopen(a)
        return self.engine.plan

    def _reopen(self, a) -> None:
        with self.lock:
            self.engine.close()
            try:
                self.engine = open_engine(a)  # a.model None: apply_profile fills it in
                tokenizer = load_tokenizer(getattr(a, "tok", None) or a.model)
            except Exception:
                self.engine = open_engine(self.args)
                raise
            finally:
                self.generation += 1
            self.args, self.tokenizer = a, tokenizer

    def save_profile(self):
        """Write the current model, trunk and budgets as the saved profile (keeping its source)."""
        old = load_profile()
        a = self.args
        return save_profile(Profile(model=str(a.model), trunk=a.trunk, preset=a.preset, trunk_gb=a.trunk_gb,
                                    cache_gb=a.cache_gb, source=old.source if old else None))

    def close(self) -> None:
        with self.lock:
            self.engine.close()
