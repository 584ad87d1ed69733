"""k3's front door: everything a program embedding k3 uses, and all that k3's own command line,
browser UI and setup wizard use. Re-exported from `k3core` itself:

    from k3core import EngineConfig, open_engine, load_tokenizer, ChatSession, SamplingParams

    with open_engine(EngineConfig("demo-model")) as engine:
        chat = ChatSession(engine, load_tokenizer("demo-model"))
        for event in chat.ask("What is the capital of France?", SamplingParams(max_tokens=40)):
            print(event.text, end="")

Plugins use k3core.plugin_api instead; nothing here is needed to write one.
"""
from __future__ import annotations

from pathlib import Path

from .errors import (BindingError, CheckpointError, ConfigError, InputError, K3Error, PlanError, PluginError,
                     TokenizerError, TrunkError, UnsoundRunError, UsageError)
from .cli.common import EXIT_CODES, add_engine_args, add_speculation_args, engine_config
from .cli.common import speculation as speculation_of_args
from .cli.progress import PackMeter, ProgressMeter
from .cli.doctor import TRUNK_BYTES as RELEASED_TRUNK_BYTES
from .cli.doctor import Target, measure_read, run_checks
from .cli.logs import add_logging_args as add_logging_arguments
from .cli.logs import configure_logging
from .interfaces import Budget, PlanRow
from .io.atomic import write_json_atomic
from .io.codec import CODECS as TRUNK_CODECS
from .io.limits import INDEX_FILE_BYTES, SMALL_FILE_BYTES, LimitError, loads_limited, read_json_limited
from .io.pack import pack, packed_size, packed_size_of_headers
from .io.tensor_sums import ShardSums
from .io.profile import Profile, ProfileError, load_profile, profile_path, save_profile
from .io.state_file import StateFileError, load_state, save_state
from .model.budget import PRESETS, WORKING_BYTES, Plan, auto_preset, human, mem_available
from .model.checkpoint import VISION_PREFIXES, open_checkpoint
from .model.cost import CodecChoice, choose_codec
from .model.engine import DecodeState, Engine, Observer
from .model.engine_config import PRESET_NAMES, EngineConfig, resolve
from .model.report import peak_rss_bytes
from .model.testmodel import MARKER as TEST_MODEL_MARKER
from .model.testmodel import make_model, planned_bytes, shape_config
from .plugin_manager import describe_plugins as _describe
from .plugin_manager import choose_draft, get_plugin_manager, new_plugin_manager
from .text.channels import Channels, Event, TextStream, visible
from .text.chat import build_ids as build_chat_ids
from .text.chat import (ChatInputError, Conversation, Reply, ToolCall, forced_tool_prefix, parse_tool_calls,
                        render as render_chat, split_reply, tool_call_markup)
from .text.chat_session import ChatSession
from .text.batch import BatchGenerator, Emitted
from .text.generate import AUTO_K, Speculation, generate_ids, greedy_ids
from .text.logprobs import TokenLogprob, token_logprobs
from .text.sampling import Sampler, SamplingParams
from .text.session import Session
from .text.structured import MAX_SCHEMA_BYTES, Grammar, SchemaError, chat_grammar, schema_text
from .text.state_cache import StateCache
from .text.tokenizer import Tokenizer, load_tokenizer

__all__ = [
    # engines
    "EngineConfig", "open_engine", "memory_plan", "Engine", "DecodeState", "Observer", "Plan", "PlanRow",
    "Budget", "PRESETS", "PRESET_NAMES", "WORKING_BYTES", "auto_preset", "mem_available", "peak_rss_bytes",
    "describe_plugins", "check_checkpoint", "scan_weights", "record_tensor_sums", "ShardSums", "model_note",
    # generation and text
    "generate_ids", "greedy_ids", "Speculation", "speculation", "draft_source", "AUTO_K", "BatchGenerator", "Emitted",
    "Sampler", "SamplingParams", "Session", "Grammar", "SchemaError", "chat_grammar", "schema_text",
    "MAX_SCHEMA_BYTES", "ChatSession", "Conversation", "Event", "visible", "Tokenizer",
    "load_tokenizer", "StateCache", "render_chat", "split_reply", "Reply", "ToolCall", "tool_call_markup",
    "parse_tool_calls", "forced_tool_prefix", "build_chat_ids", "TextStream", "Channels", "token_logprobs",
    "TokenLogprob",
    # files: profile, decode states, packed trunks, test models
    "Profile", "load_profile", "save_profile", "profile_path", "config_from_profile", "save_state", "load_state",
    "pack_trunk", "PackMeter", "ProgressMeter", "packed_trunk_bytes", "make_test_model", "generated_model_bytes", "TEST_MODEL_MARKER", "write_json_atomic",
    "human", "VISION_PREFIXES",
    # bounded input: files read whole and JSON parsed within the limits of docs/LIMITS.md
    "LimitError", "loads_limited", "read_json_limited", "SMALL_FILE_BYTES", "INDEX_FILE_BYTES",
    # the machine
    "machine_checks", "measure_read", "RELEASED_TRUNK_BYTES", "choose_trunk_codec", "CodecChoice", "TRUNK_CODECS",
    # a subcommand that runs the engine takes the same flags as `k3 run`
    "add_engine_arguments", "engine_config_from_args", "add_speculation_arguments", "speculation_from_args", "EXIT_CODES", "add_logging_arguments", "configure_logging",
    # errors
    "K3Error", "UsageError", "ConfigError", "CheckpointError", "BindingError", "TrunkError", "InputError",
    "TokenizerError", "PluginError", "PlanError", "UnsoundRunError", "ProfileError", "StateFileError",
    "ChatInputError",
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
        return r.plan(available)
    finally:
        r.checkpoint.close()


def check_checkpoint(model_dir) -> None:
    """Open a checkpoint's config and every shard header and check each tensor the config implies
    (name, shape, dtype); a problem is a ConfigError / CheckpointError / BindingError naming it."""
    resolve(EngineConfig(model_dir)).checkpoint.close()


def record_tensor_sums(model_dir, progress=None, jobs: int = 4, known: dict | None = None) -> Path:
    """Read every tensor of the checkpoint in `model_dir` and record its checksum in k3-tensor-sums.bin there:
    what every later read from the checkpoint (experts, a resident trunk) is checked against. `progress(done_bytes,
    total_bytes)` as it reads; `jobs` shards at a time; `known`: {shard path: ShardSums} a hash pass already fed
    (those shards are not read again). Returns the file's path."""
    from .io import tensor_sums
    from .io.safetensors_index import ShardIndex

    return tensor_sums.record(ShardIndex.open(model_dir), progress, jobs, known)


def scan_weights(model_dir, progress=None) -> dict:
    """Read every tensor of a checkpoint: {"non_finite": [(tensor, count)], "scale_255": [(tensor, count)]} —
    BF16/F16/F32 values that are NaN or infinite (a damaged checkpoint), and E8M0 scale bytes of 255 (legal:
    SPEC §5 reads such a group as zeros; worth knowing). `progress(done_bytes, total_bytes, name)` if given."""
    import numpy as np

    checkpoint = open_checkpoint(model_dir)
    index, out = checkpoint.index, {"non_finite": [], "scale_255": []}
    try:
        names = list(index.names())
        total, done = sum(index[n].nbytes for n in names), 0
        for name in names:
            info, data = index[name], index.read(name)
            if info.dtype in ("BF16", "F16"):
                bad = int(np.count_nonzero((data.view(np.uint16) & (0x7F80 if info.dtype == "BF16" else 0x7C00))
                                           == (0x7F80 if info.dtype == "BF16" else 0x7C00)))
            elif info.dtype in ("F32", "F64"):
                bad = int(np.count_nonzero(~np.isfinite(data)))
            else:
                bad = 0
            if bad:
                out["non_finite"].append((name, bad))
            if info.dtype == "U8" and name.endswith(".weight_scale") and (n255 := int(np.count_nonzero(data == 255))):
                out["scale_255"].append((name, n255))
            done += info.nbytes
            if progress:
                progress(done, total, name)
    finally:
        checkpoint.close()
    return out


def describe_plugins(plugins=()) -> list[dict]:
    """Every plugin: name, version, where it comes from, its hooks and what each provides."""
    return _describe(_manager(plugins))


def draft_source(spec: str = "ngram", plugins=()):
    """The draft source `spec` names, built: "ngram", "replay:PATH", or an installed plugin's NAME[:ARGUMENT]."""
    return choose_draft(_manager(plugins), spec)


def speculation(draft: str = "ngram", k: int | str = "auto", plugins=()) -> Speculation:
    """Speculative decoding settings for Session.generate / ChatSession.ask / generate_ids: the draft source
    `draft` names, and `k` drafted ids per pass, or "auto" (adaptive, up to AUTO_K). The engine must have
    been opened with EngineConfig(speculate=...) at least that large."""
    if k == "auto":
        return Speculation(draft_source(draft, plugins), AUTO_K, adaptive=True)
    return Speculation(draft_source(draft, plugins), k)


def _manager(plugins):
    return new_plugin_manager(plugins) if plugins else get_plugin_manager()


def config_from_profile(profile: Profile | None = None, **overrides) -> EngineConfig:
    """The saved profile (`k3 setup` writes it) as an EngineConfig; `overrides` replace fields. Budgets
    given in `overrides` replace the profile's preset and budgets together."""
    profile = profile or load_profile()
    if profile is None:
        raise UsageError(f"no model given and no saved profile at {profile_path()}: run `k3 setup` "
                         "(or `k3 setup --source demo --yes` for the demo model), or give MODEL_DIR")
    fields = {"model": profile.model, "trunk": profile.trunk}
    if not any(overrides.get(k) is not None for k in ("preset", "trunk_gb", "cache_gb")):
        fields.update(preset=profile.preset, trunk_gb=profile.trunk_gb, cache_gb=profile.cache_gb)
    return EngineConfig(**{**fields, **{k: v for k, v in overrides.items() if v is not None}})


DEMO_MARKER = "k3-demo-model.json"  # written by demo/train.py beside the demo checkpoint
DEMO_NOTE = ("the k3 demo model: a tiny model with the Kimi K3 architecture, trained to answer capitals, small sums, "
             "colours, opposites and greetings; it is not Kimi K3")


def model_note(model_dir) -> str | None:
    """One line that says what a checkpoint is when it is not the released model (the demo, a test model)."""
    root = Path(model_dir)
    if (root / DEMO_MARKER).is_file():
        return DEMO_NOTE
    if (root / TEST_MODEL_MARKER).is_file():
        return "a generated test model: random weights in the real K3 format; it streams tokens, not sense"
    return None


def pack_trunk(model_dir, trunk_dir, *, progress=None, say=None, codec: str = "raw"):
    """`k3 pack`: the checkpoint's trunk into one aligned file (resumable; see k3 pack --help), its runs stored
    with `codec` (raw, or planes: lossless, ~0.67× the bytes)."""
    return pack(model_dir, trunk_dir, progress=progress, say=say, codec=codec)


def packed_trunk_bytes(source) -> int:
    """Bytes `k3 pack` will write: `source` is a checkpoint directory, or {shard name: parsed header}."""
    if isinstance(source, dict):
        return packed_size_of_headers(source)
    checkpoint = open_checkpoint(source)
    try:
        return packed_size(checkpoint.index)
    finally:
        checkpoint.close()


def make_test_model(directory, shape: str = "tiny", seed: int = 0, layout: str = "nested", **kw):
    """A generated checkpoint in the real format (k3 make-model): random weights, the same bytes for
    the same shape and seed. Returns its directory."""
    return make_model(directory, shape, seed, layout, **kw)


def generated_model_bytes(shape: str) -> int:
    """The size `make_test_model` writes for `shape`."""
    return planned_bytes(shape_config(shape))


def machine_checks(path: str, read_mb: int = 64, *, name: str | None = None, checkpoint_bytes: int | None = None,
                   trunk_bytes: int | None = None) -> list:
    """`k3 doctor`'s checks for a model stored under `path` (CPU, build, RAM, disk speed, O_DIRECT), sized for
    the released Kimi K3 unless `name` and the sizes of another checkpoint (the demo model) are given."""
    if name is None:
        return run_checks(path, read_mb)
    return run_checks(path, read_mb, Target(name, checkpoint_bytes, trunk_bytes or checkpoint_bytes))


def choose_trunk_codec(disk_bytes_per_second: float, cores: int | None = None, seconds: float = 0.3) -> CodecChoice:
    """The trunk codec (`k3 pack --codec`) this machine streams the full model faster with, from the disk rate
    given (`k3 doctor`'s disk read) and the restore and bf16 kernel rates measured here on every core at once,
    as a token uses them (memory bandwidth is shared), for about `seconds` apiece (model/cost.py: a projection,
    printed with its rates by `k3 setup`)."""
    import os

    from .cli.bench import bf16_gemv_sweep, timed
    from .cli.bench_codec import gaussian_restore_rate

    cores = cores or len(os.sched_getaffinity(0))
    sweep, nbytes = bf16_gemv_sweep(cores)
    compute = nbytes / timed(sweep, seconds)["median_s"] / cores
    return choose_codec(disk_bytes_per_second, cores, gaussian_restore_rate(seconds, threads=cores) / cores, compute)


def add_engine_arguments(parser) -> None:
    """The engine and budget flags of `k3 run` (MODEL_DIR, --kernels, --trunk, --preset, …)."""
    add_engine_args(parser)


def engine_config_from_args(args) -> EngineConfig:
    """The EngineConfig of parsed engine flags; no MODEL_DIR means the saved profile."""
    return engine_config(args)


def add_speculation_arguments(parser) -> None:
    """`k3 run`'s --speculate K|auto and --draft NAME (engine_config_from_args reserves the rollback they need)."""
    add_speculation_args(parser)


def speculation_from_args(args) -> Speculation | None:
    """A fresh Speculation for one generation as --speculate / --draft ask, or None when they are not given."""
    return speculation_of_args(args)
