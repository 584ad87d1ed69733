// The k3 kernel contract. Every backend (scalar, AVX2, AVX-512, NEON) computes exactly this, bit for bit.
//
// Numbers: activations are float32 at every boundary; inside a kernel all arithmetic is double.
// Weight values widen exactly: BF16 by a 16-bit shift, F16 and F32 by conversion, MXFP4 as
// E2M1[nibble] * 2^(scale - 127) (scale byte 255: the group's weights are +0.0). Products of such
// weights with float32 inputs are exact in double, so only additions round, and their order is fixed:
//
//   lane_dot(a, b, n): 16 double accumulators acc[0..15] = +0.0; for i = 0, 1, ..., n-1 in order,
//   acc[i % 16] += a[i] * b[i]; then for w = 8, 4, 2, 1: acc[j] += acc[j + w] for j < w; result acc[0].
//
// Because each product is exact, fma(a, b, acc) rounds exactly like acc + a*b, so SIMD backends may
// use FMA instructions. Output rows are independent: threads split rows [r0, r1), never a reduction,
// so the thread count cannot change a bit. Batched calls (T tokens) give every token the bits it gets
// alone. A NaN result is stored as the canonical quiet NaN 0x7FC00000 (payloads are not portable).
//
// Layouts (row-major, C-contiguous): W [O, I]; x [T, I]; y [T, O]. MXFP4: packed [O, I/2] (element 2k
// in the LOW nibble of byte k, 2k+1 in the high one), scale [O, I/32]; I is a multiple of 32.
//
// The draft trunk's products (k3core/io/draft_trunk.py, docs/DRAFT-TRUNK.md), with float32 scales s:
//   int8_rows    codes c [O, I] int8, s [O]: y[t,o] = to_f32(double(s[o]) * lane_dot(c[o,:], x[t,:])).
//                c * x is exact in double (|c| <= 128: at most 7 significant bits, times x's 24; magnitudes
//                2^-149 .. 2^135), so the lane additions round, then the product by the row's scale rounds to
//                double, then to_f32 rounds to float32: two roundings after the sum, the same on every backend.
//                (Widening c * s first would not be exact: its 31 bits times x's 24 exceed double's 53.)
//   int4_groups  packed [O, G*16] with G = ceil(I/32) groups of 32 columns, s [O, G]: column i of row o is
//                nibble i % 2 (0: the LOW one) of byte i / 2 of the row, code = nibble - 8 (offset binary:
//                k3 writes 1..15 for -7..7; 0 reads as -8), w = double(code) * double(s[o, i/32]): at most
//                3 + 24 = 27 significant bits, exact, and w * x at most 27 + 24 = 51, exact too, so
//                y[t,o] = to_f32(lane_dot(w[o,:], x[t,:])) rounds only in the additions, as MXFP4 does.
//                Columns I..32G-1 of the last group are padding: never read as data, whatever their bytes and
//                scale hold (a backend that runs a whole group gives them the weight +0.0 and x +0.0).
// Scales are used as stored: 0, subnormal, huge, inf or NaN follow IEEE (s = 0 with an infinite x gives NaN).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace k3 {

constexpr int kLanes = 16;
constexpr int kGroup = 32;

enum class WeightType { BF16, F16, F32 };

// The matrix products, one implementation per backend. Rows [r0, r1) of y for all T tokens.
struct MatrixKernels {
    const char* name;
    void (*linear)(WeightType type, const void* w, size_t in, const float* x, size_t tokens,
                   float* y, size_t out, size_t r0, size_t r1);
    void (*mxfp4)(const uint8_t* packed, const uint8_t* scale, size_t in, const float* x, size_t tokens,
                  float* y, size_t out, size_t r0, size_t r1);
    void (*int8_rows)(const int8_t* codes, const float* scale, size_t in, const float* x, size_t tokens,
                      float* y, size_t out, size_t r0, size_t r1);
    void (*int4_groups)(const uint8_t* packed, const float* scale, size_t in, const float* x, size_t tokens,
                        float* y, size_t out, size_t r0, size_t r1);
    // The FMA bound the products above can reach: `rounds` rounds of 12 independent chains of this backend's
    // widest double multiply-add (enough chains to cover its latency on every core k3 has met). Returns the
    // number of double multiply-adds done; timing it gives this core's ceiling (`k3 bench kernels`, %FMA).
    uint64_t (*fma_probe)(size_t rounds);
    // KDA's recurrence, one row i of a head's state s [D] at a time (ops.cpp walks the rows; docs/NUMERICS.md).
    // Elementwise in the columns j < d, so a backend may take any number of columns at once; each expression
    // rounds as written, a product then a sum (s·a·k and k·delta are not exact in double, so never an FMA):
    //   kda_decay_row   lane[j] += (double(s[j]) * a) * k                  (the row decayed, times k: u's lane)
    //   kda_update_row  s[j] = to_f32(double(s[j]) * a + k * delta[j]);  then  lane[j] += double(s[j]) * q  (o's)
    void (*kda_decay_row)(const float* s, size_t d, double a, double k, double* lane);
    void (*kda_update_row)(float* s, size_t d, double a, double k, const double* delta, double q, double* lane);
    // MLA's attention (ops.cpp's mqa_attention), products over a float32 matrix whose sums stay in double:
    //   dots_f64     y[t, o] = lane_dot(W[o, :], x[t, :]), W [O, I] and x [T, I] float32 (keys, queries): linear's F32
    //                product, rows [r0, r1), without its rounding to float32
    //   column_dots  y[t, j] = lane_dot over i < n of (rows[i, j], x[t, i]), rows [n, d] float32 (values), x [T, n]
    //                double (softmax weights): row i goes to lane i % 16 of every column; x is not a float32, so each
    //                product rounds before its sum: never an FMA
    void (*dots_f64)(const float* w, size_t in, const float* x, size_t tokens, double* y, size_t out, size_t r0,
                     size_t r1);
    void (*column_dots)(const float* rows, size_t n, size_t d, const double* x, size_t tokens, double* y);
};

constexpr int kProbeChains = 12;

extern const MatrixKernels kScalar;
extern const MatrixKernels kAvx2;    // native/avx2.cpp: AVX2 + FMA
extern const MatrixKernels kAvx512;  // native/avx512.cpp: AVX-512 F/BW/VL
extern const MatrixKernels kNeon;    // native/neon.cpp: aarch64 Advanced SIMD

// Shared helpers every backend's scalar tail and the scalar backend use.
double lane_dot_f64(const double* a, const double* b, size_t n);
double lane_combine(double acc[kLanes]);
float to_f32(double v);  // round to float32; NaN becomes the canonical quiet NaN
double bf16_to_f64(uint16_t bits);
double f16_to_f64(uint16_t bits);
double e2m1(uint8_t code);          // E2M1 value of a 4-bit code
double e8m0(uint8_t scale);         // 2^(scale - 127); 255 gives 0.0
double int4_code(uint8_t nibble);   // a draft int4 code: nibble (0..15) - 8
// The KDA row kernels above on columns [j0, d): the scalar backend's whole rows, a SIMD backend's last columns.
void kda_decay_columns(const float* s, size_t j0, size_t d, double a, double k, double* lane);
void kda_update_columns(float* s, size_t j0, size_t d, double a, double k, const double* delta, double q,
                        double* lane);
// lanes [16, w], lane l of column j at lanes[l * w + j]: out[j] = column j's lanes folded as lane_combine folds them.
void fold_lane_columns(double* lanes, size_t w, double* out);
// column_dots on columns [j0, d): the scalar backend's whole rows, a SIMD backend's last columns.
void column_dots_from(const float* rows, size_t n, size_t d, const double* x, size_t tokens, double* y, size_t j0);
inline size_t int4_groups_of(size_t in) { return (in + kGroup - 1) / kGroup; }  // G; a row is G * 16 bytes

// n doubles inside v starting at a 64-byte boundary (v grows as needed): a SIMD backend's x and scratch rows, so
// that no vector load of them straddles two cache lines (malloc promises 16 bytes; a straddling load costs two).
double* line_aligned(std::vector<double>& v, size_t n);

}  // namespace k3
