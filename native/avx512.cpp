// The AVX-512 (F/BW/VL) backend of kernels.h. Each (row, token) keeps its 16 double lanes in two zmm:
// for F16/F32 and the draft's int8 the first holds lanes 0..7 and the second lanes 8..15; for BF16, MXFP4 and
// the draft's int4 the first holds the even lanes 0, 2, .., 14 and the second the odd lanes (the low nibbles
// of 8 packed bytes are 8 even lanes; the low halves of 8 32-bit words of bf16 are 8 even lanes). x is widened
// to double once per call in the matching order; the fold is the scalar one.
// GCC 12 warns falsely inside its own AVX-512 headers (_mm512_undefined_*, GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <vector>

#include "kernels.h"
#include "tiles.h"

namespace k3 {
namespace {

// Calls tile.run<R, TT>(o, t) with TT = tt (1..4) known at compile time.
template <int R, class Tile>
void run_tokens_dispatch(const Tile& tile, size_t o, size_t t, size_t tt) {
    switch (tt) {
        case 1: tile.template run<R, 1>(o, t); break;
        case 2: tile.template run<R, 2>(o, t); break;
        case 3: tile.template run<R, 3>(o, t); break;
        default: tile.template run<R, 4>(o, t); break;
    }
}

// ---- x widened to double -------------------------------------------------------------------------------

// Token t's row at xd + t * stride; elements past `in` are +0.0, and +0.0 * +0.0 added to a lane changes
// no bit (a lane that starts at +0.0 is never -0.0). Line aligned: a 64-byte load of x never straddles two lines.
const double* widen_x(const float* x, size_t in, size_t tokens, size_t stride) {
    thread_local std::vector<double> store;
    double* buf = line_aligned(store, tokens * stride);
    for (size_t t = 0; t < tokens; ++t) {
        const float* xt = x + t * in;
        double* dt = buf + t * stride;
        size_t i = 0;
        for (; i + 8 <= in; i += 8) _mm512_storeu_pd(dt + i, _mm512_cvtps_pd(_mm256_loadu_ps(xt + i)));
        for (; i < in; ++i) dt[i] = xt[i];
        for (; i < stride; ++i) dt[i] = 0.0;
    }
    return buf;
}

// The even/odd order, per 16 columns: elements 0, 2, .., 14 | 1, 3, .., 15. Per token: stride (a multiple of 16)
// doubles, +0.0 past `in` (BF16's last partial block; int4's padded last group, stride = 32 G; MXFP4: stride = in).
const double* widen_x_even_odd(const float* x, size_t in, size_t tokens, size_t stride) {
    thread_local std::vector<double> store;
    double* buf = line_aligned(store, tokens * stride);
    const __m512i even = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
    const __m512i odd = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
    for (size_t t = 0; t < tokens; ++t) {
        const float* xt = x + t * in;
        double* dt = buf + t * stride;
        size_t b = 0;
        for (; b + kLanes <= in; b += kLanes) {
            const __m512d lo = _mm512_cvtps_pd(_mm256_loadu_ps(xt + b));
            const __m512d hi = _mm512_cvtps_pd(_mm256_loadu_ps(xt + b + 8));
            _mm512_store_pd(dt + b, _mm512_permutex2var_pd(lo, even, hi));
            _mm512_store_pd(dt + b + 8, _mm512_permutex2var_pd(lo, odd, hi));
        }
        for (; b < stride; b += kLanes)
            for (size_t k = 0; k < kLanes / 2; ++k) {
                const size_t even = b + 2 * k, odd = even + 1;
                dt[b + k] = even < in ? static_cast<double>(xt[even]) : 0.0;
                dt[b + kLanes / 2 + k] = odd < in ? static_cast<double>(xt[odd]) : 0.0;
            }
    }
    return buf;
}

// ---- the fold ----------------------------------------------------------------------------------------------

double lanes_sum(__m512d lanes0to7, __m512d lanes8to15) {
    alignas(64) double acc[kLanes];
    _mm512_store_pd(acc, lanes0to7);
    _mm512_store_pd(acc + 8, lanes8to15);
    return lane_combine(acc);
}

double lanes_sum_even_odd(__m512d even, __m512d odd) {
    const __m512i lo = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11);
    const __m512i hi = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
    return lanes_sum(_mm512_permutex2var_pd(even, lo, odd), _mm512_permutex2var_pd(even, hi, odd));
}

float fold_even_odd(__m512d even, __m512d odd) { return to_f32(lanes_sum_even_odd(even, odd)); }

// ---- BF16 / F16 / F32: 16 weights widened to two zmm of doubles --------------------------------------------

// kEvenOdd: load gives the even lanes and the odd ones (x widened by widen_x_even_odd, folded by
// lanes_sum_even_odd), not lanes 0..7 and 8..15.
// BF16: 32-bit word k of a block holds elements 2k (its low half) and 2k + 1. As float32 they are the word shifted
// left 16 and the word with its low half cleared; f32 -> f64 is exact. Two uops fewer per 16 weights than widening
// 8 zero-extended halves at a time, on the ports the FMAs use (docs/performance-notes/avx512-batch-icelake.md).
struct Bf16 {
    using Elem = uint16_t;
    static constexpr bool kEvenOdd = true;
    static void load(const Elem* p, __m512d& even, __m512d& odd) {
        const __m256i words = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        even = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_slli_epi32(words, 16)));
        odd = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_and_si256(words, _mm256_set1_epi32(-65536))));
    }
};

struct F16 {
    using Elem = uint16_t;
    static constexpr bool kEvenOdd = false;
    static void load(const Elem* p, __m512d& lo, __m512d& hi) {  // f16 -> f32 is exact, subnormals too
        const __m512 f = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
        lo = _mm512_cvtps_pd(_mm512_castps512_ps256(f));
        hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)));
    }
};

struct F32 {
    using Elem = float;
    static constexpr bool kEvenOdd = false;
    static void load(const Elem* p, __m512d& lo, __m512d& hi) {
        lo = _mm512_cvtps_pd(_mm256_loadu_ps(p));
        hi = _mm512_cvtps_pd(_mm256_loadu_ps(p + 8));
    }
};

struct I8 {  // the draft's int8 codes: sign-extended to int32, then converted (exact)
    using Elem = int8_t;
    static constexpr bool kEvenOdd = false;
    static void load(const Elem* p, __m512d& lo, __m512d& hi) {
        const __m512i v = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
        lo = _mm512_cvtepi32_pd(_mm512_castsi512_si256(v));
        hi = _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(v, 1));
    }
};

// The last n < 16 weights of a row, zero padded (x is zero there too).
template <class W>
void load_tail(const typename W::Elem* p, size_t n, __m512d& lo, __m512d& hi) {
    typename W::Elem buf[kLanes] = {};
    for (size_t i = 0; i < n; ++i) buf[i] = p[i];
    W::load(buf, lo, hi);
}

template <class W, class Finish = Plain, class Out = float>
struct LinearTile {
    static constexpr int kRowsGemv = 4, kRowsGemm = 3, kTokens = 4;
    const typename W::Elem* w;
    size_t in;
    const double* xd;
    size_t stride;
    Out* y;
    size_t out;
    Finish finish;

    template <int R>
    void run_tokens(size_t o, size_t t, size_t tt) const { run_tokens_dispatch<R>(*this, o, t, tt); }

    // Rows o..o+R-1 for tokens t0..t0+TT-1: each 16-weight block is widened once for all TT tokens.
    template <int R, int TT>
    void run(size_t o, size_t t0) const {
        __m512d acc[R][TT][2];
#pragma GCC unroll 16
        for (int k = 0; k < R * TT * 2; ++k) acc[k / (TT * 2)][k / 2 % TT][k % 2] = _mm512_setzero_pd();
        const typename W::Elem* row = w + o * in;
        for (size_t i = 0; i < in; i += kLanes) {
            if (i * sizeof(typename W::Elem) % 64 == 0)  // stream the rows 2 KB ahead
#pragma GCC unroll 8
                for (int r = 0; r < R; ++r)
                    _mm_prefetch(reinterpret_cast<const char*>(row + r * in + i) + 2048, _MM_HINT_T1);
            __m512d lo[R], hi[R];
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
                if (i + kLanes <= in) W::load(row + r * in + i, lo[r], hi[r]);
                else load_tail<W>(row + r * in + i, in - i, lo[r], hi[r]);
            }
#pragma GCC unroll 8
            for (int t = 0; t < TT; ++t) {
                const double* xt = xd + (t0 + t) * stride + i;
                const __m512d x0 = _mm512_loadu_pd(xt), x1 = _mm512_loadu_pd(xt + 8);
#pragma GCC unroll 8
                for (int r = 0; r < R; ++r) {
                    acc[r][t][0] = _mm512_fmadd_pd(lo[r], x0, acc[r][t][0]);
                    acc[r][t][1] = _mm512_fmadd_pd(hi[r], x1, acc[r][t][1]);
                }
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
            for (int t = 0; t < TT; ++t)
                y[(t0 + t) * out + o + r] = finish(o + r, W::kEvenOdd ? lanes_sum_even_odd(acc[r][t][0], acc[r][t][1])
                                                                      : lanes_sum(acc[r][t][0], acc[r][t][1]));
    }
};

template <class W, class Out = float, class Finish = Plain>
void linear_rows(const void* w, size_t in, const float* x, size_t tokens, Out* y, size_t out, size_t r0,
                 size_t r1, const Finish& finish = Finish()) {
    const size_t stride = (in + kLanes - 1) / kLanes * kLanes;
    const auto* wt = static_cast<const typename W::Elem*>(w);
    const double* xd = W::kEvenOdd ? widen_x_even_odd(x, in, tokens, stride) : widen_x(x, in, tokens, stride);
    const LinearTile<W, Finish, Out> tile{wt, in, xd, stride, y, out, finish};
    for_tiles(r0, r1, tokens, tile);
}

void linear(WeightType type, const void* w, size_t in, const float* x, size_t tokens, float* y, size_t out,
            size_t r0, size_t r1) {
    if (type == WeightType::BF16) linear_rows<Bf16>(w, in, x, tokens, y, out, r0, r1);
    else if (type == WeightType::F16) linear_rows<F16>(w, in, x, tokens, y, out, r0, r1);
    else linear_rows<F32>(w, in, x, tokens, y, out, r0, r1);
}

void dots_f64(const float* w, size_t in, const float* x, size_t tokens, double* y, size_t out, size_t r0,
              size_t r1) {
    linear_rows<F32>(w, in, x, tokens, y, out, r0, r1, Unrounded{});
}

// ---- MXFP4 -------------------------------------------------------------------------------------------------

// kScaled.v[s][c] = E2M1[c] * 2^(s - 127), exactly the scalar weight (scale 255: +-0.0). A group's 16
// values are two zmm, and vpermt2pd looks 8 codes up at once: it reads only bits 3..0 of each 64-bit index.
struct ScaledE2m1 {
    alignas(64) double v[256][16];
    ScaledE2m1() {
        for (int s = 0; s < 256; ++s)
            for (int c = 0; c < 16; ++c) v[s][c] = e2m1(static_cast<uint8_t>(c)) * e8m0(static_cast<uint8_t>(s));
    }
};
const ScaledE2m1 kScaled;

struct Mx4Tile {
    static constexpr int kRowsGemv = 4, kRowsGemm = 2, kTokens = 4;
    const uint8_t* packed;
    const uint8_t* scale;
    size_t in;
    const double* xd;
    float* y;
    size_t out;

    template <int R>
    void run_tokens(size_t o, size_t t, size_t tt) const { run_tokens_dispatch<R>(*this, o, t, tt); }

    // Rows o..o+R-1 for tokens t0..t0+TT-1. Half h of a group is 8 packed bytes: zero-extended to 64-bit
    // lanes they index the even lanes of its 16 elements (low nibbles; the high nibble is ignored by the
    // lookup) and, shifted right by 4, the odd lanes.
    template <int R, int TT>
    void run(size_t o, size_t t0) const {
        __m512d even[R][TT], odd[R][TT];
#pragma GCC unroll 16
        for (int k = 0; k < R * TT; ++k) even[k / TT][k % TT] = odd[k / TT][k % TT] = _mm512_setzero_pd();
        const size_t groups = in / kGroup, row_bytes = in / 2;
        const uint8_t* p = packed + o * row_bytes;
        const uint8_t* s = scale + o * groups;
        const char* next = reinterpret_cast<const char*>(p + R * row_bytes);  // the next tile: a line per group
        for (size_t g = 0; g < groups; ++g) {
            _mm_prefetch(next + 64 * g, _MM_HINT_T0);
            __m512d table_lo[R], table_hi[R];
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
                table_lo[r] = _mm512_load_pd(kScaled.v[s[r * groups + g]]);
                table_hi[r] = _mm512_load_pd(kScaled.v[s[r * groups + g]] + 8);
            }
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h) {  // elements 0..15, then 16..31: lane order within each lane
                __m512d we[R], wo[R];
#pragma GCC unroll 8
                for (int r = 0; r < R; ++r) {
                    const uint8_t* bytes = p + r * row_bytes + 16 * g + 8 * h;
                    const __m512i idx = _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes)));
                    we[r] = _mm512_permutex2var_pd(table_lo[r], idx, table_hi[r]);
                    wo[r] = _mm512_permutex2var_pd(table_lo[r], _mm512_srli_epi64(idx, 4), table_hi[r]);
                }
#pragma GCC unroll 8
                for (int t = 0; t < TT; ++t) {
                    const double* xt = xd + (t0 + t) * in + kGroup * g + kLanes * h;
                    const __m512d xe = _mm512_loadu_pd(xt), xo = _mm512_loadu_pd(xt + 8);
#pragma GCC unroll 8
                    for (int r = 0; r < R; ++r) {
                        even[r][t] = _mm512_fmadd_pd(we[r], xe, even[r][t]);
                        odd[r][t] = _mm512_fmadd_pd(wo[r], xo, odd[r][t]);
                    }
                }
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
            for (int t = 0; t < TT; ++t) y[(t0 + t) * out + o + r] = fold_even_odd(even[r][t], odd[r][t]);
    }
};

void mxfp4(const uint8_t* packed, const uint8_t* scale, size_t in, const float* x, size_t tokens, float* y,
           size_t out, size_t r0, size_t r1) {
    const Mx4Tile tile{packed, scale, in, widen_x_even_odd(x, in, tokens, in), y, out};
    for_tiles(r0, r1, tokens, tile);
}

// ---- the draft's int8 and int4 ------------------------------------------------------------------------------

void int8_rows(const int8_t* codes, const float* scale, size_t in, const float* x, size_t tokens, float* y,
               size_t out, size_t r0, size_t r1) {
    linear_rows<I8>(codes, in, x, tokens, y, out, r0, r1, RowScaled{scale});
}

// Mx4Tile's walk with the group's table computed, not looked up: (nibble - 8) * s for nibbles 0..7 and 8..15, two
// multiplies a row and group, exactly the scalar weights. Lanes of a padded last group's columns past `in` are
// zeroed by the permute's mask (+0.0, whatever the padding's nibbles and the scale hold); x is +0.0 there too.
struct Int4Tile {
    static constexpr int kRowsGemv = 4, kRowsGemm = 2, kTokens = 4;
    const uint8_t* packed;
    const float* scale;
    size_t in;
    const double* xd;
    size_t stride;  // 32 G
    float* y;
    size_t out;

    template <int R>
    void run_tokens(size_t o, size_t t, size_t tt) const { run_tokens_dispatch<R>(*this, o, t, tt); }

    // The lanes below n of 8 as a mask: lane k holds a column when k < n.
    static __mmask8 below(size_t n) { return n >= 8 ? 0xFF : static_cast<__mmask8>((1u << n) - 1); }

    template <int R, int TT>
    void run(size_t o, size_t t0) const {
        __m512d even[R][TT], odd[R][TT];
#pragma GCC unroll 16
        for (int k = 0; k < R * TT; ++k) even[k / TT][k % TT] = odd[k / TT][k % TT] = _mm512_setzero_pd();
        const size_t groups = stride / kGroup, row_bytes = groups * (kGroup / 2);
        const uint8_t* p = packed + o * row_bytes;
        const float* s = scale + o * groups;
        const char* next = reinterpret_cast<const char*>(p + R * row_bytes);  // the next tile: a line per group
        const __m512d codes_lo = _mm512_setr_pd(-8, -7, -6, -5, -4, -3, -2, -1);
        const __m512d codes_hi = _mm512_setr_pd(0, 1, 2, 3, 4, 5, 6, 7);
        for (size_t g = 0; g < groups; ++g) {
            _mm_prefetch(next + 64 * g, _MM_HINT_T0);
            __m512d table_lo[R], table_hi[R];
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
                const __m512d sv = _mm512_set1_pd(static_cast<double>(s[r * groups + g]));
                table_lo[r] = _mm512_mul_pd(codes_lo, sv);
                table_hi[r] = _mm512_mul_pd(codes_hi, sv);
            }
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h) {  // columns 0..15, then 16..31 of the group
                const size_t first = kGroup * g + kLanes * h;  // even lane k: column first + 2k; odd: + 1
                const size_t left = in > first ? in - first : 0;
                const __mmask8 me = below((left + 1) / 2), mo = below(left / 2);
                __m512d we[R], wo[R];
#pragma GCC unroll 8
                for (int r = 0; r < R; ++r) {
                    const uint8_t* bytes = p + r * row_bytes + 16 * g + 8 * h;
                    const __m512i idx = _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes)));
                    we[r] = _mm512_maskz_permutex2var_pd(me, table_lo[r], idx, table_hi[r]);
                    wo[r] = _mm512_maskz_permutex2var_pd(mo, table_lo[r], _mm512_srli_epi64(idx, 4), table_hi[r]);
                }
#pragma GCC unroll 8
                for (int t = 0; t < TT; ++t) {
                    const double* xt = xd + (t0 + t) * stride + first;
                    const __m512d xe = _mm512_loadu_pd(xt), xo = _mm512_loadu_pd(xt + 8);
#pragma GCC unroll 8
                    for (int r = 0; r < R; ++r) {
                        even[r][t] = _mm512_fmadd_pd(we[r], xe, even[r][t]);
                        odd[r][t] = _mm512_fmadd_pd(wo[r], xo, odd[r][t]);
                    }
                }
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
            for (int t = 0; t < TT; ++t) y[(t0 + t) * out + o + r] = fold_even_odd(even[r][t], odd[r][t]);
    }
};

void int4_groups(const uint8_t* packed, const float* scale, size_t in, const float* x, size_t tokens, float* y,
                 size_t out, size_t r0, size_t r1) {
    const size_t stride = int4_groups_of(in) * kGroup;
    const Int4Tile tile{packed, scale, in, widen_x_even_odd(x, in, tokens, stride), stride, y, out};
    for_tiles(r0, r1, tokens, tile);
}

// ---- KDA's state rows: 8 columns a step, the last d % 8 in scalar code --------------------------------------

// to_f32 of 8 doubles: cvtpd2ps rounds as the scalar cast does and keeps a NaN a NaN, which becomes the canonical one.
__m256 to_f32_x8(__m512d v) {
    const __m256 f = _mm512_cvtpd_ps(v);
    return _mm256_blendv_ps(f, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), _mm256_cmp_ps(f, f, _CMP_UNORD_Q));
}

void kda_decay_row(const float* s, size_t d, double a, double k, double* lane) {
    const __m512d av = _mm512_set1_pd(a), kv = _mm512_set1_pd(k);
    size_t j = 0;
    for (; j + 8 <= d; j += 8) {
        const __m512d decayed = _mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(s + j)), av);
        _mm512_storeu_pd(lane + j, _mm512_add_pd(_mm512_loadu_pd(lane + j), _mm512_mul_pd(decayed, kv)));
    }
    kda_decay_columns(s, j, d, a, k, lane);
}

void kda_update_row(float* s, size_t d, double a, double k, const double* delta, double q, double* lane) {
    const __m512d av = _mm512_set1_pd(a), kv = _mm512_set1_pd(k), qv = _mm512_set1_pd(q);
    size_t j = 0;
    for (; j + 8 <= d; j += 8) {
        const __m512d decayed = _mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(s + j)), av);
        const __m256 updated = to_f32_x8(_mm512_add_pd(decayed, _mm512_mul_pd(kv, _mm512_loadu_pd(delta + j))));
        _mm256_storeu_ps(s + j, updated);
        const __m512d product = _mm512_mul_pd(_mm512_cvtps_pd(updated), qv);
        _mm512_storeu_pd(lane + j, _mm512_add_pd(_mm512_loadu_pd(lane + j), product));
    }
    kda_update_columns(s, j, d, a, k, delta, q, lane);
}

// ---- attention's column dots ---------------------------------------------------------------------------------

// Columns j..j+8 JB - 1 for tokens t0..t0+HB-1, one lane at a time: lane l adds rows l, l + 16, l + 32, ... in order,
// as it would walking every row (a lane's sum does not depend on when the others add theirs), so a row's columns,
// widened once, serve HB tokens with HB x JB accumulators. The lanes are then folded as lane_combine folds them.
template <int HB, int JB>
void column_tile(const float* rows, size_t n, size_t d, const double* x, size_t t0, size_t j, double* y) {
    constexpr int kWidth = HB * JB * 8;
    alignas(64) double lanes[kLanes * kWidth];
    for (int l = 0; l < kLanes; ++l) {
        __m512d acc[HB][JB];
#pragma GCC unroll 16
        for (int k = 0; k < HB * JB; ++k) acc[k / JB][k % JB] = _mm512_setzero_pd();
        for (size_t i = static_cast<size_t>(l); i < n; i += kLanes) {
            const float* row = rows + i * d + j;
            _mm_prefetch(reinterpret_cast<const char*>(row + 4 * kLanes * d), _MM_HINT_T0);  // 16 rows apart
            __m512d v[JB];
#pragma GCC unroll 4
            for (int b = 0; b < JB; ++b) v[b] = _mm512_cvtps_pd(_mm256_loadu_ps(row + 8 * b));
#pragma GCC unroll 4
            for (int h = 0; h < HB; ++h) {
                const __m512d xi = _mm512_set1_pd(x[(t0 + h) * n + i]);  // a product, then the sum
#pragma GCC unroll 4
                for (int b = 0; b < JB; ++b) acc[h][b] = _mm512_add_pd(acc[h][b], _mm512_mul_pd(v[b], xi));
            }
        }
#pragma GCC unroll 16
        for (int k = 0; k < HB * JB; ++k) _mm512_store_pd(lanes + l * kWidth + 8 * k, acc[k / JB][k % JB]);
    }
    alignas(64) double folded[kWidth];
    fold_lane_columns(lanes, kWidth, folded);
    for (int h = 0; h < HB; ++h)
        for (int c = 0; c < JB * 8; ++c) y[(t0 + h) * d + j + static_cast<size_t>(c)] = folded[h * JB * 8 + c];
}

struct ColumnTiles {
    static constexpr int kTokens = 4;
    static constexpr size_t kWide = 32, kNarrow = 8;
    const float* rows;
    size_t n, d;
    const double* x;
    double* y;
    template <int HB, size_t W>
    void run(size_t t, size_t j) const { column_tile<HB, static_cast<int>(W / 8)>(rows, n, d, x, t, j, y); }
};

void column_dots(const float* rows, size_t n, size_t d, const double* x, size_t tokens, double* y) {
    column_dots_from(rows, n, d, x, tokens, y, for_column_tiles(d, tokens, ColumnTiles{rows, n, d, x, y}));
}

uint64_t fma_probe(size_t rounds) {
    __m512d acc[kProbeChains];
    for (int k = 0; k < kProbeChains; ++k) acc[k] = _mm512_set1_pd(k);
    const __m512d m = _mm512_set1_pd(1.0000001), c = _mm512_set1_pd(1e-9);
    for (size_t i = 0; i < rounds; ++i)
#pragma GCC unroll 12
        for (int k = 0; k < kProbeChains; ++k) acc[k] = _mm512_fmadd_pd(acc[k], m, c);
    for (int k = 1; k < kProbeChains; ++k) acc[0] = _mm512_add_pd(acc[0], acc[k]);
    alignas(64) double lanes[8];
    _mm512_store_pd(lanes, acc[0]);
    volatile double sink = lanes[0];
    (void)sink;
    return rounds * kProbeChains * 8;
}

}  // namespace

const MatrixKernels kAvx512 = {"avx512",      linear,         mxfp4,    int8_rows,  int4_groups, fma_probe,
                               kda_decay_row, kda_update_row, dots_f64, column_dots};

}  // namespace k3
