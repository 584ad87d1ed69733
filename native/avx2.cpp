// The AVX2 + FMA backend of kernels.h. Each (row, token) keeps its 16 double lanes in four ymm registers,
// lanes 0..3, 4..7, 8..11 and 12..15 in order, and the fold is the scalar one; x is widened to double once
// per call, zero padded to a multiple of 16 (+0.0 * +0.0 added to a lane changes no bit: a lane that
// starts at +0.0 is never -0.0). BF16/F16/F32 weights are widened 8 at a time through float32 (exact;
// F16 with integer ops, as AVX2 does not promise F16C); MXFP4 weights straight to double (eight_codes).
//
// Two walks, chosen by the token count. Each only schedules work: every (row, token) adds the same products
// in the same order (docs/NUMERICS.md, "The AVX2 kernels and the FMA bound").
//   1-3 tokens  R rows x TT tokens at once, the weights widened straight into registers and used by every
//               token: 4 R TT independent FMA chains, and one load of x serves R rows.
//   4+ tokens   a block of rows a chunk of columns at a time: each row's chunk is widened into an L1 buffer
//               once, then tiles of 3 rows x 4 tokens run over it one quarter of the lanes at a time, so
//               each load feeds 3 or 4 FMAs (at two loads per FMA the FMA units would wait on the loads).
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "kernels.h"

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
// no load of x straddles two cache lines (with malloc's 16 bytes every other one did: docs/PERFORMANCE.md).
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

float fold(const __m256d lanes[4]) {
    alignas(32) double acc[kLanes];
    for (int h = 0; h < 4; ++h) _mm256_store_pd(acc + 4 * h, lanes[h]);
    return to_f32(lane_combine(acc));
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

// The 8 weights at column k of a row of `in` (k < in + 8), zero padded past `in` (x is zero there too).
template <class W>
inline void eight_at(const typename W::Elem* row, size_t in, size_t k, __m256d& a, __m256d& b) {
    if (k + 8 <= in) return W::eight(row + k, a, b);
    typename W::Elem buf[8] = {};
    for (size_t j = 0; k + j < in && j < 8; ++j) buf[j] = row[k + j];
    W::eight(buf, a, b);
}

// ---- MXFP4: 8 weights (one packed dword) at a time -------------------------------------------------------

// A weight E2M1[c] * 2^(s - 127) is a double whose low 32 bits are zero, so a table of the high halves,
// 8 magnitudes per scale byte, holds every weight exactly (scale byte 255: ±0.0), and widening is an
// interleave with zeros, no float conversion. The dword's 8 codes: shifting it right by the lane's shift
// leaves a code in bits 3..0; vpermd looks its magnitude up from bits 2..0; the entry for magnitude m is
// stored XOR (m << 28), so XOR with (lane << 28) -- the code in bits 31..28 -- cancels those bits again
// and sets the sign from bit 3. The shifts are in the order the interleaves take lanes (0, 1, 4, 5, then
// 2, 3, 6, 7), so a holds elements 0..3 and b elements 4..7.
struct HighHalves {
    alignas(32) uint32_t v[256][8];
    HighHalves() {
        for (int s = 0; s < 256; ++s)
            for (uint32_t m = 0; m < 8; ++m) {
                const double w = e2m1(static_cast<uint8_t>(m)) * e8m0(static_cast<uint8_t>(s));
                uint64_t bits;
                std::memcpy(&bits, &w, sizeof bits);
                v[s][m] = static_cast<uint32_t>(bits >> 32) ^ (m << 28);
            }
    }
};
const HighHalves kHighHalves;

inline void eight_codes(const uint8_t* bytes, const uint32_t* table, __m256d& a, __m256d& b) {
    const __m256i shifts = _mm256_setr_epi32(0, 4, 16, 20, 8, 12, 24, 28);
    uint32_t packed4;
    std::memcpy(&packed4, bytes, sizeof packed4);
    const __m256i idx = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(packed4)), shifts);
    const __m256i high = _mm256_xor_si256(
        _mm256_permutevar8x32_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(table)), idx),
        _mm256_slli_epi32(idx, 28));
    a = _mm256_castsi256_pd(_mm256_unpacklo_epi32(_mm256_setzero_si256(), high));
    b = _mm256_castsi256_pd(_mm256_unpackhi_epi32(_mm256_setzero_si256(), high));
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

template <int R, int TT>
inline void fold_into(const __m256d (&acc)[R][TT][4], float* y, size_t out, size_t o) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int t = 0; t < TT; ++t) y[t * out + o + r] = fold(acc[r][t]);
}

// Rows o..o+R-1 of y for tokens 0..TT-1 (x of token t at xd + t * stride), 16 columns (a block of lanes) a
// step, the weights widened straight into registers once for all TT tokens.
template <class W, int R, int TT>
void linear_direct(const typename W::Elem* w, size_t in, const double* xd, size_t stride, float* y, size_t out,
                   size_t o) {
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
    fold_into<R, TT>(acc, y, out, o);
}

template <class W, int R, int TT>
void linear_direct_rows(const typename W::Elem* w, size_t in, const double* xd, size_t stride, float* y, size_t out,
                        size_t r0, size_t r1) {
    size_t o = r0;
    for (; o + R <= r1; o += R) linear_direct<W, R, TT>(w, in, xd, stride, y, out, o);
    for (; o < r1; ++o) linear_direct<W, 1, TT>(w, in, xd, stride, y, out, o);
}

// Rows o..o+R-1 of y for tokens 0..TT-1 (x of token t at xd + t * stride), the weights widened straight
// into registers once for all TT tokens.
template <int R, int TT>
void mxfp4_direct(const uint8_t* packed, const uint8_t* scale, size_t in, const double* xd, size_t stride, float* y,
                  size_t out, size_t o) {
    __m256d acc[R][TT][4];
    zero<R, TT>(acc);
    const size_t groups = in / kGroup, row_bytes = in / 2;
    const uint8_t* p = packed + o * row_bytes;
    const uint8_t* s = scale + o * groups;
    for (size_t g = 0; g < groups; ++g, p += 16, s += 1) {
        if (g % 4 == 0)  // stream every row 2 KB ahead, a line at a time (1 KB: 1.3x slower from DRAM)
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r)
                _mm_prefetch(reinterpret_cast<const char*>(p + r * row_bytes) + 2048, _MM_HINT_T0);
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) {  // elements 8q..8q+7 of the group: lanes 8h..8h+7, h = q % 2
            const int h = q % 2;
            __m256d a[R], b[R];
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r)
                eight_codes(p + r * row_bytes + 4 * q, kHighHalves.v[s[r * groups]], a[r], b[r]);
            accumulate8<R, TT>(acc, a, b, h, xd, stride, kGroup * g + 8 * q);
        }
    }
    fold_into<R, TT>(acc, y, out, o);
}

// Rows [r0, r1) for TT tokens, R rows at a time.
template <int R, int TT>
void mxfp4_direct_rows(const uint8_t* packed, const uint8_t* scale, size_t in, const double* xd, size_t stride,
                       float* y, size_t out, size_t r0, size_t r1) {
    size_t o = r0;
    for (; o + R <= r1; o += R) mxfp4_direct<R, TT>(packed, scale, in, xd, stride, y, out, o);
    for (; o < r1; ++o) mxfp4_direct<1, TT>(packed, scale, in, xd, stride, y, out, o);
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

// Rows [r0, r1) for every token, over `columns` (`in` rounded up to 16). widen(o, c, n, out) writes columns
// [c, c + n) of row o as doubles, zero padded past `in`; n is a multiple of 16 (of 32 for MXFP4, whose rows
// are). A block of kBlockRows rows goes a chunk of columns at a time; within a chunk each token tile's x
// serves the block's row tiles from L1.
template <class Widen>
void gemm(const Widen& widen, size_t columns, size_t stride, const double* xd, size_t tokens, float* y,
          size_t out, size_t r0, size_t r1) {
    thread_local std::vector<double> buf_store, lanes_store;
    double* buf = line_aligned(buf_store, kBlockRows * kChunk);
    double* lanes = line_aligned(lanes_store, kBlockRows * tokens * kLanes);
    for (size_t o0 = r0; o0 < r1; o0 += kBlockRows) {
        const size_t rows = r1 - o0 < kBlockRows ? r1 - o0 : kBlockRows;
        std::memset(lanes, 0, rows * tokens * kLanes * sizeof(double));  // +0.0
        for (size_t c = 0; c < columns; c += kChunk) {
            const size_t n = columns - c < kChunk ? columns - c : kChunk;
            for (size_t r = 0; r < rows; ++r) widen(o0 + r, c, n, buf + r * kChunk);
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
                y[t * out + o0 + r] = to_f32(lane_combine(lanes + (r * tokens + t) * kLanes));
    }
}

template <class W>
struct WidenLinear {
    const typename W::Elem* w;
    size_t in;
    void operator()(size_t o, size_t c, size_t n, double* out) const {
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
};

struct WidenMxfp4 {
    const uint8_t* packed;
    const uint8_t* scale;
    size_t in;
    void operator()(size_t o, size_t c, size_t n, double* out) const {
        const uint8_t* p = packed + o * (in / 2) + c / 2;
        const uint8_t* s = scale + o * (in / kGroup) + c / kGroup;
        for (size_t k = 0; k < n / 2; k += 64)  // the row's chunks 1 KB ahead, its scales 64 bytes ahead
            _mm_prefetch(reinterpret_cast<const char*>(p + k) + 1024, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(s) + 64, _MM_HINT_T0);
        for (size_t g = 0; g < n / kGroup; ++g) {
            for (int q = 0; q < 4; ++q) {
                __m256d a, b;
                eight_codes(p + 16 * g + 4 * q, kHighHalves.v[s[g]], a, b);
                _mm256_store_pd(out + kGroup * g + 8 * q, a);
                _mm256_store_pd(out + kGroup * g + 8 * q + 4, b);
            }
        }
    }
};

// ---- the entry points --------------------------------------------------------------------------------------

template <class W>
void linear_rows(const void* w, size_t in, const float* x, size_t tokens, float* y, size_t out, size_t r0,
                 size_t r1) {
    const size_t stride = x_stride(in);
    const auto* wt = static_cast<const typename W::Elem*>(w);
    const double* xd = widen_x(x, in, tokens, stride);
    switch (tokens) {
        case 1: return linear_direct_rows<W, 2, 1>(wt, in, xd, stride, y, out, r0, r1);
        case 2: return linear_direct_rows<W, 1, 2>(wt, in, xd, stride, y, out, r0, r1);
        case 3: return linear_direct_rows<W, 1, 3>(wt, in, xd, stride, y, out, r0, r1);
        default: return gemm(WidenLinear<W>{wt, in}, stride - kLanes, stride, xd, tokens, y, out, r0, r1);
    }
}

void linear(WeightType type, const void* w, size_t in, const float* x, size_t tokens, float* y, size_t out,
            size_t r0, size_t r1) {
    if (type == WeightType::BF16) linear_rows<Bf16>(w, in, x, tokens, y, out, r0, r1);
    else if (type == WeightType::F16) linear_rows<F16>(w, in, x, tokens, y, out, r0, r1);
    else linear_rows<F32>(w, in, x, tokens, y, out, r0, r1);
}

void mxfp4(const uint8_t* packed, const uint8_t* scale, size_t in, const float* x, size_t tokens, float* y,
           size_t out, size_t r0, size_t r1) {
    const size_t stride = x_stride(in);
    const double* xd = widen_x(x, in, tokens, stride);
    switch (tokens) {
        case 1: return mxfp4_direct_rows<2, 1>(packed, scale, in, xd, stride, y, out, r0, r1);
        case 2: return mxfp4_direct_rows<1, 2>(packed, scale, in, xd, stride, y, out, r0, r1);
        case 3: return mxfp4_direct_rows<1, 3>(packed, scale, in, xd, stride, y, out, r0, r1);
        default: return gemm(WidenMxfp4{packed, scale, in}, in, stride, xd, tokens, y, out, r0, r1);
    }
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

const MatrixKernels kAvx2 = {"avx2", linear, mxfp4, fma_probe};

}  // namespace k3
