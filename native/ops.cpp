// The non-matrix kernels of ops.h, written once. Every reduction uses the 16-lane order of kernels.h;
// every other sum is sequential in the order its comment names.
#include "ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels.h"

namespace k3::ops {
namespace {

double sigmoid64(double x) { return 1.0 / (1.0 + std::exp(-x)); }

double lane_dot_ff(const float* a, const float* b, size_t n) {  // two float32 vectors
    double acc[kLanes] = {0.0};
    for (size_t i = 0; i < n; ++i) acc[i % kLanes] += static_cast<double>(a[i]) * static_cast<double>(b[i]);
    return lane_combine(acc);
}

double lane_dot_fd(const float* a, const double* b, size_t n) {
    double acc[kLanes] = {0.0};
    for (size_t i = 0; i < n; ++i) acc[i % kLanes] += static_cast<double>(a[i]) * b[i];
    return lane_combine(acc);
}

}  // namespace

void rmsnorm(const float* x, size_t rows, size_t n, const float* w, double eps, float* y) {
    for (size_t r = 0; r < rows; ++r) {
        const float* xr = x + r * n;
        const double denom = std::sqrt(lane_dot_ff(xr, xr, n) / static_cast<double>(n) + eps);
        for (size_t i = 0; i < n; ++i) {
            double v = static_cast<double>(xr[i]) / denom;
            if (w) v = v * static_cast<double>(w[i]);
            y[r * n + i] = to_f32(v);
        }
    }
}

void l2norm_heads(const float* x, size_t rows, size_t heads, size_t d, double eps, float* y) {
    for (size_t r = 0; r < rows * heads; ++r) {  // sum, not mean
        const float* xr = x + r * d;
        const double denom = std::sqrt(lane_dot_ff(xr, xr, d) + eps);
        for (size_t i = 0; i < d; ++i) y[r * d + i] = to_f32(static_cast<double>(xr[i]) / denom);
    }
}

void situ_glu(const float* g, const float* u, size_t n, double beta, double linear_beta, float* y) {
    for (size_t i = 0; i < n; ++i) {
        const double gi = g[i], ui = u[i];
        const double capped = beta * std::tanh(gi / beta);  // the sigmoid takes the UNCAPPED g
        y[i] = to_f32(capped * sigmoid64(gi) * (linear_beta * std::tanh(ui / linear_beta)));
    }
}

void sigmoid(const float* x, size_t n, float* y) {
    for (size_t i = 0; i < n; ++i) y[i] = to_f32(sigmoid64(x[i]));
}

void mul_sigmoid(const float* y, const float* g, size_t n, float* out) {
    for (size_t i = 0; i < n; ++i) out[i] = to_f32(static_cast<double>(y[i]) * sigmoid64(g[i]));
}

void short_conv(const float* x, size_t tokens, size_t channels, float* history, const float* w, size_t k,
                float* y) {
    const size_t keep = k - 1;
    std::vector<float> window((keep + tokens) * channels);  // oldest first
    std::copy(history, history + keep * channels, window.begin());
    std::copy(x, x + tokens * channels, window.begin() + keep * channels);
    for (size_t t = 0; t < tokens; ++t)
        for (size_t c = 0; c < channels; ++c) {
            double acc = 0.0;  // taps in order; tap K-1 multiplies the current input
            for (size_t tap = 0; tap < k; ++tap)
                acc += static_cast<double>(w[c * k + tap]) * static_cast<double>(window[(t + tap) * channels + c]);
            y[t * channels + c] = to_f32(acc * sigmoid64(acc));  // SiLU after the conv
        }
    std::copy(window.end() - keep * channels, window.end(), history);
}

void kda_decay(const float* z, size_t tokens, size_t heads, size_t d, const float* a_log, const float* dt_bias,
               double lower_bound, float* alpha) {
    for (size_t t = 0; t < tokens; ++t)
        for (size_t h = 0; h < heads; ++h) {
            const double rate = std::exp(static_cast<double>(a_log[h]));  // A_log is per head
            for (size_t j = 0; j < d; ++j) {
                const size_t c = h * d + j;
                const double zz = static_cast<double>(z[t * heads * d + c]) + static_cast<double>(dt_bias[c]);
                alpha[t * heads * d + c] = to_f32(std::exp(lower_bound * sigmoid64(rate * zz)));
            }
        }
}

void kda_recurrence(const MatrixKernels& mk, const float* q, const float* k, const float* v, const float* alpha,
                    const float* beta, size_t tokens, size_t heads, size_t d, float* state, double scale, float* o,
                    size_t h0, size_t h1) {
    std::vector<double> lanes(kLanes * d), folded(d), delta(d);
    // Two walks over the float32 state a token, its rows in order: the first adds row i decayed, S64[i,:] =
    // S[i,:]·α[i], times k[i] into lane i % 16 of u = S64ᵀ k; the second decays row i again (the same bits),
    // updates it in place and adds it times q[i]·scale into lane i % 16 of o = Sᵀ q. Rows never meet, so
    // each lane adds its products in lane_dot's order; the fold is lane_combine's (fold_lane_columns).
    for (size_t h = h0; h < h1; ++h) {
        float* Sh = state + h * d * d;  // [i, j]: i over keys, j over values
        for (size_t t = 0; t < tokens; ++t) {
            const size_t base = (t * heads + h) * d;
            std::fill(lanes.begin(), lanes.end(), 0.0);
            for (size_t i = 0; i < d; ++i)
                mk.kda_decay_row(Sh + i * d, d, alpha[base + i], k[base + i], lanes.data() + i % kLanes * d);
            fold_lane_columns(lanes.data(), d, folded.data());  // u = S64ᵀ k
            const double b = beta[t * heads + h];
            for (size_t j = 0; j < d; ++j) delta[j] = b * (static_cast<double>(v[base + j]) - folded[j]);
            std::fill(lanes.begin(), lanes.end(), 0.0);
            for (size_t i = 0; i < d; ++i)
                mk.kda_update_row(Sh + i * d, d, alpha[base + i], k[base + i], delta.data(),
                                  static_cast<double>(q[base + i]) * scale, lanes.data() + i % kLanes * d);
            fold_lane_columns(lanes.data(), d, folded.data());  // o = Sᵀ q on the UPDATED, float32 state
            for (size_t j = 0; j < d; ++j) o[base + j] = to_f32(folded[j]);
        }
    }
}

// Heads a block of mqa_attention scores together: their weights, block x n doubles, in at most kScoreBytes (64
// heads at n = 16,384), never fewer than 4 heads (a column tile's). Each head's bits are its own.
constexpr size_t kScoreBytes = size_t{8} << 20;

void mqa_attention(const MatrixKernels& mk, const float* q, size_t dk, const float* keys, size_t n,
                   const float* values, size_t dv, double scale, float* out, size_t h0, size_t h1) {
    const size_t block = std::max<size_t>(4, kScoreBytes / (n * sizeof(double)));
    std::vector<double> e(std::min(block, h1 - h0) * n), ones(n, 1.0), ctx(std::min(block, h1 - h0) * dv);
    for (size_t b0 = h0; b0 < h1; b0 += block) {
        const size_t heads = std::min(block, h1 - b0);
        mk.dots_f64(keys, dk, q + b0 * dk, heads, e.data(), n, 0, n);  // e[h, m] = lane_dot(q[h], keys[m])
        for (size_t h = 0; h < heads; ++h) {
            double* eh = e.data() + h * n;
            double top = -INFINITY;
            for (size_t m = 0; m < n; ++m) {
                eh[m] = eh[m] * scale;
                top = std::max(top, eh[m]);
            }
            for (size_t m = 0; m < n; ++m) eh[m] = std::exp(eh[m] - top);
            const double total = lane_dot_f64(eh, ones.data(), n);
            for (size_t m = 0; m < n; ++m) eh[m] = eh[m] / total;
        }
        mk.column_dots(values, n, dv, e.data(), heads, ctx.data());  // each j: lane_dot(p[h], values[:, j])
        for (size_t i = 0; i < heads * dv; ++i) out[b0 * dv + i] = to_f32(ctx[i]);
    }
}

void router(const float* logits, size_t tokens, size_t experts, const float* bias, size_t top_k, bool renormalize,
            double scaling, int64_t* ids, float* weights) {
    std::vector<double> s(experts), biased(experts);
    std::vector<int64_t> order(experts);
    for (size_t t = 0; t < tokens; ++t) {
        for (size_t e = 0; e < experts; ++e) {
            s[e] = sigmoid64(logits[t * experts + e]);
            biased[e] = s[e] + static_cast<double>(bias[e]);  // selection only
        }
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {  // ties: lowest id first
            if (std::isnan(biased[a]) || std::isnan(biased[b])) return !std::isnan(biased[a]) && std::isnan(biased[b]);
            return biased[a] > biased[b];
        });
        double total = 0.0;  // in rank order
        for (size_t j = 0; j < top_k; ++j) total = total + s[order[j]];
        for (size_t j = 0; j < top_k; ++j) {
            const double w = renormalize ? s[order[j]] / (total + 1e-20) : s[order[j]];  // UNBIASED scores
            ids[t * top_k + j] = order[j];
            weights[t * top_k + j] = to_f32(w * scaling);
        }
    }
}

void combine(const float* const* outs, const float* weights, size_t count, size_t n, float* y) {
    for (size_t i = 0; i < n; ++i) {
        double acc = 0.0;  // rank order
        for (size_t j = 0; j < count; ++j)
            acc = acc + static_cast<double>(weights[j]) * static_cast<double>(outs[j][i]);
        y[i] = to_f32(acc);
    }
}

void attnres(const float* const* sources, size_t count, size_t tokens, size_t hidden, const double* fold,
             double eps, float* out) {
    std::vector<double> score(count), e(count);
    for (size_t t = 0; t < tokens; ++t) {
        double top = -INFINITY;
        for (size_t s = 0; s < count; ++s) {
            const float* x = sources[s] + t * hidden;
            const double rms = std::sqrt(lane_dot_ff(x, x, hidden) / static_cast<double>(hidden) + eps);
            score[s] = lane_dot_fd(x, fold, hidden) / rms;
            top = std::max(top, score[s]);
        }
        double total = 0.0;  // source order
        for (size_t s = 0; s < count; ++s) {
            e[s] = std::exp(score[s] - top);
            total = total + e[s];
        }
        for (size_t i = 0; i < hidden; ++i) {
            double acc = 0.0;  // values are the RAW sources
            for (size_t s = 0; s < count; ++s) acc = acc + (e[s] / total) * static_cast<double>(sources[s][t * hidden + i]);
            out[t * hidden + i] = to_f32(acc);
        }
    }
}

}  // namespace k3::ops
