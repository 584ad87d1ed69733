// The aarch64 Advanced SIMD (NEON) backend: the matrix products of kernels.h, bit for bit equal to
// kScalar.
//
// Lane layout: the 16 accumulator lanes live in 8 float64x2_t registers; register k holds lanes 2k and
// 2k+1, so element i of a row always lands in lane i mod 16 exactly as in the scalar loop. Products of
// the widened weights with float32 inputs are exact in double, so vfmaq_f64 rounds exactly like the
// scalar multiply-then-add.
//
// Work shape: a row is widened to double one chunk (kChunk elements, a multiple of 32) at a time and
// each chunk is used by every token before the next one is decoded. A token's 16 lanes are parked in
// memory between chunks; the chunk boundaries are multiples of 16, so every lane still receives its
// products in increasing i. The last chunk's tail (in mod 16 elements) is added lane by lane in scalar
// code, then lane_combine folds 8, 4, 2, 1 and to_f32 rounds (canonical NaN) as in every backend; the
// draft's int8 product multiplies the folded sum by its row's scale first (kernels.h). The draft's int4
// codes are widened and multiplied by their group's scale in the chunk, as MXFP4's are.
//
// Flush-to-zero must be off (FPCR.FZ = 0, the Linux default): subnormal inputs, weights and results
// are kept, as they are in the scalar backend.
#include <arm_neon.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels.h"
#include "tiles.h"

namespace k3 {
namespace {

constexpr size_t kChunk = 512;  // doubles decoded at a time (4 KiB): a multiple of 16 and of kGroup
static_assert(kChunk % kLanes == 0 && kChunk % kGroup == 0, "chunks must keep lanes and groups aligned");

// ---- widening one chunk of weights to double --------------------------------------------------------

void widen_f32(const float* w, size_t n, double* out) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t v = vld1q_f32(w + i);
        vst1q_f64(out + i, vcvt_f64_f32(vget_low_f32(v)));
        vst1q_f64(out + i + 2, vcvt_high_f64_f32(v));
    }
    for (; i < n; ++i) out[i] = w[i];
}

void widen_bf16(const uint16_t* w, size_t n, double* out) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const uint16x8_t v = vld1q_u16(w + i);
        // bf16 -> f32 is a 16-bit shift (exact, subnormals and NaNs included); f32 -> f64 is exact.
        const float32x4_t lo = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v), 16));
        const float32x4_t hi = vreinterpretq_f32_u32(vshll_high_n_u16(v, 16));
        vst1q_f64(out + i, vcvt_f64_f32(vget_low_f32(lo)));
        vst1q_f64(out + i + 2, vcvt_high_f64_f32(lo));
        vst1q_f64(out + i + 4, vcvt_f64_f32(vget_low_f32(hi)));
        vst1q_f64(out + i + 6, vcvt_high_f64_f32(hi));
    }
    for (; i < n; ++i) out[i] = bf16_to_f64(w[i]);
}

void widen_f16(const uint16_t* w, size_t n, double* out) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        // f16 -> f32 -> f64, both exact (f16 subnormals become f32 normals; needs FPCR.FZ16 = 0).
        const float16x8_t v = vreinterpretq_f16_u16(vld1q_u16(w + i));
        const float32x4_t lo = vcvt_f32_f16(vget_low_f16(v));
        const float32x4_t hi = vcvt_high_f32_f16(v);
        vst1q_f64(out + i, vcvt_f64_f32(vget_low_f32(lo)));
        vst1q_f64(out + i + 2, vcvt_high_f64_f32(lo));
        vst1q_f64(out + i + 4, vcvt_f64_f32(vget_low_f32(hi)));
        vst1q_f64(out + i + 6, vcvt_high_f64_f32(hi));
    }
    for (; i < n; ++i) out[i] = f16_to_f64(w[i]);
}

void widen(WeightType type, const void* row, size_t c0, size_t n, double* out) {
    if (type == WeightType::F32) widen_f32(static_cast<const float*>(row) + c0, n, out);
    else if (type == WeightType::BF16) widen_bf16(static_cast<const uint16_t*>(row) + c0, n, out);
    else widen_f16(static_cast<const uint16_t*>(row) + c0, n, out);
}

// ---- MXFP4 decode -----------------------------------------------------------------------------------

// Every E2M1 value is a double whose low 48 bits are zero, so a code maps to its top two bytes with two
// 16-entry byte-table lookups. The tables are built from e2m1() itself, so they cannot drift from it.
struct E2m1Tables {
    uint8x16_t top;     // bits 56..63 of the double
    uint8x16_t second;  // bits 48..55
};

E2m1Tables make_e2m1_tables() {
    uint8_t top[16], second[16];
    for (int c = 0; c < 16; ++c) {
        const double v = e2m1(static_cast<uint8_t>(c));
        uint64_t bits;
        std::memcpy(&bits, &v, sizeof bits);
        top[c] = static_cast<uint8_t>(bits >> 56);
        second[c] = static_cast<uint8_t>(bits >> 48);
    }
    return {vld1q_u8(top), vld1q_u8(second)};
}

// 16 codes (one per byte) -> 16 doubles times the group's scale, exactly e2m1(code) * e8m0(scale).
inline void decode16(uint8x16_t codes, const E2m1Tables& t, float64x2_t scale, double* out) {
    const uint8x16_t top = vqtbl1q_u8(t.top, codes), second = vqtbl1q_u8(t.second, codes);
    // Little-endian 16-bit halves: low byte `second`, high byte `top`; elements 0..7 then 8..15.
    const uint16x8_t h[2] = {vreinterpretq_u16_u8(vzip1q_u8(second, top)),
                             vreinterpretq_u16_u8(vzip2q_u8(second, top))};
    for (int half = 0; half < 2; ++half) {
        const uint32x4_t lo = vshll_n_u16(vget_low_u16(h[half]), 16);
        const uint32x4_t hi = vshll_high_n_u16(h[half], 16);
        const uint64x2_t q[4] = {vshll_n_u32(vget_low_u32(lo), 32), vshll_high_n_u32(lo, 32),
                                 vshll_n_u32(vget_low_u32(hi), 32), vshll_high_n_u32(hi, 32)};
        for (int k = 0; k < 4; ++k)
            vst1q_f64(out + 8 * half + 2 * k, vmulq_f64(vreinterpretq_f64_u64(q[k]), scale));
    }
}

// Elements [c0, c0 + n) of one row (c0 and n multiples of kGroup).
void decode_mxfp4(const uint8_t* prow, const uint8_t* srow, size_t c0, size_t n, const E2m1Tables& t,
                  double* out) {
    const uint8x16_t low_mask = vdupq_n_u8(0x0F);
    for (size_t g = 0; g < n; g += kGroup) {
        const size_t i = c0 + g;
        const uint8x16_t bytes = vld1q_u8(prow + i / 2);
        const uint8x16_t lo = vandq_u8(bytes, low_mask), hi = vshrq_n_u8(bytes, 4);
        const float64x2_t scale = vdupq_n_f64(e8m0(srow[i / kGroup]));
        // Element 2k is the LOW nibble of byte k: interleave low, high, low, high, ...
        decode16(vzip1q_u8(lo, hi), t, scale, out + g);
        decode16(vzip2q_u8(lo, hi), t, scale, out + g + 16);
    }
}

// ---- the draft's int8 and int4 decode -----------------------------------------------------------------

// 8 signed codes -> 8 doubles (exact), in order: v[k] holds codes 2k and 2k+1.
inline void codes8(int8x8_t c, float64x2_t (&v)[4]) {
    const int16x8_t h = vmovl_s8(c);
    const int32x4_t q[2] = {vmovl_s16(vget_low_s16(h)), vmovl_high_s16(h)};
    for (int k = 0; k < 2; ++k) {
        v[2 * k] = vcvtq_f64_s64(vmovl_s32(vget_low_s32(q[k])));
        v[2 * k + 1] = vcvtq_f64_s64(vmovl_high_s32(q[k]));
    }
}

void widen_i8(const int8_t* w, size_t n, double* out) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float64x2_t v[4];
        codes8(vld1_s8(w + i), v);
        for (int k = 0; k < 4; ++k) vst1q_f64(out + i + 2 * k, v[k]);
    }
    for (; i < n; ++i) out[i] = w[i];
}

// 8 int4 codes times their group's scale (exact), at out.
inline void scaled8(int8x8_t c, float64x2_t scale, double* out) {
    float64x2_t v[4];
    codes8(c, v);
    for (int k = 0; k < 4; ++k) vst1q_f64(out + 2 * k, vmulq_f64(v[k], scale));
}

// Elements [c0, c0 + n) of one int4 row (c0 a multiple of kGroup; the chunk ends at `in` at the latest, so the
// padded last group's columns past `in` are never decoded): whole groups by NEON, a partial one in scalar.
void decode_int4(const uint8_t* prow, const float* srow, size_t c0, size_t n, double* out) {
    const uint8x16_t low_mask = vdupq_n_u8(0x0F);
    const int8x16_t bias = vdupq_n_s8(8);
    size_t g = 0;
    for (; g + kGroup <= n; g += kGroup) {
        const size_t i = c0 + g;
        const uint8x16_t bytes = vld1q_u8(prow + i / 2);
        const uint8x16_t lo = vandq_u8(bytes, low_mask), hi = vshrq_n_u8(bytes, 4);
        const float64x2_t scale = vdupq_n_f64(static_cast<double>(srow[i / kGroup]));
        // Column 2k is the LOW nibble of byte k: interleave low, high, ...; code = nibble - 8.
        const int8x16_t c[2] = {vsubq_s8(vreinterpretq_s8_u8(vzip1q_u8(lo, hi)), bias),
                                vsubq_s8(vreinterpretq_s8_u8(vzip2q_u8(lo, hi)), bias)};
        for (int k = 0; k < 2; ++k) {
            scaled8(vget_low_s8(c[k]), scale, out + g + 16 * k);
            scaled8(vget_high_s8(c[k]), scale, out + g + 16 * k + 8);
        }
    }
    for (; g < n; ++g) {
        const size_t i = c0 + g;
        const uint8_t byte = prow[i / 2];
        out[g] = int4_code(i % 2 == 0 ? (byte & 0x0F) : (byte >> 4)) * static_cast<double>(srow[i / kGroup]);
    }
}

// ---- the lane-ordered dot products --------------------------------------------------------------------

// The tail of the last chunk: elements [full, n) go to lanes 0 .. n-full-1 (full is a multiple of 16
// and so is the chunk start), one multiply and one add each, like the scalar loop.
inline void add_tail(const double* w, size_t full, size_t n, const float* x, double* lanes) {
    for (size_t i = full; i < n; ++i) lanes[i - full] += w[i] * static_cast<double>(x[i]);
}

// One chunk w[0, n) against NT tokens at once (the weights are loaded once for all NT); lanes[t] holds
// token t's 16 accumulators, x[t] its inputs at the chunk start.
template <int NT>
void accumulate(const double* w, size_t n, const float* const* x, double* const* lanes) {
    float64x2_t acc[NT][8];
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t)
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) acc[t][k] = vld1q_f64(lanes[t] + 2 * k);
    const size_t full = n - n % kLanes;
    for (size_t i = 0; i < full; i += kLanes) {
        // Four elements at a time: weights i+4q .. i+4q+3 are lanes 4q .. 4q+3 = registers 2q, 2q+1.
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) {
            const size_t e = i + 4 * static_cast<size_t>(q);
            const float64x2_t w01 = vld1q_f64(w + e), w23 = vld1q_f64(w + e + 2);
#pragma GCC unroll 4
            for (int t = 0; t < NT; ++t) {
                const float32x4_t v = vld1q_f32(x[t] + e);
                acc[t][2 * q] = vfmaq_f64(acc[t][2 * q], w01, vcvt_f64_f32(vget_low_f32(v)));
                acc[t][2 * q + 1] = vfmaq_f64(acc[t][2 * q + 1], w23, vcvt_high_f64_f32(v));
            }
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) vst1q_f64(lanes[t] + 2 * k, acc[t][k]);
        add_tail(w, full, n, x[t], lanes[t]);
    }
}

// One decoded chunk (elements [c0, c0 + n) of the row) against every token.
void chunk_all_tokens(const double* w, size_t c0, size_t n, const float* x, size_t in, size_t tokens,
                      double* lanes) {
    size_t t = 0;
    for (; t + 2 <= tokens; t += 2) {
        const float* xs[2] = {x + t * in + c0, x + (t + 1) * in + c0};
        double* ls[2] = {lanes + t * kLanes, lanes + (t + 1) * kLanes};
        accumulate<2>(w, n, xs, ls);
    }
    if (t < tokens) {
        const float* xs[1] = {x + t * in + c0};
        double* ls[1] = {lanes + t * kLanes};
        accumulate<1>(w, n, xs, ls);
    }
}

// Rows [r0, r1): for each row, decode chunk by chunk with `decode(row, c0, n, buffer)` and accumulate
// every token; then fold each token's lanes and `finish` them into y[t, row].
template <typename Out, typename Decode, typename Finish = Plain>
void rows_product(size_t in, const float* x, size_t tokens, Out* y, size_t out, size_t r0, size_t r1,
                  Decode decode, Finish finish = Finish()) {
    if (tokens == 0 || r0 >= r1) return;
    std::vector<double> wbuf(std::min(in, kChunk));
    std::vector<double> lanes(tokens * kLanes);
    for (size_t o = r0; o < r1; ++o) {
        std::fill(lanes.begin(), lanes.end(), 0.0);
        for (size_t c0 = 0; c0 < in; c0 += kChunk) {
            const size_t n = std::min(kChunk, in - c0);
            decode(o, c0, n, wbuf.data());
            chunk_all_tokens(wbuf.data(), c0, n, x, in, tokens, lanes.data());
        }
        for (size_t t = 0; t < tokens; ++t) y[t * out + o] = finish(o, lane_combine(lanes.data() + t * kLanes));
    }
}

void linear(WeightType type, const void* w, size_t in, const float* x, size_t tokens, float* y, size_t out,
            size_t r0, size_t r1) {
    const size_t elem = type == WeightType::F32 ? 4 : 2;
    const uint8_t* base = static_cast<const uint8_t*>(w);
    rows_product(in, x, tokens, y, out, r0, r1, [&](size_t o, size_t c0, size_t n, double* buf) {
        widen(type, base + o * in * elem, c0, n, buf);
    });
}

void dots_f64(const float* w, size_t in, const float* x, size_t tokens, double* y, size_t out, size_t r0,
              size_t r1) {
    const uint8_t* base = reinterpret_cast<const uint8_t*>(w);
    rows_product(in, x, tokens, y, out, r0, r1, [&](size_t o, size_t c0, size_t n, double* buf) {
        widen(WeightType::F32, base + o * in * 4, c0, n, buf);
    }, Unrounded{});
}

void mxfp4(const uint8_t* packed, const uint8_t* scale, size_t in, const float* x, size_t tokens, float* y,
           size_t out, size_t r0, size_t r1) {
    const E2m1Tables tables = make_e2m1_tables();
    rows_product(in, x, tokens, y, out, r0, r1, [&](size_t o, size_t c0, size_t n, double* buf) {
        decode_mxfp4(packed + o * (in / 2), scale + o * (in / kGroup), c0, n, tables, buf);
    });
}

void int8_rows(const int8_t* codes, const float* scale, size_t in, const float* x, size_t tokens, float* y,
               size_t out, size_t r0, size_t r1) {
    rows_product(in, x, tokens, y, out, r0, r1, [&](size_t o, size_t c0, size_t n, double* buf) {
        widen_i8(codes + o * in + c0, n, buf);
    }, RowScaled{scale});
}

void int4_groups(const uint8_t* packed, const float* scale, size_t in, const float* x, size_t tokens, float* y,
                 size_t out, size_t r0, size_t r1) {
    const size_t groups = int4_groups_of(in);
    rows_product(in, x, tokens, y, out, r0, r1, [&](size_t o, size_t c0, size_t n, double* buf) {
        decode_int4(packed + o * groups * (kGroup / 2), scale + o * groups, c0, n, buf);
    });
}

// ---- KDA's state rows: 4 columns a step, the last d % 4 in scalar code --------------------------------------

// to_f32 of 4 doubles: the conversion rounds as the scalar cast does and keeps a NaN a NaN, which becomes the
// canonical one.
float32x4_t to_f32_x4(float64x2_t lo, float64x2_t hi) {
    const float32x4_t f = vcvt_high_f32_f64(vcvt_f32_f64(lo), hi);
    return vbslq_f32(vceqq_f32(f, f), f, vreinterpretq_f32_u32(vdupq_n_u32(0x7FC00000u)));
}

void kda_decay_row(const float* s, size_t d, double a, double k, double* lane) {
    size_t j = 0;
    for (; j + 4 <= d; j += 4) {
        const float32x4_t f = vld1q_f32(s + j);
        const float64x2_t lo = vmulq_n_f64(vmulq_n_f64(vcvt_f64_f32(vget_low_f32(f)), a), k);
        const float64x2_t hi = vmulq_n_f64(vmulq_n_f64(vcvt_high_f64_f32(f), a), k);
        vst1q_f64(lane + j, vaddq_f64(vld1q_f64(lane + j), lo));
        vst1q_f64(lane + j + 2, vaddq_f64(vld1q_f64(lane + j + 2), hi));
    }
    kda_decay_columns(s, j, d, a, k, lane);
}

void kda_update_row(float* s, size_t d, double a, double k, const double* delta, double q, double* lane) {
    size_t j = 0;
    for (; j + 4 <= d; j += 4) {
        const float32x4_t f = vld1q_f32(s + j);
        const float64x2_t lo = vaddq_f64(vmulq_n_f64(vcvt_f64_f32(vget_low_f32(f)), a),
                                         vmulq_n_f64(vld1q_f64(delta + j), k));
        const float64x2_t hi = vaddq_f64(vmulq_n_f64(vcvt_high_f64_f32(f), a),
                                         vmulq_n_f64(vld1q_f64(delta + j + 2), k));
        const float32x4_t updated = to_f32_x4(lo, hi);
        vst1q_f32(s + j, updated);
        const float64x2_t olo = vmulq_n_f64(vcvt_f64_f32(vget_low_f32(updated)), q);
        const float64x2_t ohi = vmulq_n_f64(vcvt_high_f64_f32(updated), q);
        vst1q_f64(lane + j, vaddq_f64(vld1q_f64(lane + j), olo));
        vst1q_f64(lane + j + 2, vaddq_f64(vld1q_f64(lane + j + 2), ohi));
    }
    kda_update_columns(s, j, d, a, k, delta, q, lane);
}

// ---- attention's column dots ---------------------------------------------------------------------------------

// Columns j..j+2 JB - 1 for tokens t0..t0+HB-1, one lane at a time: lane l adds rows l, l + 16, l + 32, ... in order,
// as it would walking every row (a lane's sum does not depend on when the others add theirs), so a row's columns,
// widened once, serve HB tokens with HB x JB accumulators. The lanes are then folded as lane_combine folds them.
template <int HB, int JB>
void column_tile(const float* rows, size_t n, size_t d, const double* x, size_t t0, size_t j, double* y) {
    constexpr int kWidth = HB * JB * 2;
    double lanes[kLanes * kWidth];
    for (int l = 0; l < kLanes; ++l) {
        float64x2_t acc[HB][JB];
#pragma GCC unroll 16
        for (int k = 0; k < HB * JB; ++k) acc[k / JB][k % JB] = vdupq_n_f64(0.0);
        for (size_t i = static_cast<size_t>(l); i < n; i += kLanes) {
            const float* row = rows + i * d + j;
            float64x2_t v[JB];
#pragma GCC unroll 8
            for (int b = 0; b < JB; b += 2) {
                const float32x4_t f = vld1q_f32(row + 2 * b);
                v[b] = vcvt_f64_f32(vget_low_f32(f));
                v[b + 1] = vcvt_high_f64_f32(f);
            }
#pragma GCC unroll 4
            for (int h = 0; h < HB; ++h) {
                const double xi = x[(t0 + h) * n + i];  // a product, then the sum
#pragma GCC unroll 8
                for (int b = 0; b < JB; ++b) acc[h][b] = vaddq_f64(acc[h][b], vmulq_n_f64(v[b], xi));
            }
        }
#pragma GCC unroll 16
        for (int k = 0; k < HB * JB; ++k) vst1q_f64(lanes + l * kWidth + 2 * k, acc[k / JB][k % JB]);
    }
    double folded[kWidth];
    fold_lane_columns(lanes, kWidth, folded);
    for (int h = 0; h < HB; ++h)
        for (int c = 0; c < JB * 2; ++c) y[(t0 + h) * d + j + static_cast<size_t>(c)] = folded[h * JB * 2 + c];
}

struct ColumnTiles {
    static constexpr int kTokens = 2;
    static constexpr size_t kWide = 16, kNarrow = 4;
    const float* rows;
    size_t n, d;
    const double* x;
    double* y;
    template <int HB, size_t W>
    void run(size_t t, size_t j) const { column_tile<HB, static_cast<int>(W / 2)>(rows, n, d, x, t, j, y); }
};

void column_dots(const float* rows, size_t n, size_t d, const double* x, size_t tokens, double* y) {
    column_dots_from(rows, n, d, x, tokens, y, for_column_tiles(d, tokens, ColumnTiles{rows, n, d, x, y}));
}

uint64_t fma_probe(size_t rounds) {
    float64x2_t acc[kProbeChains];
    for (int k = 0; k < kProbeChains; ++k) acc[k] = vdupq_n_f64(k);
    const float64x2_t m = vdupq_n_f64(1.0000001), c = vdupq_n_f64(1e-9);
    for (size_t i = 0; i < rounds; ++i)
#pragma GCC unroll 12
        for (int k = 0; k < kProbeChains; ++k) acc[k] = vfmaq_f64(c, acc[k], m);
    for (int k = 1; k < kProbeChains; ++k) acc[0] = vaddq_f64(acc[0], acc[k]);
    volatile double sink = vgetq_lane_f64(acc[0], 0);
    (void)sink;
    return rounds * kProbeChains * 2;
}

}  // namespace

const MatrixKernels kNeon = {"neon",        linear,         mxfp4,    int8_rows,  int4_groups, fma_probe,
                             kda_decay_row, kda_update_row, dots_f64, column_dots};

}  // namespace k3
