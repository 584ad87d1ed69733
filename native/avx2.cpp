// The AVX2 + FMA backend of kernels.h. Each (row, token) keeps its 16 double lanes in four ymm registers,
// lanes 0..3, 4..7, 8..11 and 12..15 in order, and the fold is the scalar one; x is widened to double once
// per call, zero padded to a multiple of 16 (+0.0 * +0.0 added to a lane changes no bit: a lane that
// starts at +0.0 is never -0.0). BF16/F16/F32 weights are widened 8 at a time through float32 (exact;
// F16 with integer ops, as AVX2 does not promise F16C); MXFP4 weights straight to double by byte tables, two
// rows at once (pair_group). The draft trunk's int8 codes go the BF16 way (I8: sign-extended, converted; the row's
// scale multiplies the folded sum), its int4 codes a group of 32 at a time (int4_direct, WidenInt4).
//
// Two walks, chosen by the token count. Each only schedules work: every (row, token) adds the same products
// in the same order (docs/NUMERICS.md, "The AVX2 kernels and the FMA bound").
//   1-3 tokens  R rows x TT tokens at once, the weights widened straight into registers and used by every
//               token: 4 R TT independent FMA chains, and one load of x serves R rows. MXFP4 holds two rows
//               per ymm instead, lanes 2a and 2a + 1 of row 0 in the low half and of row 1 in the high one
//               (mxfp4_pair), and folds them back into each row's 16 lanes in order.
//   4+ tokens   a block of rows a chunk of columns at a time: each row's chunk is widened into an L1 buffer
//               once, then tiles of 3 rows x 4 tokens run over it one quarter of the lanes at a time, so
//               each load feeds 3 or 4 FMAs (at two loads per FMA the FMA units would wait on the loads).
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "kernels.h"
#include "tiles.h"

namespace k3 {
namespace {

constexpr size_t kChunk = 256;     // columns of a row widened per step of a batch: 2 KB of doubles
constexpr size_t kBlockRows = 6;   // rows widened together: 12 KB, beside a token tile's 8 KB of x, in L1
constexpr size_t kTileRows = 3;    // a batch's tile: 3 rows x 4 tokens, 12 accumulators + 3 weights + 1 x
constexpr size_t kTileTokens = 4;  // of the 16 ymm registers

// ---- x widened to double, the fold ---------------------------------------------------------------------

// The distance between tokens' widened x: `in` rounded up to 16 lanes, plus 16 doubles, so that the rows
// of a tile's tokens do not sit 4 KB apart (K3's widths are multiples of 512) and evict each other from
// the same L1 sets.
size_t x_stride(size_t in) { return (in + kLanes - 1) / kLanes * kLanes + kLanes; }

// Token t's row at xd + t * stride; elements past `in` are +0.0. Line aligned, and stride is a multiple of 16, so
// no load of x straddles two cache lines (with malloc's 16 bytes every other one did:
// docs/performance-notes/avx2-fma-bound.md).
const double* widen_x(const float* x, size_t in, size_t tokens, size_t stride) {
    thread_local std::vector<double> store;
    double* buf = line_aligned(store, tokens * stride);
    for (size_t t = 0; t < tokens; ++t) {
        const float* xt = x + t * in;
        double* dt = buf + t * stride;
        size_t i = 0;
        for (; i + 4 <= in; i += 4) _mm256_storeu_pd(dt + i, _mm256_cvtps_pd(_mm_loadu_ps(xt + i)));
        for (; i < in; ++i) dt[i] = xt[i];
        for (; i < stride; ++i) dt[i] = 0.0;
    }
    return buf;
}

// The same x for mxfp4_pair, each pair of columns twice: token t's columns 2i, 2i+1 at xp + t * 2 * stride + 4i as
// {x[2i], x[2i+1], x[2i], x[2i+1]}, one load for a pair of rows (a broadcast load costs Zen 1 an FP uop per half).
const double* widen_x_pairs(const float* x, size_t in, size_t tokens, size_t stride) {
    thread_local std::vector<double> store;
    double* buf = line_aligned(store, tokens * 2 * stride);
    for (size_t t = 0; t < tokens; ++t) {
        const float* xt = x + t * in;
        double* dt = buf + t * 2 * stride;
        for (size_t i = 0; i < in; i += 2) {  // in is a multiple of 32 for MXFP4
            dt[2 * i] = dt[2 * i + 2] = xt[i];
            dt[2 * i + 1] = dt[2 * i + 3] = xt[i + 1];
        }
        for (size_t i = 2 * in; i < 2 * stride; ++i) dt[i] = 0.0;
    }
    return buf;
}

double fold(const __m256d lanes[4]) {
    alignas(32) double acc[kLanes];
    for (int h = 0; h < 4; ++h) _mm256_store_pd(acc + 4 * h, lanes[h]);
    return lane_combine(acc);
}

// 8 float32 values widened exactly to two ymm of doubles (elements 0..3, 4..7).
inline void widen8(__m256 f, __m256d& a, __m256d& b) {
    a = _mm256_cvtps_pd(_mm256_castps256_ps128(f));
    b = _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1));
}

// ---- BF16 / F16 / F32: 8 weights at a time -------------------------------------------------------------

struct Bf16 {
    using Elem = uint16_t;
    static void eight(const Elem* p, __m256d& a, __m256d& b) {  // bf16 is the high half of its float32
        const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        a = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), bits)));
        b = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_unpackhi_epi16(_mm_setzero_si128(), bits)));
    }
};

// F16 without F16C: (bits & 0x7FFF) << 13 read as float32 is the f16 value times 2^-112, subnormals
// included; exponent 31 (inf/NaN) gets the float exponent 255. Multiplying the double by 2^112 is exact.
struct F16 {
    using Elem = uint16_t;
    static void eight(const Elem* p, __m256d& a, __m256d& b) {
        const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
        const __m256i mag = _mm256_and_si256(h, _mm256_set1_epi32(0x7FFF));
        const __m256i inf_nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7BFF));
        __m256i f = _mm256_slli_epi32(mag, 13);
        f = _mm256_or_si256(f, _mm256_and_si256(inf_nan, _mm256_set1_epi32(0x7F800000)));
        f = _mm256_or_si256(f, _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x8000)), 16));
        widen8(_mm256_castsi256_ps(f), a, b);
        const __m256d two112 = _mm256_set1_pd(5192296858534827628530496329220096.0);  // 2^112
        a = _mm256_mul_pd(a, two112);
        b = _mm256_mul_pd(b, two112);
    }
};

struct F32 {
    using Elem = float;
    static void eight(const Elem* p, __m256d& a, __m256d& b) {
        a = _mm256_cvtps_pd(_mm_loadu_ps(p));
        b = _mm256_cvtps_pd(_mm_loadu_ps(p + 4));
    }
};

// 8 int32 as two ymm of doubles (elements 0..3, 4..7), exact.
inline void int32_to_f64(__m256i v, __m256d& a, __m256d& b) {
    a = _mm256_cvtepi32_pd(_mm256_castsi256_si128(v));
    b = _mm256_cvtepi32_pd(_mm256_extracti128_si256(v, 1));
}

struct I8 {  // the draft's int8 codes: sign-extended to int32, then converted (exact)
    using Elem = int8_t;
    static void eight(const Elem* p, __m256d& a, __m256d& b) {
        int32_to_f64(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))), a, b);
    }
};

// The 8 weights at column k of a row of `in` (k < in + 8), zero padded past `in` (x is zero there too).
template <class W>
inline void eight_at(const typename W::Elem* row, size_t in, size_t k, __m256d& a, __m256d& b) {
    if (k + 8 <= in) return W::eight(row + k, a, b);
    typename W::Elem buf[8] = {};
    for (size_t j = 0; k + j < in && j < 8; ++j) buf[j] = row[k + j];
    W::eight(buf, a, b);
}

// ---- MXFP4: one group of two rows at a time -------------------------------------------------------------

// A weight E2M1[c] * 2^(s - 127) is a double with two significant bits and an exponent well inside double's
// range, so its low 48 bits are zero: bytes 6 and 7 hold it exactly, and for one scale byte (255: +-0.0) they
// are two 16-entry tables of the code, looked up 32 at a time by vpshufb (one uop a 128-bit lane on every AVX2
// core; the vpermd of a table of 8 dwords takes three on Zen 1). No float32 step, no special case for scale
// bytes 253 and 254, whose weights overflow float32.
struct TopBytes {
    alignas(16) uint8_t b6[256][16];
    alignas(16) uint8_t b7[256][16];
    TopBytes() {
        for (int s = 0; s < 256; ++s)
            for (int c = 0; c < 16; ++c) {
                const double w = e2m1(static_cast<uint8_t>(c)) * e8m0(static_cast<uint8_t>(s));
                uint64_t bits;
                std::memcpy(&bits, &w, sizeof bits);
                b6[s][c] = static_cast<uint8_t>(bits >> 48);
                b7[s][c] = static_cast<uint8_t>(bits >> 56);
            }
    }
};
const TopBytes kTopBytes;

inline __m256i two_lanes(const uint8_t* low, const uint8_t* high) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(low))),
                                   _mm_loadu_si128(reinterpret_cast<const __m128i*>(high)), 1);
}

// vpshufb masks that put two 16-bit words at the top of two doubles: bytes 6, 7 of the first double take
// word 2m of a 128-bit lane, bytes 14, 15 of the second word 2m + 1; -1 gives zero.
alignas(32) const int8_t kPlace[4][32] = {
    {-1, -1, -1, -1, -1, -1, 0, 1, -1, -1, -1, -1, -1, -1, 2, 3,
     -1, -1, -1, -1, -1, -1, 0, 1, -1, -1, -1, -1, -1, -1, 2, 3},
    {-1, -1, -1, -1, -1, -1, 4, 5, -1, -1, -1, -1, -1, -1, 6, 7,
     -1, -1, -1, -1, -1, -1, 4, 5, -1, -1, -1, -1, -1, -1, 6, 7},
    {-1, -1, -1, -1, -1, -1, 8, 9, -1, -1, -1, -1, -1, -1, 10, 11,
     -1, -1, -1, -1, -1, -1, 8, 9, -1, -1, -1, -1, -1, -1, 10, 11},
    {-1, -1, -1, -1, -1, -1, 12, 13, -1, -1, -1, -1, -1, -1, 14, 15,
     -1, -1, -1, -1, -1, -1, 12, 13, -1, -1, -1, -1, -1, -1, 14, 15}};

// One group (32 weights) of rows 0 and 1 (packed bytes p0, p1; scale bytes s0, s1), 2 weights of each row a
// step: use(i, w) for i = 0..15 in order, w = {row 0: elements 2i, 2i+1; row 1: elements 2i, 2i+1} as doubles.
// Elements 2i and 2i+1 belong to lanes 2i % 16 and 2i % 16 + 1. The 128-bit lanes never exchange data: row 0
// is decoded in the low one and row 1 in the high one. Half = 0 or 1 gives only lanes 8 Half..8 Half + 7
// (i % 8 in 4 Half..4 Half + 3), for callers with too many accumulators to hold all 16 lanes; -1 gives all.
template <int Half, class Use>
inline void pair_group(const uint8_t* p0, const uint8_t* p1, uint8_t s0, uint8_t s1, Use&& use) {
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    const __m256i bytes = two_lanes(p0, p1);
    const __m256i low = _mm256_and_si256(bytes, nibble);  // element 2k: the LOW nibble of byte k
    const __m256i high = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
    const __m256i codes[2] = {_mm256_unpacklo_epi8(low, high), _mm256_unpackhi_epi8(low, high)};  // 0..15, 16..31
    const __m256i b6 = two_lanes(kTopBytes.b6[s0], kTopBytes.b6[s1]);
    const __m256i b7 = two_lanes(kTopBytes.b7[s0], kTopBytes.b7[s1]);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
        const __m256i l6 = _mm256_shuffle_epi8(b6, codes[h]), l7 = _mm256_shuffle_epi8(b7, codes[h]);
        const __m256i words[2] = {_mm256_unpacklo_epi8(l6, l7), _mm256_unpackhi_epi8(l6, l7)};  // 8 elements each
#pragma GCC unroll 2
        for (int q = 0; q < 2; ++q) {
            if (Half >= 0 && q != Half) continue;
#pragma GCC unroll 4
            for (int m = 0; m < 4; ++m) {
                const __m256i place = _mm256_load_si256(reinterpret_cast<const __m256i*>(kPlace[m]));
                use(8 * h + 4 * q + m, _mm256_castsi256_pd(_mm256_shuffle_epi8(words[q], place)));
            }
        }
    }
}

// ---- 1-3 tokens: R rows x TT tokens, the weights widened into registers ----------------------------------

// 8 widened weights of each of R rows (a: lanes 8h..8h+3, b: 8h+4..8h+7) times the x of TT tokens at
// column `at` (token t's x at xd + t * stride), into each (row, token)'s lanes.
template <int R, int TT>
inline void accumulate8(__m256d (&acc)[R][TT][4], const __m256d (&a)[R], const __m256d (&b)[R], int h,
                        const double* xd, size_t stride, size_t at) {
#pragma GCC unroll 4
    for (int t = 0; t < TT; ++t) {
        const double* xt = xd + t * stride + at;
        const __m256d x0 = _mm256_loadu_pd(xt), x1 = _mm256_loadu_pd(xt + 4);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            acc[r][t][2 * h] = _mm256_fmadd_pd(a[r], x0, acc[r][t][2 * h]);
            acc[r][t][2 * h + 1] = _mm256_fmadd_pd(b[r], x1, acc[r][t][2 * h + 1]);
        }
    }
}

template <int R, int TT>
inline void zero(__m256d (&acc)[R][TT][4]) {
#pragma GCC unroll 32
    for (int k = 0; k < R * TT * 4; ++k) acc[k / (4 * TT)][k / 4 % TT][k % 4] = _mm256_setzero_pd();
}

template <int R, int TT, class Out, class Finish>
inline void fold_into(const __m256d (&acc)[R][TT][4], Out* y, size_t out, size_t o, const Finish& finish) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int t = 0; t < TT; ++t) y[t * out + o + r] = finish(o + r, fold(acc[r][t]));
}

// Rows o..o+R-1 of y for tokens 0..TT-1 (x of token t at xd + t * stride), 16 columns (a block of lanes) a
// step, the weights widened straight into registers once for all TT tokens.
template <class W, int R, int TT, class Out, class Finish>
void linear_direct(const typename W::Elem* w, size_t in, const double* xd, size_t stride, Out* y, size_t out,
                   size_t o, const Finish& finish) {
    __m256d acc[R][TT][4];
    zero<R, TT>(acc);
    const typename W::Elem* row = w + o * in;
    // Columns i..i+15; eight(r, k, a, b) widens columns k..k+7 of row r.
    auto step = [&](size_t i, auto eight) {
        if (i * sizeof(typename W::Elem) % 64 == 0)  // stream every row 2 KB ahead, a line at a time
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r)
                _mm_prefetch(reinterpret_cast<const char*>(row + r * in + i) + 2048, _MM_HINT_T1);
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
            __m256d a[R], b[R];
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) eight(r, i + 8 * h, a[r], b[r]);
            accumulate8<R, TT>(acc, a, b, h, xd, stride, i + 8 * h);
        }
    };
    // The tail's zero padding lives apart from the main loop: inside it, GCC keeps the accumulators in memory.
    const size_t full = in / kLanes * kLanes;
    for (size_t i = 0; i < full; i += kLanes)
        step(i, [&](int r, size_t k, __m256d& a, __m256d& b) { W::eight(row + r * in + k, a, b); });
    if (full < in) step(full, [&](int r, size_t k, __m256d& a, __m256d& b) { eight_at<W>(row + r * in, in, k, a, b); });
    fold_into<R, TT>(acc, y, out, o, finish);
}

template <class W, int R, int TT, class Out, class Finish = Plain>
void linear_direct_rows(const typename W::Elem* w, size_t in, const double* xd, size_t stride, Out* y, size_t out,
                        size_t r0, size_t r1, const Finish& finish = Finish()) {
    size_t o = r0;
    for (; o + R <= r1; o += R) linear_direct<W, R, TT>(w, in, xd, stride, y, out, o, finish);
    for (; o < r1; ++o) linear_direct<W, 1, TT>(w, in, xd, stride, y, out, o, finish);
}

// ---- the draft's int4: one group of 32 columns a step ------------------------------------------------------

// The 32 codes of a group (16 packed bytes) as signed bytes, columns 0..15 in c[0] and 16..31 in c[1].
inline void int4_codes(const uint8_t* p, __m128i (&c)[2]) {
    const __m128i nibble = _mm_set1_epi8(0x0F), bias = _mm_set1_epi8(8);
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i low = _mm_and_si128(bytes, nibble), high = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble);
    c[0] = _mm_sub_epi8(_mm_unpacklo_epi8(low, high), bias);  // column 2k: the LOW nibble of byte k; code = nibble - 8
    c[1] = _mm_sub_epi8(_mm_unpackhi_epi8(low, high), bias);
}

// Columns 8e..8e+7 of a group as weights code * s (exact): a holds 8e..8e+3, b 8e+4..8e+7.
inline void int4_eight(const __m128i (&c)[2], int e, __m256d s, __m256d& a, __m256d& b) {
    const __m128i half = c[e / 2];
    int32_to_f64(_mm256_cvtepi8_epi32(e % 2 ? _mm_unpackhi_epi64(half, half) : half), a, b);
    a = _mm256_mul_pd(a, s);
    b = _mm256_mul_pd(b, s);
}

// A padded last group of one row (columns 32 g ..): its weights in scalar, +0.0 from column `in` on.
inline void int4_last_group(const uint8_t* p, const float* s, size_t in, size_t g, double* w) {
    for (size_t i = 0; i < kGroup; ++i) {
        const size_t col = kGroup * g + i;
        const uint8_t byte = p[col / 2];
        w[i] = col < in ? int4_code(col % 2 ? byte >> 4 : byte & 0x0F) * static_cast<double>(s[g]) : 0.0;
    }
}

// Rows o..o+R-1 of y for tokens 0..TT-1 (x of token t at xd + t * stride, +0.0 past `in`), a group a step: each
// row's 32 codes decoded into two registers, then 8 columns at a time widened and scaled, used by every token.
template <int R, int TT>
void int4_direct(const uint8_t* packed, const float* scale, size_t in, const double* xd, size_t stride, float* y,
                 size_t out, size_t o) {
    const size_t groups = int4_groups_of(in), row_bytes = groups * (kGroup / 2), full = in / kGroup;
    const uint8_t* p = packed + o * row_bytes;
    const float* s = scale + o * groups;
    __m256d acc[R][TT][4];
    zero<R, TT>(acc);
    for (size_t g = 0; g < full; ++g) {
        __m128i c[R][2];
        __m256d sv[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            if (g % 4 == 0)  // stream every row 2 KB ahead, a line at a time
                _mm_prefetch(reinterpret_cast<const char*>(p + r * row_bytes + 16 * g) + 2048, _MM_HINT_T1);
            int4_codes(p + r * row_bytes + 16 * g, c[r]);
            sv[r] = _mm256_set1_pd(static_cast<double>(s[r * groups + g]));
        }
#pragma GCC unroll 4
        for (int e = 0; e < 4; ++e) {
            __m256d a[R], b[R];
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) int4_eight(c[r], e, sv[r], a[r], b[r]);
            accumulate8<R, TT>(acc, a, b, e % 2, xd, stride, kGroup * g + 8 * e);
        }
    }
    if (full < groups) {  // apart from the main loop, as linear_direct's tail
        alignas(32) double last[R][kGroup];
        for (int r = 0; r < R; ++r) int4_last_group(p + r * row_bytes, s + r * groups, in, full, last[r]);
        for (int e = 0; e < 4; ++e) {
            __m256d a[R], b[R];
            for (int r = 0; r < R; ++r) {
                a[r] = _mm256_load_pd(last[r] + 8 * e);
                b[r] = _mm256_load_pd(last[r] + 8 * e + 4);
            }
            accumulate8<R, TT>(acc, a, b, e % 2, xd, stride, kGroup * full + 8 * e);
        }
    }
    fold_into<R, TT>(acc, y, out, o, Plain());
}

template <int R, int TT>
void int4_direct_rows(const uint8_t* packed, const float* scale, size_t in, const double* xd, size_t stride, float* y,
                      size_t out, size_t r0, size_t r1) {
    size_t o = r0;
    for (; o + R <= r1; o += R) int4_direct<R, TT>(packed, scale, in, xd, stride, y, out, o);
    for (; o < r1; ++o) int4_direct<1, TT>(packed, scale, in, xd, stride, y, out, o);
}

// Lanes of rows o0 and o1 (see pair_group for Half) for tokens 0..TT-1 (x of token t at xd + t * 2 * stride,
// widen_x_pairs), the weights decoded straight into registers once for all TT tokens. Accumulator a holds lanes
// 2a and 2a + 1 (a counted from 4 Half) of row o0 in its low half and of row o1 in its high half.
template <int TT, int Half, int A = Half < 0 ? 8 : 4>
void mxfp4_pair_lanes(const uint8_t* p0, const uint8_t* p1, const uint8_t* s0, const uint8_t* s1, size_t groups,
                      const double* xd, size_t stride, __m256d (&acc)[TT][A]) {
    constexpr int first = Half < 0 ? 0 : 4 * Half;
#pragma GCC unroll 32
    for (int k = 0; k < TT * A; ++k) acc[k / A][k % A] = _mm256_setzero_pd();
    for (size_t g = 0; g < groups; ++g) {
        if (g % 4 == 0) {  // stream both rows 2 KB ahead, a line at a time (1 KB: 1.3x slower from DRAM)
            _mm_prefetch(reinterpret_cast<const char*>(p0 + 16 * g) + 2048, _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(p1 + 16 * g) + 2048, _MM_HINT_T0);
        }
        const double* xg[TT];
#pragma GCC unroll 4
        for (int t = 0; t < TT; ++t) xg[t] = xd + 2 * (t * stride + kGroup * g);
        pair_group<Half>(p0 + 16 * g, p1 + 16 * g, s0[g], s1[g], [&](int i, __m256d w) {
#pragma GCC unroll 4
            for (int t = 0; t < TT; ++t)
                acc[t][i % 8 - first] = _mm256_fmadd_pd(w, _mm256_load_pd(xg[t] + 4 * i), acc[t][i % 8 - first]);
        });
    }
}

// Rows o0 and o1 of y (o1 == o0: one row alone) for TT tokens: all 16 lanes in one walk for one token, half of
// them a walk for more (8 accumulators a token would leave no register for the decoding).
template <int TT>
void mxfp4_pair(const uint8_t* packed, const uint8_t* scale, size_t in, const double* xd, size_t stride, float* y,
                size_t out, size_t o0, size_t o1) {
    const size_t groups = in / kGroup, row_bytes = in / 2;
    const uint8_t *p0 = packed + o0 * row_bytes, *p1 = packed + o1 * row_bytes;
    const uint8_t *s0 = scale + o0 * groups, *s1 = scale + o1 * groups;
    alignas(32) double halves[TT][8][4];
    if constexpr (TT == 1) {
        __m256d acc[TT][8];
        mxfp4_pair_lanes<TT, -1>(p0, p1, s0, s1, groups, xd, stride, acc);
        for (int a = 0; a < 8; ++a) _mm256_store_pd(halves[0][a], acc[0][a]);
    } else {
        for (int half = 0; half < 2; ++half) {
            __m256d acc[TT][4];
            if (half == 0) mxfp4_pair_lanes<TT, 0>(p0, p1, s0, s1, groups, xd, stride, acc);
            else mxfp4_pair_lanes<TT, 1>(p0, p1, s0, s1, groups, xd, stride, acc);
            for (int t = 0; t < TT; ++t)
                for (int a = 0; a < 4; ++a) _mm256_store_pd(halves[t][4 * half + a], acc[t][a]);
        }
    }
    for (int t = 0; t < TT; ++t) {
        double lanes[2][kLanes];
        for (int a = 0; a < 8; ++a)
            for (int r = 0; r < 2; ++r) {
                lanes[r][2 * a] = halves[t][a][2 * r];
                lanes[r][2 * a + 1] = halves[t][a][2 * r + 1];
            }
        y[t * out + o0] = to_f32(lane_combine(lanes[0]));
        if (o1 != o0) y[t * out + o1] = to_f32(lane_combine(lanes[1]));
    }
}

// Rows [r0, r1) for TT tokens, two rows at a time.
template <int TT>
void mxfp4_pairs(const uint8_t* packed, const uint8_t* scale, size_t in, const double* xd, size_t stride, float* y,
                 size_t out, size_t r0, size_t r1) {
    for (size_t o = r0; o < r1; o += 2)
        mxfp4_pair<TT>(packed, scale, in, xd, stride, y, out, o, o + 1 < r1 ? o + 1 : o);
}

// ---- several tokens: widen a chunk of a row once, then every token tile over it ----------------------------

// Lanes 4h..4h+3 of rows 0..R-1 and tokens 0..TT-1 gain columns [0, n) of the widened chunks (row r at
// w + r * kChunk; n a multiple of 16); x of token t at x + t * stride, the lanes of (r, t) at
// lanes + (r * pitch + t) * 16. One quarter of the lanes at a time: R x TT accumulators, and each load of
// w or x serves TT or R FMAs (two loads per FMA would leave the FMA units half idle).
template <int R, int TT>
void dot_tile(const double* w, size_t n, const double* x, size_t stride, double* lanes, size_t pitch) {
#pragma GCC unroll 4
    for (int h = 0; h < 4; ++h) {
        __m256d acc[R][TT];
#pragma GCC unroll 16
        for (int k = 0; k < R * TT; ++k)
            acc[k / TT][k % TT] = _mm256_load_pd(lanes + ((k / TT) * pitch + k % TT) * kLanes + 4 * h);
        for (size_t i = 4 * h; i < n; i += kLanes) {
            __m256d wv[R];
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r) wv[r] = _mm256_load_pd(w + r * kChunk + i);
#pragma GCC unroll 4
            for (int t = 0; t < TT; ++t) {
                const __m256d xv = _mm256_loadu_pd(x + t * stride + i);
#pragma GCC unroll 4
                for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_pd(wv[r], xv, acc[r][t]);
            }
        }
#pragma GCC unroll 16
        for (int k = 0; k < R * TT; ++k)
            _mm256_store_pd(lanes + ((k / TT) * pitch + k % TT) * kLanes + 4 * h, acc[k / TT][k % TT]);
    }
}

// dot_tile<rows, tokens> for a tile's run-time size.
template <int R>
void dot_tile_rows(size_t tokens, const double* w, size_t n, const double* x, size_t stride, double* lanes,
                   size_t pitch) {
    switch (tokens) {
        case 4: return dot_tile<R, 4>(w, n, x, stride, lanes, pitch);
        case 3: return dot_tile<R, 3>(w, n, x, stride, lanes, pitch);
        case 2: return dot_tile<R, 2>(w, n, x, stride, lanes, pitch);
        default: return dot_tile<R, 1>(w, n, x, stride, lanes, pitch);
    }
}

void dot_tile(size_t rows, size_t tokens, const double* w, size_t n, const double* x, size_t stride, double* lanes,
              size_t pitch) {
    if (rows == 3) dot_tile_rows<3>(tokens, w, n, x, stride, lanes, pitch);
    else if (rows == 2) dot_tile_rows<2>(tokens, w, n, x, stride, lanes, pitch);
    else dot_tile_rows<1>(tokens, w, n, x, stride, lanes, pitch);
}

// Rows [r0, r1) for every token, over `columns` (`in` rounded up to 16). widen(o0, rows, c, n, buf) writes
// columns [c, c + n) of rows o0..o0+rows-1 as doubles at buf + r * kChunk, zero padded past `in`; n is a
// multiple of 16 (of 32 for MXFP4, whose rows are). A block of kBlockRows rows goes a chunk of columns at a
// time; within a chunk each token tile's x serves the block's row tiles from L1.
template <class Widen, class Out, class Finish = Plain>
void gemm(const Widen& widen, size_t columns, size_t stride, const double* xd, size_t tokens, Out* y,
          size_t out, size_t r0, size_t r1, const Finish& finish = Finish()) {
    thread_local std::vector<double> buf_store, lanes_store;
    double* buf = line_aligned(buf_store, kBlockRows * kChunk);
    double* lanes = line_aligned(lanes_store, kBlockRows * tokens * kLanes);
    for (size_t o0 = r0; o0 < r1; o0 += kBlockRows) {
        const size_t rows = r1 - o0 < kBlockRows ? r1 - o0 : kBlockRows;
        std::memset(lanes, 0, rows * tokens * kLanes * sizeof(double));  // +0.0
        for (size_t c = 0; c < columns; c += kChunk) {
            const size_t n = columns - c < kChunk ? columns - c : kChunk;
            widen(o0, rows, c, n, buf);
            for (size_t t = 0; t < tokens; t += kTileTokens) {
                const size_t tt = tokens - t < kTileTokens ? tokens - t : kTileTokens;
                for (size_t r = 0; r < rows; r += kTileRows) {
                    const size_t rr = rows - r < kTileRows ? rows - r : kTileRows;
                    dot_tile(rr, tt, buf + r * kChunk, n, xd + t * stride + c, stride,
                             lanes + (r * tokens + t) * kLanes, tokens);
                }
            }
        }
        for (size_t r = 0; r < rows; ++r)
            for (size_t t = 0; t < tokens; ++t)
                y[t * out + o0 + r] = finish(o0 + r, lane_combine(lanes + (r * tokens + t) * kLanes));
    }
}

template <class W>
struct WidenLinear {
    const typename W::Elem* w;
    size_t in;
    void row(size_t o, size_t c, size_t n, double* out) const {
        const typename W::Elem* row = w + o * in;
        for (size_t k = 0; k < n; k += 32)  // the row's chunks 2 KB ahead
            _mm_prefetch(reinterpret_cast<const char*>(row + c + k) + 2048, _MM_HINT_T0);
        for (size_t k = 0; k < n; k += 8) {
            __m256d a, b;
            eight_at<W>(row, in, c + k, a, b);
            _mm256_store_pd(out + k, a);
            _mm256_store_pd(out + k + 4, b);
        }
    }
    void operator()(size_t o0, size_t rows, size_t c, size_t n, double* buf) const {
        for (size_t r = 0; r < rows; ++r) row(o0 + r, c, n, buf + r * kChunk);
    }
};

struct WidenMxfp4 {
    const uint8_t* packed;
    const uint8_t* scale;
    size_t in;
    // Rows o0 and o1 (o1 == o0: one row alone), into out0 and out1.
    void pair(size_t o0, size_t o1, size_t c, size_t n, double* out0, double* out1) const {
        const uint8_t *p0 = packed + o0 * (in / 2) + c / 2, *p1 = packed + o1 * (in / 2) + c / 2;
        const uint8_t *s0 = scale + o0 * (in / kGroup) + c / kGroup, *s1 = scale + o1 * (in / kGroup) + c / kGroup;
        for (size_t k = 0; k < n / 2; k += 64) {  // the rows' chunks 1 KB ahead, their scales 64 bytes ahead
            _mm_prefetch(reinterpret_cast<const char*>(p0 + k) + 1024, _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(p1 + k) + 1024, _MM_HINT_T0);
        }
        _mm_prefetch(reinterpret_cast<const char*>(s0) + 64, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(s1) + 64, _MM_HINT_T0);
        for (size_t g = 0; g < n / kGroup; ++g)
            pair_group<-1>(p0 + 16 * g, p1 + 16 * g, s0[g], s1[g], [&](int i, __m256d w) {
                _mm_store_pd(out0 + kGroup * g + 2 * i, _mm256_castpd256_pd128(w));
                _mm_store_pd(out1 + kGroup * g + 2 * i, _mm256_extractf128_pd(w, 1));
            });
    }
    void operator()(size_t o0, size_t rows, size_t c, size_t n, double* buf) const {
        for (size_t r = 0; r < rows; r += 2) {
            const size_t r1 = r + 1 < rows ? r + 1 : r;
            pair(o0 + r, o0 + r1, c, n, buf + r * kChunk, buf + r1 * kChunk);
        }
    }
};

// The draft's int4 rows: whole groups decoded and scaled 8 columns at a time, the padded last one in scalar
// (+0.0 past `in`). A chunk starts on a group (kChunk is a multiple of 32) and ends at most 16 columns past `in`.
struct WidenInt4 {
    const uint8_t* packed;
    const float* scale;
    size_t in;
    void row(size_t o, size_t c, size_t n, double* out) const {
        const size_t groups = int4_groups_of(in), row_bytes = groups * (kGroup / 2);
        const uint8_t* p = packed + o * row_bytes;
        const float* s = scale + o * groups;
        for (size_t k = 0; k < n / 2; k += 64)  // the row's chunks 1 KB ahead
            _mm_prefetch(reinterpret_cast<const char*>(p + c / 2 + k) + 1024, _MM_HINT_T0);
        for (size_t g = c / kGroup; kGroup * g < c + n; ++g) {
            double* w = out + kGroup * g - c;
            if (kGroup * (g + 1) > in) {
                alignas(32) double last[kGroup];
                int4_last_group(p, s, in, g, last);
                for (size_t i = 0; kGroup * g + i < c + n; ++i) w[i] = last[i];
                continue;
            }
            __m128i codes[2];
            int4_codes(p + 16 * g, codes);
            const __m256d sv = _mm256_set1_pd(static_cast<double>(s[g]));
#pragma GCC unroll 4
            for (int e = 0; e < 4; ++e) {
                __m256d a, b;
                int4_eight(codes, e, sv, a, b);
                _mm256_store_pd(w + 8 * e, a);
                _mm256_store_pd(w + 8 * e + 4, b);
            }
        }
    }
    void operator()(size_t o0, size_t rows, size_t c, size_t n, double* buf) const {
        for (size_t r = 0; r < rows; ++r) row(o0 + r, c, n, buf + r * kChunk);
    }
};

// ---- the entry points --------------------------------------------------------------------------------------

template <class W, class Out = float, class Finish = Plain>
void linear_rows(const void* w, size_t in, const float* x, size_t tokens, Out* y, size_t out, size_t r0,
                 size_t r1, const Finish& finish = Finish()) {
    const size_t stride = x_stride(in);
    const auto* wt = static_cast<const typename W::Elem*>(w);
    const double* xd = widen_x(x, in, tokens, stride);
    switch (tokens) {
        case 1: return linear_direct_rows<W, 2, 1>(wt, in, xd, stride, y, out, r0, r1, finish);
        case 2: return linear_direct_rows<W, 1, 2>(wt, in, xd, stride, y, out, r0, r1, finish);
        case 3: return linear_direct_rows<W, 1, 3>(wt, in, xd, stride, y, out, r0, r1, finish);
        default: return gemm(WidenLinear<W>{wt, in}, stride - kLanes, stride, xd, tokens, y, out, r0, r1, finish);
    }
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

void mxfp4(const uint8_t* packed, const uint8_t* scale, size_t in, const float* x, size_t tokens, float* y,
           size_t out, size_t r0, size_t r1) {
    const size_t stride = x_stride(in);
    switch (tokens) {
        case 1: return mxfp4_pairs<1>(packed, scale, in, widen_x_pairs(x, in, 1, stride), stride, y, out, r0, r1);
        case 2: return mxfp4_pairs<2>(packed, scale, in, widen_x_pairs(x, in, 2, stride), stride, y, out, r0, r1);
        case 3: return mxfp4_pairs<3>(packed, scale, in, widen_x_pairs(x, in, 3, stride), stride, y, out, r0, r1);
        default:
            return gemm(WidenMxfp4{packed, scale, in}, in, stride, widen_x(x, in, tokens, stride), tokens, y, out, r0,
                        r1);
    }
}

void int8_rows(const int8_t* codes, const float* scale, size_t in, const float* x, size_t tokens, float* y,
               size_t out, size_t r0, size_t r1) {
    const size_t stride = x_stride(in);
    const double* xd = widen_x(x, in, tokens, stride);
    const RowScaled finish{scale};
    switch (tokens) {
        case 1: return linear_direct_rows<I8, 2, 1>(codes, in, xd, stride, y, out, r0, r1, finish);
        case 2: return linear_direct_rows<I8, 1, 2>(codes, in, xd, stride, y, out, r0, r1, finish);
        case 3: return linear_direct_rows<I8, 1, 3>(codes, in, xd, stride, y, out, r0, r1, finish);
        default: return gemm(WidenLinear<I8>{codes, in}, stride - kLanes, stride, xd, tokens, y, out, r0, r1, finish);
    }
}

void int4_groups(const uint8_t* packed, const float* scale, size_t in, const float* x, size_t tokens, float* y,
                 size_t out, size_t r0, size_t r1) {
    const size_t stride = x_stride(in);  // >= 32 G: a padded last group reads x's zeros
    const double* xd = widen_x(x, in, tokens, stride);
    switch (tokens) {
        case 1: return int4_direct_rows<2, 1>(packed, scale, in, xd, stride, y, out, r0, r1);
        case 2: return int4_direct_rows<1, 2>(packed, scale, in, xd, stride, y, out, r0, r1);
        case 3: return int4_direct_rows<1, 3>(packed, scale, in, xd, stride, y, out, r0, r1);
        default: return gemm(WidenInt4{packed, scale, in}, stride - kLanes, stride, xd, tokens, y, out, r0, r1);
    }
}

// ---- KDA's state rows: 4 columns a step, the last d % 4 in scalar code --------------------------------------

// to_f32 of 4 doubles: cvtpd2ps rounds as the scalar cast does and keeps a NaN a NaN, which becomes the canonical one.
__m128 to_f32_x4(__m256d v) {
    const __m128 f = _mm256_cvtpd_ps(v);
    return _mm_blendv_ps(f, _mm_castsi128_ps(_mm_set1_epi32(0x7FC00000)), _mm_cmpunord_ps(f, f));
}

void kda_decay_row(const float* s, size_t d, double a, double k, double* lane) {
    const __m256d av = _mm256_set1_pd(a), kv = _mm256_set1_pd(k);
    size_t j = 0;
    for (; j + 4 <= d; j += 4) {
        const __m256d decayed = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(s + j)), av);
        _mm256_storeu_pd(lane + j, _mm256_add_pd(_mm256_loadu_pd(lane + j), _mm256_mul_pd(decayed, kv)));
    }
    kda_decay_columns(s, j, d, a, k, lane);
}

void kda_update_row(float* s, size_t d, double a, double k, const double* delta, double q, double* lane) {
    const __m256d av = _mm256_set1_pd(a), kv = _mm256_set1_pd(k), qv = _mm256_set1_pd(q);
    size_t j = 0;
    for (; j + 4 <= d; j += 4) {
        const __m256d decayed = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(s + j)), av);
        const __m128 updated = to_f32_x4(_mm256_add_pd(decayed, _mm256_mul_pd(kv, _mm256_loadu_pd(delta + j))));
        _mm_storeu_ps(s + j, updated);
        const __m256d product = _mm256_mul_pd(_mm256_cvtps_pd(updated), qv);
        _mm256_storeu_pd(lane + j, _mm256_add_pd(_mm256_loadu_pd(lane + j), product));
    }
    kda_update_columns(s, j, d, a, k, delta, q, lane);
}

// ---- attention's column dots ---------------------------------------------------------------------------------

// Columns j..j+4 JB - 1 for tokens t0..t0+HB-1, one lane at a time: lane l adds rows l, l + 16, l + 32, ... in order,
// as it would walking every row (a lane's sum does not depend on when the others add theirs), so a row's columns,
// widened once, serve HB tokens with HB x JB accumulators. The lanes are then folded as lane_combine folds them.
template <int HB, int JB>
void column_tile(const float* rows, size_t n, size_t d, const double* x, size_t t0, size_t j, double* y) {
    constexpr int kWidth = HB * JB * 4;
    alignas(32) double lanes[kLanes * kWidth];
    for (int l = 0; l < kLanes; ++l) {
        __m256d acc[HB][JB];
#pragma GCC unroll 16
        for (int k = 0; k < HB * JB; ++k) acc[k / JB][k % JB] = _mm256_setzero_pd();
        for (size_t i = static_cast<size_t>(l); i < n; i += kLanes) {
            const float* row = rows + i * d + j;
            _mm_prefetch(reinterpret_cast<const char*>(row + 4 * kLanes * d), _MM_HINT_T0);  // 16 rows apart
            __m256d v[JB];
#pragma GCC unroll 4
            for (int b = 0; b < JB; ++b) v[b] = _mm256_cvtps_pd(_mm_loadu_ps(row + 4 * b));
#pragma GCC unroll 4
            for (int h = 0; h < HB; ++h) {
                const __m256d xi = _mm256_set1_pd(x[(t0 + h) * n + i]);  // a product, then the sum
#pragma GCC unroll 4
                for (int b = 0; b < JB; ++b) acc[h][b] = _mm256_add_pd(acc[h][b], _mm256_mul_pd(v[b], xi));
            }
        }
#pragma GCC unroll 16
        for (int k = 0; k < HB * JB; ++k) _mm256_store_pd(lanes + l * kWidth + 4 * k, acc[k / JB][k % JB]);
    }
    alignas(32) double folded[kWidth];
    fold_lane_columns(lanes, kWidth, folded);
    for (int h = 0; h < HB; ++h)
        for (int c = 0; c < JB * 4; ++c) y[(t0 + h) * d + j + static_cast<size_t>(c)] = folded[h * JB * 4 + c];
}

struct ColumnTiles {
    static constexpr int kTokens = 2;
    static constexpr size_t kWide = 16, kNarrow = 4;
    const float* rows;
    size_t n, d;
    const double* x;
    double* y;
    template <int HB, size_t W>
    void run(size_t t, size_t j) const { column_tile<HB, static_cast<int>(W / 4)>(rows, n, d, x, t, j, y); }
};

void column_dots(const float* rows, size_t n, size_t d, const double* x, size_t tokens, double* y) {
    column_dots_from(rows, n, d, x, tokens, y, for_column_tiles(d, tokens, ColumnTiles{rows, n, d, x, y}));
}

uint64_t fma_probe(size_t rounds) {
    __m256d acc[kProbeChains];
    for (int k = 0; k < kProbeChains; ++k) acc[k] = _mm256_set1_pd(k);
    const __m256d m = _mm256_set1_pd(1.0000001), c = _mm256_set1_pd(1e-9);
    for (size_t i = 0; i < rounds; ++i)
#pragma GCC unroll 12
        for (int k = 0; k < kProbeChains; ++k) acc[k] = _mm256_fmadd_pd(acc[k], m, c);
    for (int k = 1; k < kProbeChains; ++k) acc[0] = _mm256_add_pd(acc[0], acc[k]);
    volatile double sink = _mm256_cvtsd_f64(acc[0]);
    (void)sink;
    return rounds * kProbeChains * 4;
}

}  // namespace

const MatrixKernels kAvx2 = {"avx2",        linear,         mxfp4,    int8_rows,  int4_groups, fma_probe,
                             kda_decay_row, kda_update_row, dots_f64, column_dots};

}  // namespace k3
