"""Writing checkpoints in the real Kimi K3 format (MODEL.md §3, §6): every tensor the config implies, named
and typed as the released model stores them (BF16 matrices, F32 vectors, MXFP4 experts), in shards of
one layer each plus one of model-level tensors (and a vision stub), with the index json, a nested or
flat config.json, the tokenizer files and every tensor's checksum (format/tensor_sums.py) — written into a
sibling directory and renamed into place.

Used by the test-model generator (random weights) and the demo trainer (trained weights); what the
bytes are is the caller's (`tensor_bytes`). Read back by the same index and binding check as any
downloaded checkpoint.
"""
from __future__ import annotations

import base64
import errno
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .. import plugin_manager
from ..format import mxfp4
from ..format.checkpoint import (A_LOG_STORED, expert_prefix, expert_specs, layer_prefix, layer_trunk_specs,
                                model_specs)
from ..errors import UsageError
from ..format.config import Config
from ..format import tensor_sums
from ..format.safetensors_index import ShardIndex

ITEMSIZE = {"BF16": 2, "F32": 4, "U8": 1}


@dataclass(frozen=True)
class Planned:
    """One tensor to write: its full name, stored dtype, shape and byte count."""

    name: str
    dtype: str
    shape: tuple
    nbytes: int


def _dtype_for(allowed: tuple) -> str:
    if "U8" in allowed:
        return "U8"
    if allowed == ("BF16",):
        return "BF16"
    return "F32"  # small vectors: stored F32, as the conv weights and A_log are


def plan_shards(c: Config) -> list[tuple[str, list[Planned]]]:
    """(file name, tensors in data order) per shard: layer L in shard L+1, then model-level, then vision.
    Each expert's six tensors form one gap-free run (MODEL.md §3)."""
    pm = plugin_manager.get_plugin_manager()  # the real format: the built-in backends' tensors, by name
    attention = {kind: plugin_manager.choose_attention(pm, kind, kind) for kind in c.attention_kinds}

    def planned(name, spec):
        shape = spec.shape if spec.shape is not None else (max(A_LOG_STORED, spec.min_numel),)
        dtype = _dtype_for(spec.dtypes)
        return Planned(name, dtype, tuple(shape), int(np.prod(shape)) * ITEMSIZE[dtype])

    groups: list[list[Planned]] = []
    for L in range(c.num_hidden_layers):
        tensors = [planned(layer_prefix(L) + s.name, s) for s in layer_trunk_specs(c, L, attention[c.attention_kind(L)])]
        if not c.is_dense(L):
            for e in range(c.num_experts):
                tensors += [planned(expert_prefix(L, e) + s.name, s) for s in expert_specs(c)]
        groups.append(tensors)
    groups.append([planned(s.name, s) for s in model_specs(c)])
    groups.append([Planned("vision_tower.patch_embed.weight", "BF16", (16, 48), 16 * 48 * 2),  # a vision stub:
                   Planned("mm_projector.proj.weight", "BF16", (c.hidden_size, 16), c.hidden_size * 16 * 2)])  # skipped
    total = len(groups)
    return [(f"model-{i + 1:05d}-of-{total:06d}.safetensors", g) for i, g in enumerate(groups)]


def header(tensors: list[Planned]) -> bytes:
    entries, at = {"__metadata__": {"format": "pt"}}, 0
    for t in tensors:
        entries[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [at, at + t.nbytes]}
        at += t.nbytes
    raw = json.dumps(entries, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)


def planned_bytes(c: Config) -> int:
    """The size of the shards write_checkpoint writes for `c`."""
    return sum(8 + len(header(ts)) + sum(t.nbytes for t in ts) for _, ts in plan_shards(c))


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float values as BF16 bits, rounded to nearest even."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def float_bytes(t: Planned, values: np.ndarray) -> bytes:
    """A BF16 or F32 tensor's stored bytes from float values of its shape."""
    values = np.asarray(values, np.float64).reshape(t.shape)
    return (bf16_bits(values) if t.dtype == "BF16" else values.astype("<f4")).tobytes()


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


def tokenizer_files(tokens: list[bytes], added: dict[int, str], bos: str | None, eos: str | None,
                    chat_template: str | None) -> dict[str, str]:
    """tiktoken.model (`tokens` in rank order: the 256 single bytes first, then merges) and a
    tokenizer_config.json with the added tokens {id: content} (all special) and the chat template."""
    ranks = "".join(f"{base64.b64encode(t).decode()} {r}\n" for r, t in enumerate(tokens))
    cfg = {"tokenizer_class": "TikTokenTokenizer",
           "added_tokens_decoder": {str(i): {"content": s, "special": True} for i, s in sorted(added.items())},
           "bos_token": bos, "eos_token": eos, "model_max_length": 1 << 20}
    if chat_template is not None:
        cfg["chat_template"] = chat_template
    return {"tiktoken.model": ranks, "tokenizer_config.json": json.dumps(cfg, indent=1) + "\n"}


def write_checkpoint(directory, c: Config, tensor_bytes: Callable[[Planned], bytes], files: dict[str, str],
                     layout: str = "nested", progress=None) -> Path:
    """Write every tensor of `c` (bytes from `tensor_bytes(planned)`, exactly `planned.nbytes` of them),
    config.json, the index and `files` (name -> text) into `directory`, replacing it whole."""
    target = Path(directory)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        partial.mkdir(parents=True)
        _write_files(partial, c, tensor_bytes, files, layout, progress)
    except BaseException as exc:  # a full disk, EIO, Ctrl-C: no half-written checkpoint stays (a new run starts over)
        shutil.rmtree(partial, ignore_errors=True)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES,
                                                      errno.EFBIG):
            free = f"; it has {shutil.disk_usage(partial.parent).free / 1e6:,.1f} MB free" \
                if exc.errno in (errno.ENOSPC, errno.EDQUOT) and partial.parent.is_dir() else ""
            raise UsageError(f"{target}: cannot write the checkpoint on the filesystem holding {partial.parent}: "
                             f"{exc.strerror} ({planned_bytes(c) / 1e6:,.1f} MB of shards needed{free}); nothing "
                             f"was left behind ({partial.name} removed)") from None
        raise
    if target.exists():
        shutil.rmtree(target)
    os.replace(partial, target)
    return target


def _write_files(partial: Path, c: Config, tensor_bytes, files: dict[str, str], layout: str, progress) -> None:
    weight_map = {}
    shards = plan_shards(c)
    for i, (fname, tensors) in enumerate(shards):
        with open(partial / fname, "wb") as f:
            head = header(tensors)
            f.write(len(head).to_bytes(8, "little") + head)
            for t in tensors:
                data = tensor_bytes(t)
                if len(data) != t.nbytes:
                    raise ValueError(f"{t.name}: {len(data)} bytes given, {t.nbytes} expected ({t.dtype} {t.shape})")
                f.write(data)
                weight_map[t.name] = fname
        if progress:
            progress(i + 1, len(shards), fname)
    total = sum((partial / f).stat().st_size for f, _ in shards)
    texts = {"config.json": json.dumps(config_json(c, layout), indent=1) + "\n",
             "model.safetensors.index.json": json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                        indent=1) + "\n", **files}
    for fname, text in texts.items():
        (partial / fname).write_text(text, encoding="utf-8")
    tensor_sums.record(ShardIndex.open(partial))
