// The scalar backend: the readable definition of the matrix products in kernels.h. Every SIMD
// backend must reproduce these bits. Each row of W is widened to double once, then dotted with
// every token in lane order.
#include <vector>

#include "kernels.h"

namespace k3 {
namespace {

void widen_row(WeightType type, const void* w, size_t in, size_t row, double* out) {
    if (type == WeightType::F32) {
        const float* r = static_cast<const float*>(w) + row * in;
        for (size_t i = 0; i < in; ++i) out[i] = r[i];
        return;
    }
    const uint16_t* r = static_cast<const uint16_t*>(w) + row * in;
    for (size_t i = 0; i < in; ++i) out[i] = type == WeightType::BF16 ? bf16_to_f64(r[i]) : f16_to_f64(r[i]);
}

void decode_mxfp4_row(const uint8_t* packed, const uint8_t* scale, size_t in, size_t row, double* out) {
    const uint8_t* p = packed + row * (in / 2);
    const uint8_t* s = scale + row * (in / kGroup);
    for (size_t i = 0; i < in; ++i) {
        const uint8_t byte = p[i / 2];
        const uint8_t code = (i % 2 == 0) ? (byte & 0x0F) : (byte >> 4);  // element 2k: LOW nibble
        out[i] = e2m1(code) * e8m0(s[i / kGroup]);
    }
}

void decode_int4_row(const uint8_t* packed, const float* scale, size_t in, size_t row, double* out) {
    const size_t groups = int4_groups_of(in);
    const uint8_t* p = packed + row * groups * (kGroup / 2);
    const float* s = scale + row * groups;
    for (size_t i = 0; i < in; ++i) {  // columns past `in` (the last group's padding) are never read
        const uint8_t byte = p[i / 2];
        const uint8_t nibble = (i % 2 == 0) ? (byte & 0x0F) : (byte >> 4);  // column 2k: LOW nibble
        out[i] = int4_code(nibble) * static_cast<double>(s[i / kGroup]);
    }
}

// y[t, o] = finish(lane_dot(row, x[t])) for every token.
template <class Out, class Finish>
void dot_tokens(const double* row, size_t in, const float* x, size_t tokens, Out* y, size_t out, size_t o,
                Finish finish) {
    for (size_t t = 0; t < tokens; ++t) {
        const float* xt = x + t * in;
        double acc[kLanes] = {0.0};
        for (size_t i = 0; i < in; ++i) acc[i % kLanes] += row[i] * static_cast<double>(xt[i]);
        y[t * out + o] = finish(lane_combine(acc));
    }
}

// to_f32(scale * v); scale 1.0 is the plain product (1.0 * v is v).
void dot_tokens(const double* row, size_t in, const float* x, size_t tokens, float* y, size_t out, size_t o,
                double scale = 1.0) {
    dot_tokens(row, in, x, tokens, y, out, o, [scale](double v) { return to_f32(scale * v); });
}

void linear(WeightType type, const void* w, size_t in, const float* x, size_t tokens, float* y, size_t out,
            size_t r0, size_t r1) {
    std::vector<double> row(in);
    for (size_t o = r0; o < r1; ++o) {
        widen_row(type, w, in, o, row.data());
        dot_tokens(row.data(), in, x, tokens, y, out, o);
    }
}

void mxfp4(const uint8_t* packed, const uint8_t* scale, size_t in, const float* x, size_t tokens, float* y,
           size_t out, size_t r0, size_t r1) {
    std::vector<double> row(in);
    for (size_t o = r0; o < r1; ++o) {
        decode_mxfp4_row(packed, scale, in, o, row.data());
        dot_tokens(row.data(), in, x, tokens, y, out, o);
    }
}

void int8_rows(const int8_t* codes, const float* scale, size_t in, const float* x, size_t tokens, float* y,
               size_t out, size_t r0, size_t r1) {
    std::vector<double> row(in);
    for (size_t o = r0; o < r1; ++o) {
        for (size_t i = 0; i < in; ++i) row[i] = codes[o * in + i];
        dot_tokens(row.data(), in, x, tokens, y, out, o, static_cast<double>(scale[o]));
    }
}

void int4_groups(const uint8_t* packed, const float* scale, size_t in, const float* x, size_t tokens, float* y,
                 size_t out, size_t r0, size_t r1) {
    std::vector<double> row(in);
    for (size_t o = r0; o < r1; ++o) {
        decode_int4_row(packed, scale, in, o, row.data());
        dot_tokens(row.data(), in, x, tokens, y, out, o);
    }
}

// The scalar products round a*b and then the sum (no FMA, -ffp-contract=off), so their bound is this loop's.
uint64_t fma_probe(size_t rounds) {
    double acc[kProbeChains];
    for (int k = 0; k < kProbeChains; ++k) acc[k] = k;
    const double m = 1.0000001, c = 1e-9;
    for (size_t i = 0; i < rounds; ++i)
        for (int k = 0; k < kProbeChains; ++k) acc[k] = acc[k] * m + c;
    volatile double sink = lane_dot_f64(acc, acc, kProbeChains);
    (void)sink;
    return rounds * kProbeChains;
}

void dots_f64(const float* w, size_t in, const float* x, size_t tokens, double* y, size_t out, size_t r0,
              size_t r1) {
    std::vector<double> row(in);
    for (size_t o = r0; o < r1; ++o) {
        widen_row(WeightType::F32, w, in, o, row.data());
        dot_tokens(row.data(), in, x, tokens, y, out, o, [](double v) { return v; });
    }
}

void column_dots(const float* rows, size_t n, size_t d, const double* x, size_t tokens, double* y) {
    column_dots_from(rows, n, d, x, tokens, y, 0);
}

void kda_decay_row(const float* s, size_t d, double a, double k, double* lane) {
    kda_decay_columns(s, 0, d, a, k, lane);
}

void kda_update_row(float* s, size_t d, double a, double k, const double* delta, double q, double* lane) {
    kda_update_columns(s, 0, d, a, k, delta, q, lane);
}

}  // namespace

const MatrixKernels kScalar = {"scalar",      linear,         mxfp4,    int8_rows,  int4_groups, fma_probe,
                               kda_decay_row, kda_update_row, dots_f64, column_dots};

}  // namespace k3
