"""Generate small checkpoints in the real Kimi K3 format (SPEC §9): names, dtypes, sharding,
index json, MXFP4 experts, nested or flat config, tokenizer files.

Weights are random but deliberately shaped so every SPEC trap changes the output; the same
shape and seed always give the same bytes. Not a model that knows anything.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import regex

from . import mxfp4
from ..text.chat import CHAT_TEMPLATE
from .. import plugin_manager
from ..errors import UsageError
from ..text.tokenizer import PAT_STR
from .checkpoint import (A_LOG_STORED, HEAD, expert_prefix, expert_specs, layer_prefix, layer_trunk_specs,
                         model_specs)
from .config import Config, parse_config

MARKER = "k3-test-model.json"
GENERATOR_VERSION = 2

SHAPES = {
    # SPEC §9's standard oracle shape.
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


def config_json(c: Config, layout: str) -> dict:
    """config.json as the released model lays it out (nested) or the flat test layout."""
    kda_layers = [L + 1 for L in range(c.num_hidden_layers) if not c.is_mla(L)]
    if layout == "flat":
        flat = {k: v for k, v in c.to_dict().items() if k != "layout"}
        return {"model_type": "kimi_k3", "tie_word_embeddings": False, **flat}
    text = {k: v for k, v in c.to_dict().items() if k not in (
        "layout", "kda_num_heads", "kda_head_dim", "short_conv_kernel_size", "gate_lower_bound",
        "full_attn_layers", "situ_beta", "situ_linear_beta")}
    text.update(
        activation_situ_beta=c.situ_beta, activation_situ_linear_beta=c.situ_linear_beta,
        tie_word_embeddings=False, num_nextn_predict_layers=0,
        linear_attn_config=dict(num_heads=c.kda_num_heads, head_dim=c.kda_head_dim,
                                short_conv_kernel_size=c.short_conv_kernel_size,
                                gate_lower_bound=c.gate_lower_bound, full_attn_layers=list(c.full_attn_layers),
                                kda_layers=kda_layers))
    return {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3", "text_config": text,
            "quantization_config": {"quant_method": "mxfp4", "group_size": mxfp4.GROUP},
            "vision_config": {"hidden_size": 16, "patch_size": 4}}


@dataclass
class Planned:
    name: str
    dtype: str
    shape: tuple
    nbytes: int


_ITEMSIZE = {"BF16": 2, "F32": 4, "U8": 1}


def _dtype_for(name: str, allowed: tuple) -> str:
    if "U8" in allowed:
        return "U8"
    if allowed == ("BF16",):
        return "BF16"
    return "F32"  # small vectors: stored F32, as the conv weights and A_log are


def plan_shards(c: Config) -> list[tuple[str, list[Planned]]]:
    """(file name, tensors in data order) per shard: layer L in shard L+1, then model-level,
    then vision. Each expert's six tensors form one gap-free run (SPEC §3)."""
    pm = plugin_manager.get_plugin_manager()  # the real format: the built-in backends' tensors, by name
    attention = {kind: plugin_manager.choose_attention(pm, kind, kind) for kind in c.attention_kinds}
    groups: list[list[Planned]] = []

    def planned(name, spec):
        shape = spec.shape if spec.shape is not None else (max(A_LOG_STORED, spec.min_numel),)
        dtype = _dtype_for(name, spec.dtypes)
        return Planned(name, dtype, tuple(shape), int(np.prod(shape)) * _ITEMSIZE[dtype])

    for L in range(c.num_hidden_layers):
        backend = attention[c.attention_kind(L)]
        tensors = [planned(layer_prefix(L) + s.name, s) for s in layer_trunk_specs(c, L, backend)]
        if not c.is_dense(L):
            for e in range(c.num_experts):
                tensors += [planned(expert_prefix(L, e) + s.name, s) for s in expert_specs(c)]
        groups.append(tensors)
    groups.append([planned(s.name, s) for s in model_specs(c)])
    groups.append([Planned("vision_tower.patch_embed.weight", "BF16", (16, 48), 16 * 48 * 2),
                   Planned("mm_projector.proj.weight", "BF16", (c.hidden_size, 16), c.hidden_size * 16 * 2)])
    total = len(groups)
    return [(f"model-{i + 1:05d}-of-{total:06d}.safetensors", g) for i, g in enumerate(groups)]


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


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even


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
    values = _values(t.name, t.shape, c, _rng(seed, t.name))
    return (_bf16_bits(values) if t.dtype == "BF16" else values.astype("<f4")).tobytes()


def _header(tensors: list[Planned]) -> bytes:
    entries, at = {"__metadata__": {"format": "pt"}}, 0
    for t in tensors:
        entries[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [at, at + t.nbytes]}
        at += t.nbytes
    raw = json.dumps(entries, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)


def _train_bpe(text: str, n_merges: int) -> list[bytes]:
    """The first `n_merges` new tokens of a plain byte-pair trainer: split `text` with the
    tokenizer's pat_str, then repeatedly join the most frequent adjacent pair inside a piece
    (ties: the smaller pair of byte strings); a join that yields a known token adds no rank.
    If the corpus runs dry (only the "wide" shape), two-byte printable-ASCII tokens fill up."""
    words = Counter(tuple(bytes([b]) for b in piece.encode())
                    for piece in regex.findall(PAT_STR, text, flags=regex.V1))  # V1: `&&` in classes
    known, merged = {bytes([b]) for b in range(256)}, []
    while len(merged) < n_merges:
        pairs: Counter = Counter()
        for word, n in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += n
        if not pairs:
            break
        a, b = min(pairs, key=lambda p: (-pairs[p], p))
        if a + b not in known:
            known.add(a + b)
            merged.append(a + b)
        words = Counter({_join_pair(word, a, b): n for word, n in words.items()})
    filler = (bytes([x, y]) for x in range(0x20, 0x7F) for y in range(0x20, 0x7F))
    merged += [t for t in filler if t not in known][:n_merges - len(merged)]
    return merged


def _join_pair(word: tuple, a: bytes, b: bytes) -> tuple:
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
            out.append(a + b)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def _tokenizer_files(c: Config) -> dict[str, str]:
    """tiktoken.model (the 256 bytes, then merges learned from BPE_CORPUS) and a
    tokenizer_config.json whose added tokens sit at the top of the vocabulary. Tiny (256) has
    room for neither: bytes only, no added tokens."""
    room = c.vocab_size - 256
    specials = SPECIAL_TOKENS[:max(0, min(len(SPECIAL_TOKENS), room))]
    tokens = [bytes([b]) for b in range(256)] + _train_bpe(BPE_CORPUS, room - len(specials))
    ranks = "".join(f"{base64.b64encode(t).decode()} {r}\n" for r, t in enumerate(tokens))
    first = c.vocab_size - len(specials)
    added = {str(first + i): {"content": tok, "special": True} for i, tok in enumerate(specials)}
    cfg = {"tokenizer_class": "TikTokenTokenizer", "added_tokens_decoder": added,
           "bos_token": "[BOS]" if "[BOS]" in specials else None,
           "eos_token": "[EOS]" if "[EOS]" in specials else None, "model_max_length": 1 << 20}
    if "<|end_of_msg|>" in specials:  # the chat markup fits: ship a template, as the released model does
        cfg["chat_template"] = CHAT_TEMPLATE
    return {"tiktoken.model": ranks, "tokenizer_config.json": json.dumps(cfg, indent=1) + "\n"}


def planned_bytes(c: Config) -> int:
    return sum(8 + len(_header(ts)) + sum(t.nbytes for t in ts) for _, ts in plan_shards(c))


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
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    weight_map, cache = {}, {}
    shards = plan_shards(c)
    for i, (fname, tensors) in enumerate(shards):
        with open(partial / fname, "wb") as f:
            header = _header(tensors)
            f.write(len(header).to_bytes(8, "little") + header)
            for t in tensors:
                f.write(tensor_bytes(t, c, seed, cache))
                weight_map[t.name] = fname
        if progress:
            progress(i + 1, len(shards), fname)
    total = sum((partial / f).stat().st_size for f, _ in shards)
    files = {
        "config.json": json.dumps(config_json(c, layout), indent=1) + "\n",
        "model.safetensors.index.json": json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                   indent=1) + "\n",
        **_tokenizer_files(c),
        MARKER: json.dumps(identity) + "\n",
    }
    for fname, text in files.items():
        (partial / fname).write_text(text, encoding="utf-8")
    if target.exists():
        shutil.rmtree(target)
    os.replace(partial, target)
    return target


def _read_marker(directory: Path):
    try:
        return json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return None
