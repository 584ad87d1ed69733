"""Benchmark ShardIndex.open on a synthetic checkpoint laid out like the released Kimi K3.

Builds 96 sparse shards -- headers written as the safetensors library writes them, data regions
left as holes by truncate -- with the tensor names, shapes and dtypes of MODEL.md §3/§6 (497,220 tensors,
~76 MB of header JSON; vision tensors made up; shard sizes follow from the spans, close to but not
equal to k3-shard-sizes.txt) plus a model.safetensors.index.json in the HF layout (indent 2, sorted).
Then times ShardIndex.open, best of N: cold (each file's pages dropped with posix_fadvise before each
run) and warm, and the first lookup by name after a warm open (it builds the name dict).
Not a test: it prints numbers; it only asserts the tensor count. `make bench-index` runs it.
"""
import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from k3core.format import safetensors_index as si
from k3core.format.safetensors_index import ShardIndex  # noqa: E402

H, P, D, HEADS, EXPERTS, NUM_LAYERS = 7168, 12288, 128, 96, 896, 93
MLA_LAYERS = {L for L in range(NUM_LAYERS) if (L + 1) % 4 == 0 or L + 1 == 93}   # one-based [4,8,…,92,93]
SHARDS = 96
EXPERT_TENSORS = [(f"w{w}.{kind}", (rows, cols // div))            # w1/w3 = [3072, 3584], w2 = [3584, 3072]
                  for w, (rows, cols) in ((1, (3072, 3584)), (2, (3584, 3072)), (3, (3072, 3584)))
                  for kind, div in (("weight_packed", 2), ("weight_scale", 32))]


def _dt(name, shape):
    """BF16 for large matrices, F32 for vectors, conv kernels and [1, H] projections (MODEL.md §3)."""
    return "BF16" if len(shape) == 2 and min(shape) > 1 else "F32"


def layer_trunk(L):
    """(name, dtype, shape) of layer L's trunk tensors (everything but the routed experts)."""
    p = f"language_model.model.layers.{L}."
    t = [("input_layernorm.weight", [H]), ("post_attention_layernorm.weight", [H]),
         ("self_attention_res_norm.weight", [H]), ("self_attention_res_proj.weight", [1, H]),
         ("mlp_res_norm.weight", [H]), ("mlp_res_proj.weight", [1, H])]
    a = "self_attn."
    if L in MLA_LAYERS:
        t += [(a + n, s) for n, s in (
            ("q_a_proj.weight", [1536, H]), ("q_a_layernorm.weight", [1536]),
            ("q_b_proj.weight", [HEADS * 192, 1536]), ("kv_a_proj_with_mqa.weight", [576, H]),
            ("kv_a_layernorm.weight", [512]), ("kv_b_proj.weight", [HEADS * 256, 512]),
            ("o_proj.weight", [H, HEADS * 128]), ("g_proj.weight", [HEADS * 128, H]))]
    else:
        t += [(a + n, s) for n, s in (
            ("q_proj.weight", [P, H]), ("k_proj.weight", [P, H]), ("v_proj.weight", [P, H]),
            ("g_proj.weight", [P, H]), ("o_proj.weight", [H, P]), ("q_conv1d.weight", [P, 1, 4]),
            ("k_conv1d.weight", [P, 1, 4]), ("v_conv1d.weight", [P, 1, 4]),
            ("f_a_proj.weight", [D, H]), ("f_b_proj.weight", [P, D]), ("b_proj.weight", [HEADS, H]),
            ("A_log", [128]), ("dt_bias", [P]), ("o_norm.weight", [D]))]
    if L == 0:
        t += [("mlp.gate_proj.weight", [33792, H]), ("mlp.up_proj.weight", [33792, H]),
              ("mlp.down_proj.weight", [H, 33792])]
    else:
        m = "block_sparse_moe."
        t += [(m + n, s) for n, s in (
            ("gate.weight", [EXPERTS, H]), ("gate.e_score_correction_bias", [EXPERTS]),
            ("routed_expert_down_proj.weight", [3584, H]), ("routed_expert_up_proj.weight", [H, 3584]),
            ("routed_expert_norm.weight", [3584]), ("shared_experts.gate_proj.weight", [6144, H]),
            ("shared_experts.up_proj.weight", [6144, H]), ("shared_experts.down_proj.weight", [H, 6144]))]
    return [(p + n, _dt(n, s), s) for n, s in t]


def shard_tensors(k):
    """(name, dtype, shape) of one-based shard k, in the order the data is laid out."""
    if k <= 93:
        t = layer_trunk(k - 1)
        if k >= 2:
            p = f"language_model.model.layers.{k - 1}.block_sparse_moe.experts."
            t += [(f"{p}{e}.{n}", "U8", list(s)) for e in range(EXPERTS) for n, s in EXPERT_TENSORS]
        return t
    if k == 94:
        m = "language_model.model."
        return [(m + "embed_tokens.weight", "BF16", [163840, H]),
                ("language_model.lm_head.weight", "BF16", [163840, H]),
                (m + "norm.weight", "F32", [H]), (m + "output_attn_res_norm.weight", "F32", [H]),
                (m + "output_attn_res_proj.weight", "F32", [1, H])]
    if k == 95:   # made-up vision names and shapes: 24 projector tensors, ~90 MB
        return [(f"mm_projector.layers.{i}.{n}", "BF16" if n == "weight" else "F32",
                 [2304, 2304] if n == "weight" else [2304]) for i in range(12) for n in ("weight", "bias")]
    return [(f"vision_tower.encoder.blocks.{i}.{n}", "BF16" if n.endswith("weight") else "F32",   # 144 tensors, ~0.8 GB
             [1152, 4608] if n.endswith("weight") else [4608]) for i in range(24)
            for n in ("attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
                      "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight")]


def build(directory):
    """Write the 96 sparse shards and the index json; return (tensor count, header bytes)."""
    directory.mkdir(parents=True, exist_ok=True)
    weight_map, total, n_tensors, header_bytes = {}, 0, 0, 0
    for k in range(1, SHARDS + 1):
        fname = f"model-{k:05d}-of-{SHARDS:06d}.safetensors"
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for name, dtype, shape in shard_tensors(k):
            nbytes = math.prod(shape) * (2 if dtype == "BF16" else 4 if dtype == "F32" else 1)
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + nbytes]}
            weight_map[name] = fname
            off += nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)                   # safetensors pads the header to 8 bytes
        with open(directory / fname, "wb") as f:
            f.write(len(raw).to_bytes(8, "little") + raw)
            f.truncate(8 + len(raw) + off)              # sparse: the data region is a hole
        n_tensors += len(header) - 1
        header_bytes += len(raw)
        total += off
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return n_tensors, header_bytes


def evict(directory):
    """Drop the shards' and index's pages from the page cache (no root needed, nothing else touched)."""
    for p in directory.iterdir():
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def time_open(directory, repeats, cold):
    """Best of `repeats`: (seconds for ShardIndex.open, seconds for the first lookup after it, tensors)."""
    best, first = math.inf, math.inf
    for _ in range(repeats):
        if cold:
            evict(directory)
        t0 = time.perf_counter()
        index = ShardIndex.open(directory)
        t1 = time.perf_counter()
        assert "language_model.lm_head.weight" in index    # builds the name → row dict
        t2 = time.perf_counter()
        best, first = min(best, t1 - t0), min(first, t2 - t1)
        n = len(index)
        index.close()
    return best, first, n


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, help="build (or reuse) the synthetic checkpoint here and keep it; "
                    "default: a temporary directory removed afterwards")
    ap.add_argument("--repeats", type=int, default=5, help="runs per mode; the best is reported (default 5)")
    ap.add_argument("--profile", action="store_true", help="also print a cProfile of one warm open")
    ap.add_argument("--reference", action="store_true",
                    help="also time one warm open with the numpy paths switched off (json.loads only)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="k3-index-bench-") as tmp:
        d = args.dir or Path(tmp)
        t0 = time.perf_counter()
        if (d / "model.safetensors.index.json").exists():
            print(f"reusing {d}")
        else:
            build(d)
            print(f"built {d} in {time.perf_counter() - t0:.1f} s")
        header_bytes = sum(int.from_bytes(open(p, "rb").read(8), "little") for p in d.glob("*.safetensors"))
        index_bytes = (d / "model.safetensors.index.json").stat().st_size
        cold, _, n = time_open(d, args.repeats, cold=True)
        warm, lookup, n = time_open(d, args.repeats, cold=False)
        assert n == 497_220 or args.dir, n
        print(f"tensors {n:,}  shards {len(list(d.glob('*.safetensors')))}  header JSON {header_bytes / 1e6:.1f} MB"
              f"  index json {index_bytes / 1e6:.1f} MB  cpus {os.cpu_count()}  load {os.getloadavg()[0]:.2f}")
        print(f"ShardIndex.open  cold {cold:.3f} s  warm {warm:.3f} s  (best of {args.repeats})")
        print(f"first lookup by name (builds the name dict) {lookup:.3f} s")
        if args.reference:
            fast = si._parse_compact, si._weight_map_compact
            si._parse_compact, si._weight_map_compact = (lambda *a: None), (lambda *a: None)
            t0 = time.perf_counter()
            ShardIndex.open(d).close()
            print(f"ShardIndex.open through json.loads only: {time.perf_counter() - t0:.3f} s")
            si._parse_compact, si._weight_map_compact = fast
        if args.profile:
            import cProfile
            import pstats
            pr = cProfile.Profile()
            pr.runcall(lambda: ShardIndex.open(d).close())
            pstats.Stats(pr).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
