"""k3's front door: what a program embedding k3 uses — engines and their configs, the memory plan,
generation and sampling, sessions and chat, and decode states. Re-exported from `k3core` itself:

    from k3core import EngineConfig, open_engine, load_tokenizer, ChatSession, SamplingParams

    with open_engine(EngineConfig("demo-model")) as engine:
        chat = ChatSession(engine, load_tokenizer("demo-model"))
        for event in chat.ask("What is the capital of France?", SamplingParams(max_tokens=40)):
            print(event.text, end="")

The errors are in k3core.errors (K3Error, the base of them all, is here too), except those that live beside the
code that raises them (k3core.errors imports nothing of k3, so it cannot offer them): ProfileError
(k3core.plan.profile), StateFileError (k3core.model.state_file), LimitError (k3core.files.limits), ChatInputError
(k3core.text.chat), SchemaError (k3core.generation.structured) and SequenceFailed (k3core.generation.batch) among them.

Everything else is imported from the room that holds it (docs/ARCHITECTURE.md lists them): the memory plan's
types (Plan in k3core.plan.budget, PlanRow in k3core.interfaces), the engine's decode state (DecodeState in
k3core.model.engine), the rest of the text and generation rooms (Tokenizer in k3core.text.tokenizer, Reply and
ToolCall in k3core.text.chat, AUTO_K in k3core.generation.generate, Emitted in k3core.generation.batch, Grammar in
k3core.generation.structured, TokenLogprob in k3core.generation.logprobs), the checkpoint format (k3core.format), files on disk (k3core.files, k3core.io), machine
checks and projections (k3core.machine), progress and reports (k3core.report), generated test models
(k3core.testmodel), and the flags a subcommand plugin shares with `k3 run` (k3core.cli.options). draft_source, what
speculation() builds its draft sources with, stays here for the benchmarks that need one alone. Plugins use
k3core.plugin_api.
"""
from __future__ import annotations

from .errors import K3Error, UsageError
from .plan.profile import Profile, load_profile, profile_path
from .model.state_file import load_state, save_state
from .model.draft_weights import open_draft
from .model.engine import Engine
from .model.observer import Observer
from .plan.budget import PRESETS, Plan, auto_preset, mem_available
from .plan.engine_config import EngineConfig, resolve
from .plan.tuned import tuning_for
from .plugin_manager import describe_plugins as _describe
from .plugin_manager import choose_draft, get_plugin_manager, new_plugin_manager
from .generation.batch import BatchGenerator
from .text.chat import Conversation
from .generation.chat_session import ChatSession
from .generation.channels import Event
from .generation.generate import AUTO_K, Speculation, generate_ids, greedy_ids
from .generation.logprobs import token_logprobs
from .generation.sampling import Sampler, SamplingParams
from .generation.session import Session
from .generation.prefix_cache import PrefixCache
from .generation.structured import chat_grammar
from .text.tokenizer import load_tokenizer

__all__ = [
    # engines, their configs and the memory plan
    "EngineConfig", "open_engine", "Engine", "Observer", "memory_plan", "PRESETS", "auto_preset", "mem_available",
    "config_from_profile", "check_checkpoint", "describe_plugins",
    # generation
    "generate_ids", "greedy_ids", "Sampler", "SamplingParams", "speculation", "Speculation", "BatchGenerator",
    "token_logprobs", "chat_grammar",
    # text, chat and sessions
    "load_tokenizer", "Session", "ChatSession", "Conversation", "Event",
    # decode states
    "PrefixCache", "save_state", "load_state",
    # the base of every error (the others: k3core.errors)
    "K3Error",
]


def open_engine(config: EngineConfig, *, on_plan=None, plugins=(), available: int | None = None) -> Engine:
    """Open the engine `config` describes. The memory plan is made first and handed to `on_plan`
    (e.g. to print it); a plan that does not fit is a PlanError before anything loads. `plugins`:
    extra in-process plugin objects (modules or objects with @hookimpl methods), used as if installed."""
    return Engine(config, pm=_manager(plugins), on_plan=on_plan, available=available)


def memory_plan(config: EngineConfig, *, available: int | None = None, plugins=()) -> Plan:
    """The memory plan `open_engine(config)` would make, without loading anything. `available` (bytes)
    replaces MemAvailable, e.g. to count memory a running engine will give back."""
    r = resolve(config, _manager(plugins))
    try:
        open_draft(r)
        return r.plan(available)
    finally:
        r.checkpoint.close()


def check_checkpoint(model_dir) -> None:
    """Open a checkpoint's config and every shard header and check each tensor the config implies
    (name, shape, dtype); a problem is a ConfigError / CheckpointError / BindingError naming it."""
    resolve(EngineConfig(model_dir)).checkpoint.close()


def describe_plugins(plugins=()) -> list[dict]:
    """Every plugin: name, version, where it comes from, its hooks and what each provides."""
    return _describe(_manager(plugins))


def draft_source(spec: str = "ngram", plugins=()):
    """The draft source `spec` names, built: "ngram", "replay:PATH", or an installed plugin's NAME[:ARGUMENT]."""
    return choose_draft(_manager(plugins), spec)


AUTO_SOURCES = ("suffix", "self")  # what --draft auto chooses among, each pass (self where the engine has a draft)


def speculation(draft: str = "ngram", k: int | str = "auto", plugins=()) -> Speculation:
    """Speculative decoding settings for Session.generate / ChatSession.ask / generate_ids: the draft source
    `draft` names — or "auto": each pass the one of AUTO_SOURCES that promises the fewest bytes per emitted id
    (generation/generate.py Drafting) — and `k` drafted ids per pass, or "auto" (adaptive, up to AUTO_K). The engine
    must have been opened with EngineConfig(speculate=...) at least that large."""
    first, *rest = [draft_source(name, plugins) for name in (AUTO_SOURCES if draft == "auto" else (draft,))]
    if k == "auto":
        return Speculation(first, AUTO_K, adaptive=True, alternatives=tuple(rest))
    return Speculation(first, k, alternatives=tuple(rest))


def _manager(plugins):
    return new_plugin_manager(plugins) if plugins else get_plugin_manager()


def config_from_profile(profile: Profile | None = None, *, tuned: bool = True, **overrides) -> EngineConfig:
    """The saved profile (`k3 setup` writes it) as an EngineConfig; `overrides` replace fields. Budgets
    given in `overrides` replace the profile's preset and budgets together. With `tuned`, the settings `k3 tune`
    saved fill every field no override sets (when they were measured on this machine: plan/tuned.py)."""
    profile = profile or load_profile()
    if profile is None:
        raise UsageError(f"no model given and no saved profile at {profile_path()}: run `k3 setup` "
                         "(or `k3 setup --source demo --yes` for the demo model), or give MODEL_DIR")
    fields = {"model": profile.model, "trunk": profile.trunk}
    given = {k: v for k, v in overrides.items() if v is not None}
    chosen = tuning_for(profile)[0] if tuned else None
    if chosen is not None:
        given = chosen.fill(given)
    if not any(given.get(k) is not None for k in ("preset", "trunk_gb", "cache_gb")):
        fields.update(preset=profile.preset, trunk_gb=profile.trunk_gb, cache_gb=profile.cache_gb)
    return EngineConfig(**{**fields, **{k: v for k, v in given.items() if v is not None}})
