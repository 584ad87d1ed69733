"""Generate small checkpoints in the real Kimi K3 format (MODEL.md §9), written by testmodel/writer.py: names,
dtypes, sharding, index json, MXFP4 experts, nested or flat config, tokenizer files.

Weights are random but deliberately shaped so every trap of docs/MODEL.md changes the output; the same
shape and seed always give the same bytes. Not a model that knows anything.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from ..format import mxfp4
from ..errors import UsageError
from ..files.limits import SMALL_FILE_BYTES, LimitError, read_json_limited
from .writer import Planned, config_json, float_bytes, planned_bytes, tokenizer_files, write_checkpoint
from ..text.chat import CHAT_TEMPLATE
from ..text.bpe import train_bpe
from ..format.checkpoint import HEAD, expert_prefix
from ..format.config import Config, parse_config
from ..format.notes import TEST_MODEL_MARKER

__all__ = ["SHAPES", "COMMON", "BPE_CORPUS", "SPECIAL_TOKENS", "MARKER", "shape_config", "config_json", "make_model",
           "planned_bytes", "tensor_bytes"]

MARKER = TEST_MODEL_MARKER
GENERATOR_VERSION = 2

SHAPES = {
    # MODEL.md §9's standard oracle shape.
    "tiny": dict(hidden_size=128, num_hidden_layers=13, vocab_size=256, kda_num_heads=4, kda_head_dim=16,
                 short_conv_kernel_size=4, num_attention_heads=4, q_lora_rank=64, kv_lora_rank=32,
                 qk_nope_head_dim=24, qk_rope_head_dim=8, v_head_dim=16, num_experts=8, num_experts_per_token=2,
                 num_shared_experts=2, routed_expert_hidden_size=64, moe_intermediate_size=64,
                 first_k_dense_replace=1, intermediate_size=96, attn_res_block_size=3,
                 full_attn_layers=[4, 8, 12, 13]),
    # A second shape where every count differs: two dense layers, conv width 3, 3 of 12 experts.
    "small": dict(hidden_size=192, num_hidden_layers=10, vocab_size=384, kda_num_heads=6, kda_head_dim=8,
                  short_conv_kernel_size=3, num_attention_heads=3, q_lora_rank=48, kv_lora_rank=24,
                  qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, num_experts=12, num_experts_per_token=3,
                  num_shared_experts=1, routed_expert_hidden_size=96, moe_intermediate_size=32,
                  first_k_dense_replace=2, intermediate_size=80, attn_res_block_size=4,
                  full_attn_layers=[3, 6, 9, 10]),
    # Deeper and wider than tiny, for streaming tests: 25 layers (9 AttnRes blocks), 16 of 64 experts.
    "medium": dict(hidden_size=256, num_hidden_layers=25, vocab_size=512, kda_num_heads=8, kda_head_dim=16,
                   short_conv_kernel_size=4, num_attention_heads=4, q_lora_rank=96, kv_lora_rank=64,
                   qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, num_experts=64,
                   num_experts_per_token=16, num_shared_experts=2, routed_expert_hidden_size=128,
                   moe_intermediate_size=96, first_k_dense_replace=1, intermediate_size=384,
                   attn_res_block_size=3, full_attn_layers=[4, 8, 12, 16, 20, 24, 25]),
    # Real K3 widths, few layers and experts: for benchmarks (several GB).
    "wide": dict(hidden_size=7168, num_hidden_layers=4, vocab_size=8192, kda_num_heads=96, kda_head_dim=128,
                 short_conv_kernel_size=4, num_attention_heads=96, q_lora_rank=1536, kv_lora_rank=512,
                 qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, num_experts=32,
                 num_experts_per_token=16, num_shared_experts=2, routed_expert_hidden_size=3584,
                 moe_intermediate_size=3072, first_k_dense_replace=1, intermediate_size=9216,
                 attn_res_block_size=3, full_attn_layers=[4]),
}
COMMON = dict(rms_norm_eps=1e-5, gate_lower_bound=-5.0, routed_scaling_factor=1.0, situ_beta=4.0,
              situ_linear_beta=25.0, mla_use_output_gate=True, moe_renormalize=True, latent_moe_use_norm=True)
# Branch outputs (attention o_proj, MLP down, routed up) are kept small against the stream, as in
# a trained model; at full size the random network amplifies float32 rounding 2-7x per layer.
BRANCH_OUT = 0.1
SPECIAL_TOKENS = ["[BOS]", "[EOS]", "<|open|>", "<|sep|>", "<|close|>", "<|end_of_msg|>", "[PAD]", "[UNK]",
                  "<|reserved_0|>", "<|reserved_1|>", "<|reserved_2|>", "<|reserved_3|>"]
# What the test tokenizers' merges are learned from (written for this project): contractions,
# digit runs, accents, Chinese and Japanese, emoji with zero-width joiners, tabs and blank lines.
BPE_CORPUS = """\
The quick brown fox didn't jump over the lazy dog; it's been resting since 2019. We'll see
whether it'll move by 08:45 tomorrow, but I'd bet 1,250,000 to 3 that it won't. They've counted
12345678 sheep, 42 owls and 7 cats, and they're still counting. DON'T PANIC, said the sign.

In the old town, the café sells crème brûlée, the señora orders a piña colada, and the
Straße is quiet after ten. Ça va? Où est la gare? Naïve façades, São Paulo, Zürich, Ålesund.
Ωμέγα and αλφα are Greek; Привет, мир, is Russian.

今天天气很好，我们去公园散步吧。中文的句子没有空格，日本語の文章もそうです。
東京は大きな都市です。ありがとうございます！

A developer 👩‍💻 and a family 👨‍👩‍👧 wave 👋🏽 at the rainbow flag 🏳️‍🌈.
\tindented line with a tab
    four spaces, then    a gap
"""


def shape_config(shape: str) -> Config:
    if shape not in SHAPES:
        raise UsageError(f"unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
    return parse_config({**SHAPES[shape], **COMMON}, f"shape {shape}")


def _rng(seed: int, name: str) -> np.random.RandomState:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return np.random.RandomState(int.from_bytes(digest[:4], "little"))  # legacy stream: stable across numpy


def _row_scales(rng, rows, low, high) -> np.ndarray:
    return np.exp(rng.uniform(np.log(low), np.log(high), size=(rows, 1)))


def _values(name: str, shape: tuple, c: Config, rng) -> np.ndarray:
    """float64 values for one tensor, by what the tensor does."""
    scale = BRANCH_OUT if name.endswith(("o_proj.weight", "mlp.down_proj.weight", "shared_experts.down_proj.weight",
                                         "routed_expert_up_proj.weight")) else 1.0
    return scale * _raw_values(name, shape, c, rng)


def _raw_values(name: str, shape: tuple, c: Config, rng) -> np.ndarray:
    n = rng.standard_normal(shape)
    leaf = name.rsplit(".", 2)
    fan_in = shape[-1] if len(shape) >= 2 else 1
    if name.endswith("A_log"):
        out = np.zeros(shape)
        out[:c.kda_num_heads] = rng.permutation(np.linspace(-2.5, 2.0, c.kda_num_heads))  # spread per head
        return out
    if name.endswith("embed_tokens.weight"):
        return n
    if name == HEAD:
        return n * 4.0 / np.sqrt(fan_in)
    if name.endswith("res_proj.weight"):
        return n * 2.0 / np.sqrt(shape[-1])
    if name.endswith(("norm.weight", "layernorm.weight")):
        return 1.0 + 0.2 * n
    if name.endswith("dt_bias"):
        return n
    if name.endswith("conv1d.weight"):
        return 0.5 * n
    if name.endswith("e_score_correction_bias"):
        return rng.uniform(-0.3, 0.3, size=shape)  # big enough to reorder the top-k
    if name.endswith("gate.weight"):
        return n * 2.0 / np.sqrt(fan_in)
    if name.endswith(("gate_proj.weight", "up_proj.weight")) and "self_attn" not in name \
            and "routed_expert" not in name:
        return n / np.sqrt(fan_in) * _row_scales(rng, shape[0], 0.3, 40.0)  # both SiTU caps saturate
    if name.endswith("down_proj.weight") and "routed_expert" not in name:
        return n / np.sqrt(fan_in) / 20.0
    if name.endswith("routed_expert_down_proj.weight"):
        return n * 3.0 / np.sqrt(fan_in)
    if leaf[-2] in ("w1", "w3"):
        return n / np.sqrt(fan_in) * _row_scales(rng, shape[0], 0.5, 30.0)
    if leaf[-2] == "w2":
        return n / np.sqrt(fan_in) / 10.0
    if name.endswith("q_b_proj.weight"):
        return n * 3.0 / np.sqrt(fan_in)  # peaky attention
    if name.endswith("b_proj.weight"):
        return n * 2.0 / np.sqrt(fan_in)
    if name.startswith(("vision_tower.", "mm_projector.")):
        return 0.02 * n
    return n / np.sqrt(fan_in)


def _expert_bytes(name: str, c: Config, seed: int, cache: dict) -> bytes:
    """An expert tensor's packed or scale bytes; both halves come from one quantisation."""
    base = name.rsplit(".", 1)[0]  # ...experts.E.w1
    if base not in cache:
        cache.clear()
        rows, cols = ((c.moe_intermediate_size, c.routed_expert_hidden_size) if not base.endswith("w2")
                      else (c.routed_expert_hidden_size, c.moe_intermediate_size))
        packed, scale = mxfp4.quantize(_values(base + ".weight", (rows, cols), c, _rng(seed, base)))
        if not packed.any():
            raise AssertionError(f"{base}: all nibbles zero; such a fixture cannot fail")
        if base == expert_prefix(1 if c.first_k_dense_replace <= 1 else c.first_k_dense_replace, 1) + "w2":
            scale[0, 0] = mxfp4.NAN_SCALE  # one NaN-scale group: the engine must read it as zeros
        cache[base] = {"weight_packed": packed, "weight_scale": scale}
    return cache[base][name.rsplit(".", 1)[1]].tobytes()


def tensor_bytes(t: Planned, c: Config, seed: int, cache: dict) -> bytes:
    if t.dtype == "U8":
        return _expert_bytes(t.name, c, seed, cache)
    return float_bytes(t, _values(t.name, t.shape, c, _rng(seed, t.name)))


def _tokenizer_files(c: Config) -> dict[str, str]:
    """tiktoken.model (the 256 bytes, then merges learned from BPE_CORPUS) and a
    tokenizer_config.json whose added tokens sit at the top of the vocabulary. Tiny (256) has
    room for neither: bytes only, no added tokens."""
    room = c.vocab_size - 256
    specials = SPECIAL_TOKENS[:max(0, min(len(SPECIAL_TOKENS), room))]
    tokens = [bytes([b]) for b in range(256)] + train_bpe(BPE_CORPUS, room - len(specials))
    first = c.vocab_size - len(specials)
    return tokenizer_files(tokens, {first + i: tok for i, tok in enumerate(specials)},
                           "[BOS]" if "[BOS]" in specials else None, "[EOS]" if "[EOS]" in specials else None,
                           CHAT_TEMPLATE if "<|end_of_msg|>" in specials else None)  # markup fits: a template too


def make_model(directory, shape: str = "tiny", seed: int = 0, layout: str = "nested", *,
               if_missing: bool = False, force: bool = False, progress=None) -> Path:
    """Write the checkpoint into `directory` (via a temporary sibling, renamed at the end)."""
    if layout not in ("nested", "flat"):
        raise UsageError(f"unknown layout {layout!r}; choose nested or flat")
    c = shape_config(shape)
    target = Path(directory)
    identity = {"generator_version": GENERATOR_VERSION, "shape": shape, "seed": seed, "layout": layout}
    if target.exists():
        existing = _read_marker(target)
        if if_missing and existing == identity:
            return target
        if not force:
            what = f"a test model {existing}" if existing else "something that is not this test model"
            raise UsageError(f"{target} already holds {what}; pass --force to replace it")
    cache: dict = {}
    files = {**_tokenizer_files(c), MARKER: json.dumps(identity) + "\n"}
    return write_checkpoint(target, c, lambda t: tensor_bytes(t, c, seed, cache), files, layout, progress)


def _read_marker(directory: Path):
    try:
        return read_json_limited(directory / MARKER, SMALL_FILE_BYTES, "a test-model marker")
    except (OSError, ValueError, LimitError):
        return None
