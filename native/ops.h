// The kernels that are not matrix products: one implementation, used by every backend (their cost is
// small next to the weight traffic), but for KDA's recurrence and MLA's attention, whose work grows with the
// state and the context: their inner walks are the backend's kernels. Definitions and orders as in kernels.h
// and docs/NUMERICS.md.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels.h"

namespace k3::ops {

void rmsnorm(const float* x, size_t rows, size_t n, const float* w, double eps, float* y);  // w may be null
void l2norm_heads(const float* x, size_t rows, size_t heads, size_t d, double eps, float* y);
void situ_glu(const float* g, const float* u, size_t n, double beta, double linear_beta, float* y);
void sigmoid(const float* x, size_t n, float* y);
void mul_sigmoid(const float* y, const float* g, size_t n, float* out);
// x [T, C]; history [K-1, C] oldest first, replaced by the new history; w [C, K].
void short_conv(const float* x, size_t tokens, size_t channels, float* history, const float* w, size_t k,
                float* y);
void kda_decay(const float* z, size_t tokens, size_t heads, size_t d, const float* a_log, const float* dt_bias,
               double lower_bound, float* alpha);
// Heads [h0, h1) of the recurrence over all T tokens; state [heads, D, D] is updated in place, a row at a time by
// the backend's KDA row kernels (kernels.h).
void kda_recurrence(const MatrixKernels& mk, const float* q, const float* k, const float* v, const float* alpha,
                    const float* beta, size_t tokens, size_t heads, size_t d, float* state, double scale, float* o,
                    size_t h0, size_t h1);
// Heads [h0, h1) of one query position over n cached keys/values shared by all heads, their products by the
// backend's dots_f64 and column_dots (kernels.h).
void mqa_attention(const MatrixKernels& mk, const float* q, size_t dk, const float* keys, size_t n,
                   const float* values, size_t dv, double scale, float* out, size_t h0, size_t h1);
void router(const float* logits, size_t tokens, size_t experts, const float* bias, size_t top_k, bool renormalize,
            double scaling, int64_t* ids, float* weights);
void combine(const float* const* outs, const float* weights, size_t count, size_t n, float* y);
void attnres(const float* const* sources, size_t count, size_t tokens, size_t hidden, const double* fold,
             double eps, float* out);

}  // namespace k3::ops
