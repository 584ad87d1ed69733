"""The model config: read config.json (nested or flat layout) into a frozen, validated Config.

Every missing or ill-typed field is reported in one ConfigError; nothing is ever defaulted
except the three optional booleans MODEL.md §2 names. Validation rules are MODEL.md §2's.
"""
from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from dataclasses import dataclass, fields
from pathlib import Path

from ..errors import ConfigError
from ..files.limits import SMALL_FILE_BYTES, loads_limited, read_limited

# (our name, nested key path, flat key, type). Nested paths are relative to text_config.
_REQUIRED = [
    ("hidden_size", ("hidden_size",), "hidden_size", int),
    ("num_hidden_layers", ("num_hidden_layers",), "num_hidden_layers", int),
    ("vocab_size", ("vocab_size",), "vocab_size", int),
    ("rms_norm_eps", ("rms_norm_eps",), "rms_norm_eps", float),
    ("kda_num_heads", ("linear_attn_config", "num_heads"), "kda_num_heads", int),
    ("kda_head_dim", ("linear_attn_config", "head_dim"), "kda_head_dim", int),
    ("short_conv_kernel_size", ("linear_attn_config", "short_conv_kernel_size"), "short_conv_kernel_size", int),
    ("gate_lower_bound", ("linear_attn_config", "gate_lower_bound"), "gate_lower_bound", float),
    ("full_attn_layers", ("linear_attn_config", "full_attn_layers"), "full_attn_layers", list),
    ("num_attention_heads", ("num_attention_heads",), "num_attention_heads", int),
    ("q_lora_rank", ("q_lora_rank",), "q_lora_rank", int),
    ("kv_lora_rank", ("kv_lora_rank",), "kv_lora_rank", int),
    ("qk_nope_head_dim", ("qk_nope_head_dim",), "qk_nope_head_dim", int),
    ("qk_rope_head_dim", ("qk_rope_head_dim",), "qk_rope_head_dim", int),
    ("v_head_dim", ("v_head_dim",), "v_head_dim", int),
    ("num_experts", ("num_experts",), "num_experts", int),
    ("num_experts_per_token", ("num_experts_per_token",), "num_experts_per_token", int),
    ("num_shared_experts", ("num_shared_experts",), "num_shared_experts", int),
    ("routed_expert_hidden_size", ("routed_expert_hidden_size",), "routed_expert_hidden_size", int),
    ("moe_intermediate_size", ("moe_intermediate_size",), "moe_intermediate_size", int),
    ("routed_scaling_factor", ("routed_scaling_factor",), "routed_scaling_factor", float),
    ("first_k_dense_replace", ("first_k_dense_replace",), "first_k_dense_replace", int),
    ("intermediate_size", ("intermediate_size",), "intermediate_size", int),
    ("attn_res_block_size", ("attn_res_block_size",), "attn_res_block_size", int),
    ("situ_beta", ("activation_situ_beta",), "situ_beta", float),
    ("situ_linear_beta", ("activation_situ_linear_beta",), "situ_linear_beta", float),
]
# Optional booleans, default true (MODEL.md §2).
_OPTIONAL_BOOLS = [
    ("mla_use_output_gate", ("mla_use_output_gate",), "mla_use_output_gate"),
    ("moe_renormalize", ("moe_renormalize",), "moe_renormalize"),
    ("latent_moe_use_norm", ("latent_moe_use_norm",), "latent_moe_use_norm"),
]
MXFP4_GROUP = 32
INT_LIMIT = 2**31 - 1  # any count or width above this is a damaged file, not a model


@dataclass(frozen=True)
class Config:
    hidden_size: int
    num_hidden_layers: int
    vocab_size: int
    rms_norm_eps: float
    kda_num_heads: int
    kda_head_dim: int
    short_conv_kernel_size: int
    gate_lower_bound: float
    full_attn_layers: tuple[int, ...]  # ONE-based layer numbers of the MLA layers
    num_attention_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    num_experts: int
    num_experts_per_token: int
    num_shared_experts: int
    routed_expert_hidden_size: int
    moe_intermediate_size: int
    routed_scaling_factor: float
    first_k_dense_replace: int
    intermediate_size: int
    attn_res_block_size: int
    situ_beta: float
    situ_linear_beta: float
    mla_use_output_gate: bool = True
    moe_renormalize: bool = True
    latent_moe_use_norm: bool = True
    layout: str = "flat"

    def is_mla(self, layer: int) -> bool:
        """Zero-based layer `layer` is MLA iff layer+1 is in the ONE-based full_attn_layers."""
        return (layer + 1) in self.full_attn_layers

    def attention_kind(self, layer: int) -> str:
        """The attention backend kind of a layer: "mla" for full_attn_layers, "kda" for the rest."""
        return "mla" if self.is_mla(layer) else "kda"

    @property
    def attention_kinds(self) -> tuple[str, ...]:
        """The kinds this model's layers use, in first-use order."""
        return tuple(dict.fromkeys(self.attention_kind(L) for L in range(self.num_hidden_layers)))

    def is_dense(self, layer: int) -> bool:
        return layer < self.first_k_dense_replace

    @property
    def moe_layers(self) -> int:
        """How many layers route to experts (those past first_k_dense_replace)."""
        return self.num_hidden_layers - min(self.first_k_dense_replace, self.num_hidden_layers)

    @property
    def kda_proj_dim(self) -> int:
        return self.kda_num_heads * self.kda_head_dim

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def shared_intermediate_size(self) -> int:
        return self.num_shared_experts * self.moe_intermediate_size

    def to_dict(self) -> dict:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v) for f in fields(self)}


def _lookup(root: dict, path: tuple[str, ...]):
    node = root
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return _MISSING
        node = node[key]
    return node


_MISSING = object()


def _check_type(value, kind) -> bool:
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is list:
        return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    return isinstance(value, kind)


def parse_config(raw: dict, source="config.json") -> Config:
    """Build a Config from the parsed JSON, listing every problem in one ConfigError."""
    if not isinstance(raw, dict):
        raise ConfigError(source, ["the file is not a JSON object"])
    nested = "text_config" in raw
    root = raw["text_config"] if nested else raw
    if nested and not isinstance(root, dict):
        raise ConfigError(source, ["text_config is not an object"])
    values, problems = {}, []
    for name, npath, flat, kind in _REQUIRED:
        path = npath if nested else (flat,)
        shown = ("text_config." if nested else "") + ".".join(path)
        value = _lookup(root, path)
        if value is _MISSING:
            problems.append(f"missing field {shown}")
        elif not _check_type(value, kind):
            problems.append(f"field {shown} must be {_kind_name(kind)}, got {value!r}")
        else:
            values[name] = float(value) if kind is float else value
    for name, npath, flat in _OPTIONAL_BOOLS:
        value = _lookup(root, npath if nested else (flat,))
        if value is _MISSING:
            continue
        if not isinstance(value, bool):
            problems.append(f"field {name} must be true or false, got {value!r}")
        else:
            values[name] = value
    kda_shown = "text_config.linear_attn_config.kda_layers" if nested else "kda_layers"
    kda_layers = _lookup(root, ("linear_attn_config", "kda_layers") if nested else ("kda_layers",))
    if kda_layers is not _MISSING and not _check_type(kda_layers, list):
        problems.append(f"field {kda_shown} must be a list of integers")
    if problems:
        raise ConfigError(source, problems)
    values["full_attn_layers"] = tuple(values["full_attn_layers"])
    config = Config(**values, layout="nested" if nested else "flat")
    problems = validate(config)
    if kda_layers is not _MISSING and 0 < config.num_hidden_layers <= INT_LIMIT:
        problems += partition_problems(config, kda_layers, kda_shown)
    if problems:
        raise ConfigError(source, problems)
    return config


def _few(values, total: int | None = None) -> str:
    """The first few of `values`, and how many there are in all when that is more."""
    values, total = list(values), len(values) if total is None else total
    shown = ", ".join(s if len(s := str(v)) <= 20 else s[:20] + "…" for v in values[:4])
    return shown if total <= 4 else f"{shown}, … ({total:,} in all)"


def _duplicates(values) -> list[int]:
    return sorted(x for x, k in Counter(values).items() if k > 1)


def partition_problems(c: Config, kda_layers: list[int], shown: str) -> list[str]:
    """The optional kda_layers list (MODEL.md §2: the complement of full_attn_layers) against full_attn_layers:
    together they must name every ONE-based layer 1..num_hidden_layers exactly once. Work and message are
    bounded by the lists' lengths, never by num_hidden_layers."""
    n, kda, mla = c.num_hidden_layers, set(kda_layers), set(c.full_attn_layers)
    problems = []
    if outside := [x for x in kda_layers if not 1 <= x <= n]:
        problems.append(f"{shown} entries {_few(outside)} are outside 1..{n} (the list is ONE-based)")
    if len(kda) != len(kda_layers):
        problems.append(f"{shown} has duplicates: {_few(_duplicates(kda_layers))}")
    if both := sorted(kda & mla):
        problems.append(f"layers {_few(both)} are in both {shown} and full_attn_layers")
    named = {x for x in kda | mla if 1 <= x <= n}
    if missing := n - len(named):
        first = itertools.islice((L for L in range(1, n + 1) if L not in named), 4)
        problems.append(f"num_hidden_layers is {n}, but layers {_few(first, missing)} are in neither {shown} nor "
                        "full_attn_layers")
    return problems


def _kind_name(kind) -> str:
    return {int: "an integer", float: "a number", list: "a list of integers"}.get(kind, kind.__name__)


def validate(c: Config) -> list[str]:
    """MODEL.md §2 validation rules, and every number finite and in range; returns every broken rule."""
    problems = []
    for f in fields(c):
        value = getattr(c, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            problems.append(f"{f.name} must be a finite number, got {value}")
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT_LIMIT:
            problems.append(f"{f.name} is {str(value)[:20]}{'…' if len(str(value)) > 20 else ''}, past the limit of "
                            f"{INT_LIMIT}")
    if any(abs(x) > INT_LIMIT for x in c.full_attn_layers):
        problems.append(f"full_attn_layers has an entry past the limit of {INT_LIMIT}")
    if problems:
        return problems  # the rules below compare these numbers
    for name in ("hidden_size", "num_hidden_layers", "vocab_size", "kda_num_heads", "kda_head_dim",
                 "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                 "qk_rope_head_dim", "v_head_dim", "num_experts", "routed_expert_hidden_size",
                 "moe_intermediate_size", "intermediate_size", "attn_res_block_size"):
        if getattr(c, name) <= 0:
            problems.append(f"{name} must be > 0, got {getattr(c, name)}")
    if c.num_shared_experts < 0:
        problems.append(f"num_shared_experts must be >= 0, got {c.num_shared_experts}")
    if c.short_conv_kernel_size < 1:
        problems.append(f"short_conv_kernel_size must be >= 1, got {c.short_conv_kernel_size}")
    if not 0 < c.rms_norm_eps < 1:
        problems.append(f"rms_norm_eps must be in (0, 1), got {c.rms_norm_eps}")
    for name in ("situ_beta", "situ_linear_beta", "routed_scaling_factor"):
        if not getattr(c, name) > 0:
            problems.append(f"{name} must be > 0, got {getattr(c, name)}")
    if not c.gate_lower_bound <= 0:
        problems.append(f"gate_lower_bound must be <= 0 (the KDA decay exp(bound·σ) must not grow the state), "
                        f"got {c.gate_lower_bound}")
    if not 0 <= c.first_k_dense_replace <= c.num_hidden_layers:
        problems.append(f"first_k_dense_replace must be in 0..{c.num_hidden_layers}, got {c.first_k_dense_replace}")
    fal = c.full_attn_layers
    if not fal:
        problems.append("full_attn_layers is empty: at least one MLA layer is required")
    if len(set(fal)) != len(fal):
        problems.append(f"full_attn_layers has duplicates: {_few(_duplicates(fal))}")
    outside = [x for x in fal if not 1 <= x <= c.num_hidden_layers]
    if outside:
        problems.append(f"full_attn_layers entries {_few(outside)} are outside 1..{c.num_hidden_layers} "
                        "(the list is ONE-based)")
    if len(set(fal)) >= c.num_hidden_layers:
        problems.append("full_attn_layers leaves no KDA layer")
    if not 1 <= c.num_experts_per_token <= c.num_experts:
        problems.append(f"num_experts_per_token must be in 1..num_experts ({c.num_experts}), "
                        f"got {c.num_experts_per_token}")
    for name in ("routed_expert_hidden_size", "moe_intermediate_size"):
        if getattr(c, name) % MXFP4_GROUP:
            problems.append(f"{name} ({getattr(c, name)}) must be a multiple of {MXFP4_GROUP}: "
                            "it is an MXFP4 input width")
    return problems


def load_config(model_dir) -> Config:
    path = Path(model_dir) / "config.json"
    try:
        text = read_limited(path, SMALL_FILE_BYTES, "a model config").decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(path, ["config.json not found"]) from None
    except OSError as exc:
        raise ConfigError(path, [f"cannot read: {exc.strerror}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(path, [f"not UTF-8 text (byte {exc.start})"]) from None
    try:
        raw = loads_limited(text, path)
    except ValueError as exc:  # bad JSON, or an integer of thousands of digits
        raise ConfigError(path, [f"not valid JSON: {str(exc)[:200]}"]) from None
    return parse_config(raw, path)


def context_limit(tokenizer_dir) -> int | None:
    """The positions the model is made for: `model_max_length` of the checkpoint's tokenizer_config.json, or None
    when it names none (a missing or unreadable file is the tokenizer's to report)."""
    path = Path(tokenizer_dir) / "tokenizer_config.json"
    try:
        raw = loads_limited(read_limited(path, SMALL_FILE_BYTES, "a tokenizer config").decode("utf-8"), path)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    limit = raw.get("model_max_length") if isinstance(raw, dict) else None
    return limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None
