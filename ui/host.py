"""The one engine a `k3 ui` process serves: opened from an EngineConfig (MODEL_DIR or the saved profile),
guarded by one lock (one forward pass at a time), and reopened with new memory budgets from the
Memory tab. It knows nothing of browser sessions (ui/chat.py) or of Gradio (ui/app.py).
"""
from __future__ import annotations

import threading
from pathlib import Path

from k3core import EngineConfig, config_from_profile, load_tokenizer, memory_plan, open_engine
from k3core.errors import UsageError
from k3core.plan.profile import Profile, load_profile, save_profile
from k3core.report.run import rss_bytes

PRESET_CHOICES = ["laptop", "desktop", "workstation", "server", "max", "auto", "custom"]


class EngineHost:
    def __init__(self, config: EngineConfig, speculation=lambda: None, prompt_cache=lambda engine, tokenizer: None):
        """`prompt_cache(engine, tokenizer)`: the PrefixCache the page's sessions and /v1 share (None: none), made
        again for each engine opened."""
        self.lock = threading.Lock()
        self.config = config
        self.speculation = speculation  # a fresh k3core.Speculation for each turn, or None (k3 ui --speculate)
        spec = speculation()
        self.draft = spec.draft.name if spec is not None else None  # the draft source's name, for the panel
        # what this process holds besides the engine, from the OS (the panel's baseline): its RSS just before the
        # engine opens, to which ui/server.py adds what loading the page (Gradio) takes after
        self.rss_outside_engine = rss_bytes()
        self.engine = open_engine(config)
        self.tokenizer = load_tokenizer(config.tokenizer or config.model)
        self._cache_of = prompt_cache
        self.prompt_cache = prompt_cache(self.engine, self.tokenizer)
        self.generation = 0  # bumped by reload(): decode states of an older generation are void

    @property
    def model(self) -> Path:
        return Path(self.config.model)

    @property
    def budget(self) -> dict:
        """The budgets in force (auto resolved to the preset it picked), the trunk and the model."""
        c = self.config
        b = c.budget()
        named = c.preset and c.trunk_gb is None and c.cache_gb is None
        return {"preset": b.preset if named else "custom", "trunk_gb": b.trunk_gb, "cache_gb": b.cache_gb,
                "trunk": None if c.trunk is None else str(c.trunk), "model": str(c.model)}

    def _with(self, preset: str | None, trunk_gb: float | None, cache_gb: float | None) -> EngineConfig:
        """The config with other budgets: a named preset, or "custom" with explicit GB."""
        if preset not in PRESET_CHOICES:
            raise UsageError(f"preset must be one of {', '.join(PRESET_CHOICES)}, got {preset!r}")
        if preset != "custom":
            return self.config.replace(preset=preset, trunk_gb=None, cache_gb=None)
        return self.config.replace(preset=None, trunk_gb=float(trunk_gb) if self.config.trunk and trunk_gb else None,
                                   cache_gb=None if cache_gb in (None, "") else float(cache_gb))  # 0 / blank: not given

    def budget_of(self, preset: str | None, trunk_gb=None, cache_gb=None) -> dict:
        """The budgets these choices give, as `budget` says them (auto resolved now, from MemAvailable; trunk_gb
        None without a packed trunk), without opening anything."""
        b = self._with(preset, trunk_gb, cache_gb).budget()
        return {"preset": b.preset, "trunk_gb": b.trunk_gb, "cache_gb": b.cache_gb}

    def preview(self, preset: str | None, trunk_gb=None, cache_gb=None):
        """The memory plan these budgets would give, without loading anything. The running engine's own
        memory counts as used in `available`."""
        return memory_plan(self._with(preset, trunk_gb, cache_gb))

    def reload(self, preset: str | None, trunk_gb=None, cache_gb=None, save: bool = False):
        """Close the engine and open it again with these budgets (the old ones come back if the new
        ones fail). Call with no turn running: it takes the engine lock. Returns the new plan."""
        config = self._with(preset, trunk_gb, cache_gb)
        # before anything is closed: a refusal leaves the running engine as it was
        plan = memory_plan(config)
        plan.available += self.engine.plan.total  # what closing the running engine gives back
        plan.check()
        self._reopen(config)
        if save:
            self.save_profile()
        return self.engine.plan

    def open_profile(self):
        """Switch to the model, trunk and budgets of the saved profile (what `k3 setup` just wrote); the
        other engine options stay as they are."""
        c = self.config
        self._reopen(config_from_profile(kernels=c.kernels, threads=c.threads, attention=c.attention,
                                         trunk_placer=c.trunk_placer, expert_store=c.expert_store, ring=c.ring,
                                         max_context=c.max_context, placer_options=c.placer_options,
                                         store_options=c.store_options, speculate=c.speculate,
                                         sequences=c.sequences, kept_states=c.kept_states,
                                         prompt_cache_gb=c.prompt_cache_gb, prefill_chunk=c.prefill_chunk))
        return self.engine.plan

    def _reopen(self, config: EngineConfig) -> None:
        with self.lock:
            self.engine.close()
            self.rss_outside_engine = rss_bytes()  # the page's included: it is loaded by now
            try:
                self.engine = open_engine(config)
                tokenizer = load_tokenizer(config.tokenizer or config.model)
            except Exception:
                self.engine = open_engine(self.config)
                raise
            else:
                self.config, self.tokenizer = config, tokenizer
            finally:
                self.generation += 1
                self.prompt_cache = self._cache_of(self.engine, self.tokenizer)  # over the engine now open

    def save_profile(self):
        """Write the current model, trunk and budgets as the saved profile (keeping its source)."""
        old, c = load_profile(), self.config
        return save_profile(Profile(model=str(c.model), trunk=None if c.trunk is None else str(c.trunk),
                                    preset=c.preset, trunk_gb=c.trunk_gb, cache_gb=c.cache_gb,
                                    source=old.source if old else None))

    def close(self) -> None:
        with self.lock:
            self.engine.close()
