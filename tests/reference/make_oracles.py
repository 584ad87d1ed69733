"""Writes oracle fixtures for one test checkpoint from the independent float64 reference.

    make_oracles.py MODEL_DIR OUT.npz --prompt 1,2,3 --tf-len 32 --gen 20 [--label tiny-seed0]

OUT.npz: prompt_ids, tf_ids, tf_logits, greedy_ids, greedy_logits, tf_top2_gap,
greedy_top2_gap, min_top2_gap. OUT.json: provenance (hashes, torch version, command line), the
teacher-forcing rule, a MODEL.md §3 check of the checkpoint and how hard its weights hit each trap.
Everything is full recomputation; no caches, no k3core.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import k3ref  # noqa: E402

TF_RULE = ("tf_ids = prompt_ids followed by np.random.default_rng(tf_seed).integers(0, vocab_size, "
           "size=tf_len - len(prompt_ids), dtype=np.int64)")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def top2_gap(logits: np.ndarray) -> np.ndarray:
    """best − second-best logit per row."""
    s = np.sort(logits, axis=-1)
    return s[:, -1] - s[:, -2]


def expected_tensors(cfg: k3ref.RefConfig) -> dict:
    """MODEL.md §3 names (without `language_model.model.`) → (shape, dtype or None = any float)."""
    H, V, P, D = cfg.hidden, cfg.vocab, cfg.kda_heads * cfg.kda_dim, cfg.kda_dim
    BF, F32, U8 = "BF16", "F32", "U8"
    e = {"embed_tokens.weight": ([V, H], BF), "norm.weight": ([H], None),
         "output_attn_res_norm.weight": ([H], None), "output_attn_res_proj.weight": ([1, H], None),
         "lm_head.weight": ([V, H], BF)}
    for L in range(cfg.n_layers):
        p = f"layers.{L}."
        for n in ("input_layernorm", "post_attention_layernorm", "self_attention_res_norm", "mlp_res_norm"):
            e[p + n + ".weight"] = ([H], None)
        for n in ("self_attention_res_proj", "mlp_res_proj"):
            e[p + n + ".weight"] = ([1, H], None)
        a = p + "self_attn."
        if cfg.is_mla(L):
            nh = cfg.mla_heads
            e.update({a + "q_a_proj.weight": ([cfg.q_lora, H], BF), a + "q_a_layernorm.weight": ([cfg.q_lora], None),
                      a + "q_b_proj.weight": ([nh * (cfg.nope + cfg.rope), cfg.q_lora], BF),
                      a + "kv_a_proj_with_mqa.weight": ([cfg.kv_lora + cfg.rope, H], BF),
                      a + "kv_a_layernorm.weight": ([cfg.kv_lora], None),
                      a + "kv_b_proj.weight": ([nh * (cfg.nope + cfg.v_dim), cfg.kv_lora], BF),
                      a + "o_proj.weight": ([H, nh * cfg.v_dim], BF), a + "g_proj.weight": ([nh * cfg.v_dim, H], BF)})
        else:
            for n in ("q", "k", "v", "g"):
                e[a + n + "_proj.weight"] = ([P, H], BF)
            for n in ("q", "k", "v"):
                e[a + n + "_conv1d.weight"] = ([P, 1, cfg.conv_k], F32)
            e.update({a + "o_proj.weight": ([H, P], BF), a + "f_a_proj.weight": ([D, H], BF),
                      a + "f_b_proj.weight": ([P, D], BF), a + "b_proj.weight": ([cfg.kda_heads, H], BF),
                      a + "A_log": (None, F32), a + "dt_bias": ([P], F32), a + "o_norm.weight": ([D], None)})
        if L < cfg.first_dense:
            I = cfg.dense_inter
            e.update({p + "mlp.gate_proj.weight": ([I, H], BF), p + "mlp.up_proj.weight": ([I, H], BF),
                      p + "mlp.down_proj.weight": ([H, I], BF)})
            continue
        m, S, lat, mi = p + "block_sparse_moe.", cfg.n_shared * cfg.moe_inter, cfg.latent, cfg.moe_inter
        e.update({m + "gate.weight": ([cfg.n_experts, H], None),
                  m + "gate.e_score_correction_bias": ([cfg.n_experts], None),
                  m + "routed_expert_down_proj.weight": ([lat, H], BF),
                  m + "routed_expert_up_proj.weight": ([H, lat], BF),
                  m + "routed_expert_norm.weight": ([lat], None)})
        if cfg.n_shared:
            e.update({m + "shared_experts.gate_proj.weight": ([S, H], BF),
                      m + "shared_experts.up_proj.weight": ([S, H], BF),
                      m + "shared_experts.down_proj.weight": ([H, S], BF)})
        for x in range(cfg.n_experts):
            for w, rows, cols in (("w1", mi, lat), ("w3", mi, lat), ("w2", lat, mi)):
                e[f"{m}experts.{x}.{w}.weight_packed"] = ([rows, cols // 2], U8)
                e[f"{m}experts.{x}.{w}.weight_scale"] = ([rows, cols // 32], U8)
    return e


def check_checkpoint(model_dir: Path, cfg: k3ref.RefConfig) -> dict:
    """Names, shapes and dtypes against MODEL.md §3, read from the headers only."""
    from safetensors import safe_open
    found = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="np") as sf:
            for name in sf.keys():
                sl = sf.get_slice(name)
                found[name] = (list(sl.get_shape()), sl.get_dtype(), f.name)
    short = {}
    for name, v in found.items():
        if name == k3ref.HEAD_NAME:
            short["lm_head.weight"] = v
        elif name.startswith(k3ref.LM_PREFIX):
            short[name[len(k3ref.LM_PREFIX):]] = v
    exp = expected_tensors(cfg)
    problems = [f"missing {n}" for n in exp if n not in short]
    problems += [f"unexpected {n}" for n in short if n not in exp]
    for n, (shape, dtype) in exp.items():
        if n not in short:
            continue
        got_shape, got_dtype, _ = short[n]
        if shape is not None and got_shape != shape:
            problems.append(f"{n}: shape {got_shape}, expected {shape}")
        if dtype is not None and got_dtype != dtype:
            problems.append(f"{n}: dtype {got_dtype}, expected {dtype}")
        if n.endswith("A_log") and (len(got_shape) != 1 or got_shape[0] < cfg.kda_heads):
            problems.append(f"{n}: shape {got_shape}, expected a vector of >= heads floats")
    dtypes = {}
    for n, (_, dt, _) in short.items():
        kind = n.split(".")[-2] if n.endswith(".weight") else n.split(".")[-1]
        dtypes.setdefault(dt, set()).add(kind)
    other = sorted(n for n in found if not n.startswith((k3ref.LM_PREFIX, k3ref.HEAD_NAME))
                   and not n.startswith(k3ref.SKIP_PREFIXES))
    return {"n_tensors": len(found), "shards": sorted({v[2] for v in found.values()}),
            "has_index_json": (model_dir / "model.safetensors.index.json").exists(),
            "problems": problems + [f"unexpected top-level {n}" for n in other],
            "dtypes": {k: sorted(v) for k, v in dtypes.items()}}


def trap_report(model: k3ref.RefModel, ids: list) -> dict:
    """How hard the checkpoint's weights exercise the MODEL.md traps, measured on one pass."""
    cfg, W = model.cfg, model.W
    trace = {}
    model.logits(ids, trace)
    rep = {"situ": {}, "router": {}, "kda": {}}
    for kind in ("dense", "moe.shared", "moe.expert"):
        g = [x for L in range(cfg.n_layers) for x in trace[L].get(kind + ".g", [])]
        u = [x for L in range(cfg.n_layers) for x in trace[L].get(kind + ".u", [])]
        if not g:
            continue
        g, u = torch.cat([x.reshape(-1) for x in g]), torch.cat([x.reshape(-1) for x in u])
        rep["situ"][kind] = {
            "max_abs_g_over_beta": (g.abs().max() / cfg.situ_beta).item(),
            "frac_g_gate_cap_saturated(|g|>3beta)": (g.abs() > 3 * cfg.situ_beta).double().mean().item(),
            "frac_g_below_-3beta": (g < -3 * cfg.situ_beta).double().mean().item(),
            "max_abs_u_over_lambda": (u.abs().max() / cfg.situ_linear_beta).item(),
            "frac_u_linear_cap_saturated(|u|>3lambda)": (u.abs() > 3 * cfg.situ_linear_beta).double().mean().item()}
    n_tok = n_reordered = n_order_changed = 0
    used = set()
    for L in range(cfg.first_dense, cfg.n_layers):
        idx, ub = trace[L]["router.idx"], trace[L]["router.unbiased_idx"]
        for a, b in zip(idx.tolist(), ub.tolist()):
            n_tok += 1
            n_reordered += set(a) != set(b)
            n_order_changed += a != b
            used.update((L, e) for e in a)
    rep["router"] = {"layer_token_pairs": n_tok, "bias_changed_selected_set": n_reordered,
                     "bias_changed_selection_order": n_order_changed,
                     "distinct_layer_expert_pairs_used": len(used),
                     "of": (cfg.n_layers - cfg.first_dense) * cfg.n_experts}
    alphas = [trace[L]["kda.alpha"] for L in range(cfg.n_layers) if "kda.alpha" in trace[L]]
    a = torch.cat([x.reshape(-1) for x in alphas])
    a_log = [W[f"layers.{L}.self_attn.A_log"].reshape(-1)[:cfg.kda_heads].tolist()
             for L in range(cfg.n_layers) if not cfg.is_mla(L)]
    dt = torch.cat([W[f"layers.{L}.self_attn.dt_bias"].reshape(-1) for L in range(cfg.n_layers)
                    if not cfg.is_mla(L)])
    rep["kda"] = {"alpha_min": a.min().item(), "alpha_max": a.max().item(),
                  "lower_bound_floor": float(np.exp(cfg.gate_lower_bound)),
                  "A_log_per_head_layer0": a_log[0], "A_log_min": min(map(min, a_log)),
                  "A_log_max": max(map(max, a_log)), "dt_bias_abs_max": dt.abs().max().item()}
    return rep


def router_min_margin(model: k3ref.RefModel, ids: list) -> float:
    """Smallest gap between the k-th and (k+1)-th biased router score over every MoE layer
    and position of ids: how close the oracle is to flipping an expert choice."""
    cfg, trace = model.cfg, {}
    model.logits(ids, trace)
    gaps = []
    for L in range(cfg.first_dense, cfg.n_layers):
        s = torch.sort(trace[L]["router.biased"], dim=-1, descending=True).values
        gaps.append((s[:, cfg.top_k - 1] - s[:, cfg.top_k]).min().item())
    return min(gaps)


def fp32_check(model: k3ref.RefModel, tf_ids: list, tf_logits: np.ndarray, prompt: list,
               greedy_ids: list, greedy_logits: np.ndarray) -> dict:
    """The same reference in float32: how far plain fp32 arithmetic lands from the oracle,
    i.e. how well-conditioned this checkpoint is against MODEL.md §8's 5.1e-4 × max|ref|."""
    m32 = k3ref.RefModel(model.cfg, {k: v.float() for k, v in model.W.items()})
    l32 = m32.logits(tf_ids).double().numpy()
    g32 = m32.logits(prompt + greedy_ids[:-1]).double().numpy()[len(prompt) - 1:]  # same prefixes
    ids, out = list(prompt), []
    for _ in range(len(greedy_ids)):
        nxt = int(np.argmax(m32.logits(ids)[-1].double().numpy()))
        out.append(nxt)
        ids.append(nxt)
    rel = lambda a, b: float(np.abs(a - b).max() / np.abs(b).max())
    return {"tf_max_abs_diff_over_max_abs_ref": rel(l32, tf_logits),
            "greedy_max_abs_diff_over_max_abs_ref": rel(g32, greedy_logits),
            "greedy_ids_equal": out == greedy_ids}


def mxfp4_report(model_dir: Path) -> dict:
    """Scale-byte range, 255 groups, and whether any expert matrix has all-zero nibbles."""
    raw = k3ref.read_tensors(model_dir)
    scales = [t for n, t in raw.items() if n.endswith(".weight_scale")]
    packed = {n: t for n, t in raw.items() if n.endswith(".weight_packed")}
    s = torch.cat([t.reshape(-1) for t in scales]).to(torch.int64)
    zero = [n for n, t in packed.items() if not t.any()]
    return {"n_expert_matrices": len(packed), "scale_byte_min": int(s.min()), "scale_byte_max": int(s.max()),
            "n_scale_255_groups": int((s == 255).sum()), "all_zero_nibble_matrices": zero,
            "nibble_order_matters": any(not torch.equal(t & 0xF, t >> 4) for t in packed.values())}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--prompt", required=True, help="comma-separated token ids")
    ap.add_argument("--tf-len", type=int, default=32)
    ap.add_argument("--gen", type=int, default=20)
    ap.add_argument("--tf-seed", type=int, default=0)
    ap.add_argument("--label", default=None, help="shape name / seed, recorded in the sidecar")
    args = ap.parse_args(argv)

    model = k3ref.load_model(args.model_dir)
    V = model.cfg.vocab
    prompt = [int(x) for x in args.prompt.split(",")]
    if not prompt or not all(0 <= i < V for i in prompt) or len(prompt) > args.tf_len:
        ap.error(f"prompt ids must be in [0, {V}) and no longer than --tf-len")
    rng = np.random.default_rng(args.tf_seed)
    tf_ids = np.array(prompt + rng.integers(0, V, size=args.tf_len - len(prompt), dtype=np.int64).tolist(),
                      dtype=np.int64)
    with torch.no_grad():
        tf_logits = model.logits(tf_ids.tolist()).numpy()
        ids, greedy_ids, greedy_logits = list(prompt), [], []
        for _ in range(args.gen):  # greedy by full recomputation, lowest index wins ties
            row = model.logits(ids)[-1].numpy()
            nxt = int(np.argmax(row))
            greedy_ids.append(nxt)
            greedy_logits.append(row)
            ids.append(nxt)
        traps = trap_report(model, tf_ids.tolist())
        traps["router"]["min_topk_margin"] = min(router_min_margin(model, tf_ids.tolist()),
                                                 router_min_margin(model, prompt + greedy_ids[:-1]))
        fp32 = fp32_check(model, tf_ids.tolist(), tf_logits, prompt, greedy_ids, np.stack(greedy_logits))
    greedy_logits = np.stack(greedy_logits)
    # causality check: the first greedy step sees exactly the prompt, as tf position len-1 does
    causal_err = float(np.abs(greedy_logits[0] - tf_logits[len(prompt) - 1]).max())
    if causal_err > 1e-9 * max(1.0, float(np.abs(tf_logits).max())):
        raise SystemExit(f"reference is not causal: {causal_err}")
    tf_gap, g_gap = top2_gap(tf_logits), top2_gap(greedy_logits)
    min_gap = float(min(tf_gap.min(), g_gap.min()))

    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, prompt_ids=np.array(prompt, np.int64), tf_ids=tf_ids,
                        tf_logits=tf_logits, greedy_ids=np.array(greedy_ids, np.int64),
                        greedy_logits=greedy_logits, tf_top2_gap=tf_gap, greedy_top2_gap=g_gap,
                        min_top2_gap=np.float64(min_gap))
    d = args.model_dir
    side = {
        "label": args.label,
        "reference": "tests/reference/k3ref.py (float64, CPU, full recomputation; independent of k3core)",
        "torch_version": torch.__version__, "numpy_version": np.__version__,
        "command": " ".join(shlex.quote(a) for a in [Path(sys.argv[0]).name] + (argv or sys.argv[1:])),
        "config_sha256": sha256(d / "config.json"),
        "files_sha256": {f.name: sha256(f) for f in sorted(d.glob("*.safetensors"))
                         + sorted(d.glob("*.index.json"))},
        "generator": (json.loads((d / "k3-test-model.json").read_text())
                      if (d / "k3-test-model.json").exists() else None),
        "tf_rule": TF_RULE, "tf_seed": args.tf_seed,
        "prompt_ids": prompt, "greedy_ids": greedy_ids, "min_top2_gap": min_gap,
        "max_abs_tf_logit": float(np.abs(tf_logits).max()), "causality_max_abs_diff": causal_err,
        "checkpoint_check": check_checkpoint(d, model.cfg),
        "traps": traps, "mxfp4": mxfp4_report(d), "fp32_reference": fp32,
    }
    args.out.with_suffix(".json").write_text(json.dumps(side, indent=1) + "\n")
    print(json.dumps({"greedy_ids": greedy_ids, "min_top2_gap": min_gap, "fp32_reference": fp32,
                      "router_min_topk_margin": traps["router"]["min_topk_margin"],
                      "problems": side["checkpoint_check"]["problems"][:20]}))


if __name__ == "__main__":
    main()
