"""Independent float64 reference of the Kimi K3 language model, written from the model's
specification alone (SPEC.md, kept outside this repository; docs/MODEL.md restates it).

It exists to produce oracle fixtures (tests/fixtures/oracles) and to be checked against the
kimi-k3-in-c op fixtures; it shares no code with k3core and never imports it. It is slow on
purpose: full recomputation over the whole sequence, dense float64 weights, no caches.
Needs torch (CPU); the project's torch-free `make test` never imports it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

F64 = torch.float64
LM_PREFIX = "language_model.model."
HEAD_NAME = "language_model.lm_head.weight"
SKIP_PREFIXES = ("vision_tower.", "mm_projector.")

# ----------------------------------------------------------------------------- config


@dataclass(frozen=True)
class RefConfig:
    hidden: int
    n_layers: int
    vocab: int
    eps: float
    kda_heads: int
    kda_dim: int
    conv_k: int
    gate_lower_bound: float
    full_attn_layers: tuple  # ONE-based
    mla_heads: int
    q_lora: int
    kv_lora: int
    nope: int
    rope: int
    v_dim: int
    n_experts: int
    top_k: int
    n_shared: int
    latent: int
    moe_inter: int
    routed_scale: float
    first_dense: int
    dense_inter: int
    block_size: int
    situ_beta: float
    situ_linear_beta: float
    mla_gate: bool = True
    moe_renorm: bool = True
    latent_norm: bool = True

    def is_mla(self, L: int) -> bool:
        return (L + 1) in self.full_attn_layers  # MODEL.md trap: the list is ONE-based

    @staticmethod
    def from_dict(raw: dict) -> "RefConfig":
        nested = "text_config" in raw
        tc = raw["text_config"] if nested else raw
        kc = tc.get("linear_attn_config", {}) if nested else raw
        # (our field, dict to read, accepted names, type)
        spec = [
            ("hidden", tc, ["hidden_size"], int),
            ("n_layers", tc, ["num_hidden_layers"], int),
            ("vocab", tc, ["vocab_size"], int),
            ("eps", tc, ["rms_norm_eps"], float),
            ("kda_heads", kc, ["num_heads"] if nested else ["kda_num_heads"], int),
            ("kda_dim", kc, ["head_dim"] if nested else ["kda_head_dim"], int),
            ("conv_k", kc, ["short_conv_kernel_size"], int),
            ("gate_lower_bound", kc, ["gate_lower_bound"], float),
            ("full_attn_layers", kc, ["full_attn_layers"], list),
            ("mla_heads", tc, ["num_attention_heads"], int),
            ("q_lora", tc, ["q_lora_rank"], int),
            ("kv_lora", tc, ["kv_lora_rank"], int),
            ("nope", tc, ["qk_nope_head_dim"], int),
            ("rope", tc, ["qk_rope_head_dim"], int),
            ("v_dim", tc, ["v_head_dim"], int),
            ("n_experts", tc, ["num_experts"], int),
            ("top_k", tc, ["num_experts_per_token"], int),
            ("n_shared", tc, ["num_shared_experts"], int),
            ("latent", tc, ["routed_expert_hidden_size"], int),
            ("moe_inter", tc, ["moe_intermediate_size"], int),
            ("routed_scale", tc, ["routed_scaling_factor"], float),
            ("first_dense", tc, ["first_k_dense_replace"], int),
            ("dense_inter", tc, ["intermediate_size"], int),
            ("block_size", tc, ["attn_res_block_size"], int),
            ("situ_beta", tc, ["activation_situ_beta", "situ_beta"], float),
            ("situ_linear_beta", tc, ["activation_situ_linear_beta", "situ_linear_beta"], float),
        ]
        vals, problems = {}, []
        for field, src, names, typ in spec:
            name = next((n for n in names if n in src), None)
            if name is None:
                problems.append(f"missing {names[0]}")
                continue
            v = src[name]
            ok = isinstance(v, list) if typ is list else (
                isinstance(v, (int, float)) and not isinstance(v, bool)
                and (typ is float or float(v).is_integer()))
            if not ok:
                problems.append(f"{name} has wrong type {type(v).__name__}")
                continue
            vals[field] = tuple(int(i) for i in v) if typ is list else typ(v)
        for field, name in [("mla_gate", "mla_use_output_gate"), ("moe_renorm", "moe_renormalize"),
                            ("latent_norm", "latent_moe_use_norm")]:
            vals[field] = bool(tc.get(name, True))
        if problems:
            raise ValueError("config.json: " + "; ".join(problems))
        cfg = RefConfig(**vals)
        fal = cfg.full_attn_layers
        if (not fal or len(set(fal)) != len(fal) or not all(1 <= i <= cfg.n_layers for i in fal)
                or len(fal) >= cfg.n_layers):
            raise ValueError(f"config.json: bad full_attn_layers {list(fal)}")
        if not 1 <= cfg.top_k <= cfg.n_experts or cfg.block_size <= 0 or cfg.conv_k < 1:
            raise ValueError("config.json: bad top-k / attn_res_block_size / conv kernel")
        return cfg


# ----------------------------------------------------------------------------- primitives


def rmsnorm(x, w, eps):
    """w ⊙ x / sqrt(mean(x²) + eps) over the last dim; w=None means no gain."""
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def situ_glu(g, u, beta, linear_beta):
    """β·tanh(g/β)·σ(g) · λ·tanh(u/λ). MODEL.md trap: the sigmoid takes the UNCAPPED g."""
    return beta * torch.tanh(g / beta) * torch.sigmoid(g) * linear_beta * torch.tanh(u / linear_beta)


def mlp(x, w_gate, w_up, w_down, beta, linear_beta, trace=None, name="mlp"):
    """W_down · SiTU-GLU(W_gate x, W_up x); x [T, in]. trace: dict collecting the
    pre-activations under `{name}.g` / `{name}.u` (appended, one entry per call)."""
    g, u = x @ w_gate.T, x @ w_up.T
    if trace is not None:
        trace.setdefault(name + ".g", []).append(g)
        trace.setdefault(name + ".u", []).append(u)
    return situ_glu(g, u, beta, linear_beta) @ w_down.T


def short_conv(x, w, history=None):
    """Causal depthwise conv over time, then SiLU. x [T, C], w [C, 1, K], history [C, K-1]
    (oldest first, zeros if None). Tap K-1 multiplies the current input.
    Returns (out [T, C], new history [C, K-1])."""
    T, C = x.shape
    K = w.shape[-1]
    if history is None:
        history = torch.zeros(C, K - 1, dtype=x.dtype)
    xp = torch.cat([history.T, x], dim=0)  # [K-1+T, C]
    taps = w[:, 0, :]  # [C, K]
    out = torch.stack([(xp[t:t + K] * taps.T).sum(0) for t in range(T)])  # [T, C]
    return torch.nn.functional.silu(out), xp[T:].T.clone()  # last K-1 inputs


def l2norm(x):
    """x / sqrt(sum(x²) + 1e-6) over the last dim (sum, not mean)."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def kda_decay(z, A_log, dt_bias, heads, lower_bound):
    """g[h,d] = lower_bound · σ(exp(A_log[h]) · (z + dt_bias)[h,d]); α = exp(g).
    z = f_b(f_a x) [T, P] before dt_bias. MODEL.md trap: A_log is per HEAD (first `heads` entries).
    Returns g [T, heads, D]."""
    T, P = z.shape
    zz = (z + dt_bias).reshape(T, heads, P // heads)
    return lower_bound * torch.sigmoid(torch.exp(A_log[:heads]).reshape(1, heads, 1) * zz)


def kda_recurrence(q, k, v, alpha, beta, state=None):
    """Gated delta rule, one token at a time. q, k [T, h, Dk] (q already scaled by Dk^-½),
    v [T, h, Dv], alpha [T, h, Dk], beta [T, h], state [h, Dk, Dv] (zeros if None).
    Order (MODEL.md trap): decay rows → u = Sᵀk → S += k(β(v−u))ᵀ → o = Sᵀq on the UPDATED S."""
    T, h, Dk = k.shape
    Dv = v.shape[-1]
    S = torch.zeros(h, Dk, Dv, dtype=q.dtype) if state is None else state.clone()
    outs = []
    for t in range(T):
        S = alpha[t][:, :, None] * S  # row i of S_h scaled by α[h, i]
        u = torch.einsum("hij,hi->hj", S, k[t])  # [h, Dv]
        S = S + k[t][:, :, None] * (beta[t][:, None] * (v[t] - u))[:, None, :]
        outs.append(torch.einsum("hij,hi->hj", S, q[t]))
    return torch.stack(outs), S  # [T, h, Dv], [h, Dk, Dv]


def kda_layer(cfg, W, x, state=None, conv_hist=None, trace=None):
    """KDA attention on x [T, H] (already input_layernorm-ed). W: names relative to `self_attn.`.
    Returns (out [T, H], state [h, D, D], conv history dict)."""
    T = x.shape[0]
    h, D = cfg.kda_heads, cfg.kda_dim
    hist = conv_hist or {}
    q, hq = short_conv(x @ W["q_proj.weight"].T, W["q_conv1d.weight"], hist.get("q"))
    k, hk = short_conv(x @ W["k_proj.weight"].T, W["k_conv1d.weight"], hist.get("k"))
    v, hv = short_conv(x @ W["v_proj.weight"].T, W["v_conv1d.weight"], hist.get("v"))
    q = l2norm(q.reshape(T, h, D)) * D ** -0.5  # [T, h, D]
    k = l2norm(k.reshape(T, h, D))
    v = v.reshape(T, h, D)
    beta = torch.sigmoid(x @ W["b_proj.weight"].T)  # [T, h], one scalar per head
    z = (x @ W["f_a_proj.weight"].T) @ W["f_b_proj.weight"].T  # [T, P], one shared low-rank pair
    g = kda_decay(z, W["A_log"].reshape(-1), W["dt_bias"].reshape(-1), h, cfg.gate_lower_bound)
    o, S = kda_recurrence(q, k, v, torch.exp(g), beta, state)
    y = rmsnorm(o, W["o_norm.weight"], cfg.eps).reshape(T, h * D)  # norm first …
    y = y * torch.sigmoid(x @ W["g_proj.weight"].T)  # … then gate
    if trace is not None:
        trace["kda.alpha"], trace["kda.beta"], trace["kda.o"] = torch.exp(g), beta, o
    return y @ W["o_proj.weight"].T, S, {"q": hq, "k": hk, "v": hv}


def mla(cfg, W, x, trace=None):
    """Gated MLA, NoPE, causal, over x [T, H]. W: names relative to `self_attn.`."""
    T = x.shape[0]
    nh, nope, rope, dv, r = cfg.mla_heads, cfg.nope, cfg.rope, cfg.v_dim, cfg.kv_lora
    q = rmsnorm(x @ W["q_a_proj.weight"].T, W["q_a_layernorm.weight"], cfg.eps) @ W["q_b_proj.weight"].T
    q = q.reshape(T, nh, nope + rope)  # per head [nope | rope]
    c = x @ W["kv_a_proj_with_mqa.weight"].T  # [T, r + rope]
    latent = rmsnorm(c[:, :r], W["kv_a_layernorm.weight"], cfg.eps)
    k_rope = c[:, r:]  # [T, rope]: ONE key shared by all heads, never rotated (MODEL.md trap)
    kv = (latent @ W["kv_b_proj.weight"].T).reshape(T, nh, nope + dv)
    k = torch.cat([kv[:, :, :nope], k_rope[:, None, :].expand(T, nh, rope)], dim=-1)  # [T, nh, nope+rope]
    v = kv[:, :, nope:]  # [T, nh, dv]
    scores = torch.einsum("thd,shd->hts", q, k) * (nope + rope) ** -0.5  # scale over nope+rope
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    p = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    y = torch.einsum("hts,shd->thd", p, v).reshape(T, nh * dv)
    if cfg.mla_gate:
        y = y * torch.sigmoid(x @ W["g_proj.weight"].T)  # output gate, no norm
    if trace is not None:
        trace["mla.kv_latent"], trace["mla.k_rope"], trace["mla.p"] = latent, k_rope, p
    return y @ W["o_proj.weight"].T


def router(x, gate_w, bias, top_k, scale, renorm=True):
    """σ scores; top-k by score + bias (lowest index wins ties); weights from UNBIASED scores.
    x [T, H] → (idx [T, k] in selection order, weights [T, k])."""
    s = torch.sigmoid(x @ gate_w.T)  # [T, E]
    order = torch.sort(-(s + bias), dim=-1, stable=True).indices  # stable: ties → lower index
    idx = order[:, :top_k]
    w = torch.gather(s, 1, idx)
    if renorm:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return idx, w * scale


def latent_moe(cfg, W, x, trace=None):
    """Latent MoE on x [T, H] (post_attention_layernorm-ed). W: names relative to
    `block_sparse_moe.`, experts as dense float weights `experts.E.w{1,2,3}.weight`."""
    idx, w = router(x, W["gate.weight"], W["gate.e_score_correction_bias"], cfg.top_k,
                    cfg.routed_scale, cfg.moe_renorm)
    z = x @ W["routed_expert_down_proj.weight"].T  # [T, latent]
    agg = torch.zeros_like(z)
    for t in range(x.shape[0]):
        for j in range(cfg.top_k):  # fixed order: selection rank
            e = int(idx[t, j])
            agg[t] += w[t, j] * mlp(z[t:t + 1], W[f"experts.{e}.w1.weight"], W[f"experts.{e}.w3.weight"],
                                    W[f"experts.{e}.w2.weight"], cfg.situ_beta, cfg.situ_linear_beta,
                                    trace, "moe.expert")[0]
    if cfg.latent_norm:
        agg = rmsnorm(agg, W["routed_expert_norm.weight"], cfg.eps)  # on the AGGREGATE
    out = agg @ W["routed_expert_up_proj.weight"].T
    if "shared_experts.gate_proj.weight" in W:  # shared MLP sees the ORIGINAL x
        out = out + mlp(x, W["shared_experts.gate_proj.weight"], W["shared_experts.up_proj.weight"],
                        W["shared_experts.down_proj.weight"], cfg.situ_beta, cfg.situ_linear_beta,
                        trace, "moe.shared")
    if trace is not None:
        s = torch.sigmoid(x @ W["gate.weight"].T)
        trace["router.idx"], trace["router.w"], trace["moe.z"], trace["moe.agg"] = idx, w, z, agg
        trace["router.biased"] = s + W["gate.e_score_correction_bias"]
        trace["router.unbiased_idx"] = torch.sort(-s, dim=-1, stable=True).indices[:, :cfg.top_k]
    return out


def attn_res(sources, fold, eps):
    """sources: list of [T, H]. Keys are RMSNorm-without-gain(source)·fold, softmax over
    sources, values are the RAW sources. fold = w_norm ⊙ w_proj."""
    src = torch.stack(sources)  # [S, T, H]
    p = torch.softmax(rmsnorm(src, None, eps) @ fold, dim=0)  # [S, T]
    return (p[:, :, None] * src).sum(0)


# ----------------------------------------------------------------------------- layers / model


def decoder_layer(cfg, L, W, h, blocks, trace=None):
    """MODEL.md §4.1. h [T, H] = the previous layer's output (the running prefix); blocks: list
    of [T, H] snapshots. W: names relative to `layers.{L}.`. Returns (prefix, blocks)."""
    fold_attn = W["self_attention_res_norm.weight"] * W["self_attention_res_proj.weight"].reshape(-1)
    fold_mlp = W["mlp_res_norm.weight"] * W["mlp_res_proj.weight"].reshape(-1)
    prefix = h
    if blocks:
        h = attn_res(blocks + [prefix], fold_attn, cfg.eps)
    if L % cfg.block_size == 0:
        blocks = blocks + [prefix]
        prefix = None
    sub = lambda p: {k[len(p):]: v for k, v in W.items() if k.startswith(p)}
    t = {} if trace is not None else None  # this layer's named intermediates
    x = rmsnorm(h, W["input_layernorm.weight"], cfg.eps)
    if cfg.is_mla(L):
        a = mla(cfg, sub("self_attn."), x, t)
    else:
        a = kda_layer(cfg, sub("self_attn."), x, trace=t)[0]
    prefix = a if prefix is None else prefix + a
    h = attn_res(blocks + [prefix], fold_mlp, cfg.eps)
    x = rmsnorm(h, W["post_attention_layernorm.weight"], cfg.eps)
    if L < cfg.first_dense:
        m = mlp(x, W["mlp.gate_proj.weight"], W["mlp.up_proj.weight"], W["mlp.down_proj.weight"],
                cfg.situ_beta, cfg.situ_linear_beta, t, "dense")
    else:
        m = latent_moe(cfg, sub("block_sparse_moe."), x, t)
    prefix = m if prefix is None else prefix + m
    if trace is not None:
        trace[L] = {"attn_out": a, "mlp_in": h, "mlp_out": m, "out": prefix, **t}
    return prefix, blocks


class RefModel:
    """A config plus a dict of float64 tensors named as in the checkpoint, minus
    `language_model.model.` (the head is `lm_head.weight`); experts already decoded."""

    def __init__(self, cfg: RefConfig, weights: dict):
        self.cfg, self.W = cfg, weights
        self.layer_W = [{k[len(f"layers.{L}."):]: v for k, v in weights.items()
                         if k.startswith(f"layers.{L}.")} for L in range(cfg.n_layers)]

    def logits(self, ids, trace=None) -> torch.Tensor:
        """Full recomputation over ids → logits [T, V] float64."""
        cfg, W = self.cfg, self.W
        h = W["embed_tokens.weight"][torch.as_tensor(list(ids), dtype=torch.long)]  # gather rows
        blocks = []
        for L in range(cfg.n_layers):
            h, blocks = decoder_layer(cfg, L, self.layer_W[L], h, blocks, trace)
        fold = W["output_attn_res_norm.weight"] * W["output_attn_res_proj.weight"].reshape(-1)
        h = attn_res(blocks + [h], fold, cfg.eps)
        return rmsnorm(h, W["norm.weight"], cfg.eps) @ W["lm_head.weight"].T


# ----------------------------------------------------------------------------- MXFP4 + loading

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                     -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=F64)


def decode_mxfp4(packed, scales, swap_nibbles=False):
    """packed uint8 [R, C/2], scales uint8 [R, C/32] → float64 [R, C].
    Byte k holds element 2k in the LOW nibble, 2k+1 in the high one (swap_nibbles=True gives
    the wrong order, for tests). Scale byte 255 → the group is zero."""
    packed, scales = packed.to(torch.int64), scales.to(torch.int64)
    R, half = packed.shape
    if scales.shape[1] * 32 != half * 2:
        raise ValueError(f"MXFP4: scale_cols {scales.shape[1]} * 32 != packed_cols {half} * 2")
    lo, hi = packed & 0xF, packed >> 4
    even, odd = (hi, lo) if swap_nibbles else (lo, hi)
    vals = E2M1[torch.stack([even, odd], dim=-1).reshape(R, 2 * half)]
    mult = torch.where(scales == 255, torch.zeros((), dtype=F64),
                       torch.pow(torch.tensor(2.0, dtype=F64), (scales - 127).to(F64)))
    return vals * mult.repeat_interleave(32, dim=1)


def read_tensors(model_dir):
    """All non-vision tensors of every *.safetensors under model_dir, by full name.
    Refuses a name that appears in two files."""
    from safetensors.torch import safe_open
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors")
    out, where = {}, {}
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for name in sf.keys():
                if name.startswith(SKIP_PREFIXES):
                    continue
                if name in where:
                    raise ValueError(f"{name} in both {where[name]} and {f.name}")
                where[name] = f.name
                out[name] = sf.get_tensor(name)
    return out


def load_model(model_dir) -> RefModel:
    cfg = RefConfig.from_dict(json.loads((Path(model_dir) / "config.json").read_text()))
    raw = read_tensors(model_dir)
    W = {}
    for name, t in raw.items():
        if name == HEAD_NAME:
            W["lm_head.weight"] = t.to(F64)
        elif name.startswith(LM_PREFIX):
            short = name[len(LM_PREFIX):]
            if short.endswith(".weight_packed"):
                base = short[: -len(".weight_packed")]
                W[base + ".weight"] = decode_mxfp4(t, raw[LM_PREFIX + base + ".weight_scale"])
            elif not short.endswith(".weight_scale"):
                if t.dtype == torch.uint8:
                    raise ValueError(f"{name}: unexpected U8 tensor outside the experts")
                W[short] = t.to(F64)
        else:
            raise ValueError(f"unexpected tensor {name}")
    return RefModel(cfg, W)
