"""A checkpoint directory: its config, its shard index, and the names the config implies.

`open_checkpoint` reads config.json and every shard header (no tensor data), then checks
that every tensor the config implies exists with the right shape and dtype, listing all
problems in one BindingError before any compute starts.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .config import Config, load_config
from ..errors import BindingError, CheckpointError, ConfigError
from .safetensors_index import ShardIndex

PREFIX = "language_model.model."
HEAD = "language_model.lm_head.weight"
EMBED = PREFIX + "embed_tokens.weight"
VISION_PREFIXES = ("vision_tower.", "mm_projector.")
MATRIX = ("BF16",)
FLOAT = ("BF16", "F16", "F32")
A_LOG_STORED = 128  # released A_log holds 128 floats; only the first `kda_num_heads` mean anything
EXPERT_PARTS = ("w1.weight_packed", "w1.weight_scale", "w2.weight_packed",
                "w2.weight_scale", "w3.weight_packed", "w3.weight_scale")


@dataclass(frozen=True)
class TensorSpec:
    """A tensor the config implies: its name, shape and the dtypes it may be stored in.

    `shape` None means any shape holding at least `min_numel` values (A_log is padded)."""

    name: str
    shape: tuple[int, ...] | None
    dtypes: tuple[str, ...]
    min_numel: int = 0


def layer_prefix(layer: int) -> str:
    return f"{PREFIX}layers.{layer}."


def expert_prefix(layer: int, expert: int) -> str:
    return f"{layer_prefix(layer)}block_sparse_moe.experts.{expert}."


def model_specs(c: Config) -> list[TensorSpec]:
    """Model-level tensors, full names."""
    H, V = c.hidden_size, c.vocab_size
    return [
        TensorSpec(EMBED, (V, H), MATRIX),
        TensorSpec(PREFIX + "norm.weight", (H,), FLOAT),
        TensorSpec(PREFIX + "output_attn_res_norm.weight", (H,), FLOAT),
        TensorSpec(PREFIX + "output_attn_res_proj.weight", (1, H), FLOAT),
        TensorSpec(HEAD, (V, H), MATRIX),
    ]


def residual_specs(c: Config) -> list[TensorSpec]:
    """Per-layer norms and AttnRes tensors, relative to `layers.{L}.`."""
    H = c.hidden_size
    return [TensorSpec(n, (H,), FLOAT) for n in (
        "input_layernorm.weight", "post_attention_layernorm.weight",
        "self_attention_res_norm.weight", "mlp_res_norm.weight")] + [
        TensorSpec("self_attention_res_proj.weight", (1, H), FLOAT),
        TensorSpec("mlp_res_proj.weight", (1, H), FLOAT)]


def dense_mlp_specs(c: Config) -> list[TensorSpec]:
    H, I = c.hidden_size, c.intermediate_size
    return [TensorSpec("mlp.gate_proj.weight", (I, H), MATRIX),
            TensorSpec("mlp.up_proj.weight", (I, H), MATRIX),
            TensorSpec("mlp.down_proj.weight", (H, I), MATRIX)]


def moe_trunk_specs(c: Config) -> list[TensorSpec]:
    H, E, Z, S = c.hidden_size, c.num_experts, c.routed_expert_hidden_size, c.shared_intermediate_size
    p = "block_sparse_moe."
    specs = [TensorSpec(p + "gate.weight", (E, H), MATRIX),
             TensorSpec(p + "gate.e_score_correction_bias", (E,), FLOAT),
             TensorSpec(p + "routed_expert_down_proj.weight", (Z, H), MATRIX),
             TensorSpec(p + "routed_expert_up_proj.weight", (H, Z), MATRIX)]
    if c.latent_moe_use_norm:
        specs.append(TensorSpec(p + "routed_expert_norm.weight", (Z,), FLOAT))
    if c.num_shared_experts:
        specs += [TensorSpec(p + "shared_experts.gate_proj.weight", (S, H), MATRIX),
                  TensorSpec(p + "shared_experts.up_proj.weight", (S, H), MATRIX),
                  TensorSpec(p + "shared_experts.down_proj.weight", (H, S), MATRIX)]
    return specs


def expert_specs(c: Config) -> list[TensorSpec]:
    """One routed expert's six MXFP4 tensors, relative to `...experts.{E}.` (MODEL.md §3 order)."""
    Z, F = c.routed_expert_hidden_size, c.moe_intermediate_size
    return [TensorSpec("w1.weight_packed", (F, Z // 2), ("U8",)), TensorSpec("w1.weight_scale", (F, Z // 32), ("U8",)),
            TensorSpec("w2.weight_packed", (Z, F // 2), ("U8",)), TensorSpec("w2.weight_scale", (Z, F // 32), ("U8",)),
            TensorSpec("w3.weight_packed", (F, Z // 2), ("U8",)), TensorSpec("w3.weight_scale", (F, Z // 32), ("U8",))]


def layer_trunk_specs(c: Config, layer: int, attention) -> list[TensorSpec]:
    """Every non-expert tensor of a layer, relative names; `attention` is the layer's backend."""
    mlp = dense_mlp_specs(c) if c.is_dense(layer) else moe_trunk_specs(c)
    return residual_specs(c) + attention.tensor_specs(c, layer) + mlp


@dataclass
class Checkpoint:
    """A model directory opened for reading: config + header index, nothing loaded."""

    root: Path
    config: Config
    index: ShardIndex

    def close(self):
        self.index.close()


def open_checkpoint(model_dir) -> Checkpoint:
    """Read config and headers, and check the config's counts against the headers (count_problems); raise
    ConfigError / CheckpointError naming what is wrong."""
    root = Path(model_dir)
    if not root.is_dir():
        raise CheckpointError(f"{root}: {'not a directory' if root.exists() else 'no such directory'} (a model "
                              "directory holds config.json and the safetensors shards)")
    config = load_config(root)
    index = ShardIndex.open(root)
    if problems := count_problems(config, index):
        index.close()
        raise ConfigError(root / "config.json", problems)
    return Checkpoint(root, config, index)


def _run(count: int, present) -> int:
    """How many of 0, 1, … count - 1 are present(i), counted up to the first that is not."""
    i = 0
    while i < count and present(i):
        i += 1
    return i


def _held(kind: str, n: int) -> str:
    return f"tensors for {kind}s 0..{n - 1} and none for {kind} {n}" if n else f"no tensors for {kind} 0"


def count_problems(c: Config, index: ShardIndex) -> list[str]:
    """num_hidden_layers and num_experts against the tensors the index holds, before anything walks those
    counts (the binding check, the attention kinds, the memory plan): every layer has its residual tensors,
    every MoE layer its experts' MXFP4 tensors. Each probe up finds a tensor, so the work is bounded by the
    index, never by a count in config.json; a count past what the index holds is named with what it holds."""
    residual = [s.name for s in residual_specs(c)]
    layers = _run(c.num_hidden_layers, lambda L: any(layer_prefix(L) + n in index for n in residual))
    if layers < c.num_hidden_layers:
        return [f"num_hidden_layers {c.num_hidden_layers}: the checkpoint has {_held('layer', layers)}"]
    for L in range(c.first_k_dense_replace, c.num_hidden_layers):
        experts = _run(c.num_experts, lambda e: any(expert_prefix(L, e) + p in index for p in EXPERT_PARTS))
        if experts < c.num_experts:
            return [f"num_experts {c.num_experts}: layer {L} has {_held('expert', experts)}"]
    return []


def binding_problems(ckpt: Checkpoint, attention_for_layer) -> list[str]:
    """Every tensor the config implies that is absent or has the wrong shape or dtype."""
    c, index, problems = ckpt.config, ckpt.index, []

    def check(spec: TensorSpec, full: str):
        if full not in index:
            problems.append(f"missing tensor {full}")
            return
        info = index[full]
        numel = 1
        for n in info.shape:
            numel *= n
        if spec.shape is None:
            if numel < spec.min_numel:
                problems.append(f"{full}: {numel} values, expected at least {spec.min_numel} ({info.file.name})")
        elif tuple(info.shape) != spec.shape:
            problems.append(f"{full}: shape {list(info.shape)}, expected {list(spec.shape)} ({info.file.name})")
        if info.dtype not in spec.dtypes:
            problems.append(f"{full}: dtype {info.dtype}, expected {' or '.join(spec.dtypes)} ({info.file.name})")

    for spec in model_specs(c):
        check(spec, spec.name)
    for layer in range(c.num_hidden_layers):
        for spec in layer_trunk_specs(c, layer, attention_for_layer(layer)):
            check(spec, layer_prefix(layer) + spec.name)
        if not c.is_dense(layer):
            for e in range(c.num_experts):
                for spec in expert_specs(c):
                    check(spec, expert_prefix(layer, e) + spec.name)
    return problems


def check_binding(ckpt: Checkpoint, attention_for_layer) -> None:
    problems = binding_problems(ckpt, attention_for_layer)
    if problems:
        raise BindingError(ckpt.root, problems)


def trunk_bytes_per_pass(checkpoint: Checkpoint) -> int:
    """Weight bytes a pass touches besides the routed experts: every tensor but those, the embedding (one row
    per id) and the vision tower."""
    return sum(checkpoint.index[n].nbytes for n in checkpoint.index.names()
               if ".experts." not in n and "embed_tokens" not in n and not n.startswith(VISION_PREFIXES))


def expert_bytes(checkpoint: Checkpoint) -> int:
    """One routed expert's bytes (0 for a model without MoE layers)."""
    c = checkpoint.config
    if c.first_k_dense_replace >= c.num_hidden_layers:
        return 0
    return sum(checkpoint.index[expert_prefix(c.first_k_dense_replace, 0) + p].nbytes for p in EXPERT_PARTS)
