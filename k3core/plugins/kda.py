"""Kimi Delta Attention (MODEL.md §4.2): linear attention with a fixed D×D state per head.

Per token: ShortConv'd q, k, v; per-head L2 norm of q, k; a per-channel decay α from one
shared low-rank pair; the delta-rule recurrence; head-wise RMSNorm, then the output gate.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..plugin_api import FLOAT, MATRIX, AttentionBackend, TensorSpec, hookimpl

L2_EPS = 1e-6


@dataclass
class KDAState:
    S: np.ndarray        # [heads, D, D] float32, starts at zero
    history: np.ndarray  # [3 (q, k, v), K-1, P] the last K-1 conv inputs, oldest first
    journal: "Journal | None" = None  # since the last mark (speculation), what rollback replays
    keep: list = field(default_factory=list)   # rows of the next forward after which to keep S and history
    taken: dict = field(default_factory=dict)  # what was kept: row -> {"S", "history"}

    def __deepcopy__(self, memo):
        return KDAState(self.S.copy(), self.history.copy())


@dataclass
class Journal:
    """The state at a mark and, per position forwarded since, the recurrence's inputs and the conv inputs:
    enough to replay the recurrence over any prefix of them."""

    S: np.ndarray
    history: np.ndarray
    chunks: list = field(default_factory=list)  # (conv inputs [3, T, P], q, k, v [T, heads, D], alpha, beta)

    @property
    def positions(self) -> int:
        return sum(chunk[0].shape[1] for chunk in self.chunks)

    def first(self, kept: int) -> list[np.ndarray]:
        """(conv inputs [3, kept, P], q, k, v, alpha, beta) over the first `kept` positions."""
        conv_in = np.concatenate([chunk[0] for chunk in self.chunks], axis=1)[:, :kept]
        return [conv_in, *(np.concatenate([chunk[i] for chunk in self.chunks])[:kept] for i in range(1, 6))]


class KDA(AttentionBackend):
    kind = "kda"
    name = "kda"

    def tensor_specs(self, c, layer):
        H, P, D, K = c.hidden_size, c.kda_proj_dim, c.kda_head_dim, c.short_conv_kernel_size
        a = "self_attn."
        return [TensorSpec(a + n, (P, H), MATRIX) for n in
                ("q_proj.weight", "k_proj.weight", "v_proj.weight", "g_proj.weight")] + [
            TensorSpec(a + "o_proj.weight", (H, P), MATRIX),
            *(TensorSpec(a + f"{n}_conv1d.weight", (P, 1, K), FLOAT) for n in "qkv"),
            TensorSpec(a + "f_a_proj.weight", (D, H), MATRIX),
            TensorSpec(a + "f_b_proj.weight", (P, D), MATRIX),
            TensorSpec(a + "b_proj.weight", (c.kda_num_heads, H), MATRIX),
            TensorSpec(a + "A_log", None, FLOAT, min_numel=c.kda_num_heads),
            TensorSpec(a + "dt_bias", (P,), FLOAT),
            TensorSpec(a + "o_norm.weight", (D,), FLOAT),
        ]

    def new_state(self, c, layer):
        heads, D, P = c.kda_num_heads, c.kda_head_dim, c.kda_proj_dim
        return KDAState(np.zeros((heads, D, D), np.float32),
                        np.zeros((3, c.short_conv_kernel_size - 1, P), np.float32))

    def state_bytes(self, c, layer, context):
        return 4 * (c.kda_num_heads * c.kda_head_dim ** 2 + 3 * (c.short_conv_kernel_size - 1) * c.kda_proj_dim)

    def state_arrays(self, state):
        return {"S": state.S, "history": state.history}

    def state_from_arrays(self, c, layer, arrays):
        empty = self.new_state(c, layer)
        for name in ("S", "history"):
            if arrays[name].shape != getattr(empty, name).shape or arrays[name].dtype != np.float32:
                raise ValueError(f"layer {layer}: KDA {name} has shape {arrays[name].shape}, "
                                 f"expected {getattr(empty, name).shape} float32")
        return KDAState(arrays["S"].copy(), arrays["history"].copy())

    def forward(self, w, x, state, c, kr):
        return self.sequences(w, x, [(0, x.shape[0], state)], c, kr)

    def forward_batch(self, w, x, segments, c, kr):
        return self.sequences(w, x, segments, c, kr)

    def sequences(self, w, x, segments, c, kr):
        """forward and forward_batch: one implementation for one sequence or several."""
        T, heads, D = x.shape[0], c.kda_num_heads, c.kda_head_dim
        a = "self_attn."
        conv_in = np.stack([kr.linear(w[a + f"{n}_proj.weight"], x) for n in "qkv"])  # [3, T, P], all rows at once
        conv_w = [w.vec(a + f"{n}_conv1d.weight")[:, 0, :] for n in "qkv"]
        beta = kr.sigmoid(kr.linear(w[a + "b_proj.weight"], x))  # [T, heads]
        z = kr.linear(w[a + "f_b_proj.weight"], kr.linear(w[a + "f_a_proj.weight"], x))  # one pair for all heads
        a_log = w.vec(a + "A_log").reshape(-1)[:heads]  # A_log is per head, not per channel
        alpha = kr.kda_decay(z.reshape(T, heads, D), a_log, w.vec(a + "dt_bias"), c.gate_lower_bound)
        o = np.empty((T, heads, D), np.float32)
        for start, stop, state in segments:  # the conv and the recurrence run along each sequence
            rows = slice(start, stop)
            q, k, v, history = conv_qkv(kr, conv_in[:, rows], state.history, conv_w, heads, D)
            S, at = state.S, 0
            cuts = sorted(p for p in set(state.keep) if 0 < p < stop - start)
            for cut in [*cuts, stop - start]:  # the recurrence is token by token: cut between tokens, same bits
                part = slice(start + at, start + cut)
                o[part], S = kr.kda_recurrence(q[at:cut], k[at:cut], v[at:cut], alpha[part], beta[part], S,
                                               D ** -0.5)
                if cut < stop - start:
                    state.taken[cut] = {"S": S, "history": history_after(state.history, conv_in[:, start:start + cut])}
                at = cut
            state.keep = []
            if state.journal is not None:
                state.journal.chunks.append((conv_in[:, rows], q, k, v, alpha[rows], beta[rows]))
            state.S, state.history = S, history
        y = kr.rmsnorm(o.reshape(T * heads, D), w.vec(a + "o_norm.weight"), c.rms_norm_eps)  # norm first
        y = kr.mul_sigmoid(y.reshape(T, heads * D), kr.linear(w[a + "g_proj.weight"], x))  # then the gate
        return kr.linear(w[a + "o_proj.weight"], y)

    def keep_at(self, state, positions):
        state.keep, state.taken = list(positions), {}

    def kept(self, state):
        taken, state.taken = state.taken, {}
        return taken

    def mark(self, state):
        state.journal = Journal(state.S, state.history)  # a pass replaces both arrays, never writes into them

    def rollback(self, state, kept, c, kr):
        journal, state.journal = state.journal, None
        if journal is None or kept == journal.positions:
            return
        conv_in, q, k, v, alpha, beta = journal.first(kept)
        state.history = history_after(journal.history, conv_in)
        state.S = journal.S
        if kept:
            _, state.S = kr.kda_recurrence(q, k, v, alpha, beta, journal.S, c.kda_head_dim ** -0.5)

    def rollback_bytes(self, c, layer, positions):
        P, heads = c.kda_proj_dim, c.kda_num_heads
        return self.state_bytes(c, layer, 0) + 4 * positions * (7 * P + heads)  # S, history; 3P in, q k v α, β


def history_after(history, conv_in):
    """The conv history once the conv inputs `conv_in` [3, n, P] follow `history` [3, K-1, P]: the last K-1 of
    them all, oldest first."""
    window = np.concatenate([history, conv_in], axis=1)  # [3, K-1 + n, P]
    return np.ascontiguousarray(window[:, conv_in.shape[1]:])


def conv_qkv(kr, conv_in, history, conv_w, heads, D):
    """(q, k, v [T, heads, D], the next conv history) of one sequence: Linear → causal conv → SiLU, then q
    and k L2-normed per head (a sum, not a mean)."""
    out, after = zip(*(kr.short_conv(conv_in[i], history[i], conv_w[i]) for i in range(3)))
    q, k = kr.l2norm_heads(out[0], heads, L2_EPS), kr.l2norm_heads(out[1], heads, L2_EPS)
    T = conv_in.shape[1]
    return q.reshape(T, heads, D), k.reshape(T, heads, D), out[2].reshape(T, heads, D), np.stack(after)


@hookimpl(trylast=True)
def k3_attention_backends():
    return [KDA()]
