// The AVX2 + FMA backend of kernels.h. Each (row, token) keeps its 16 double lanes in four ymm registers,
// lanes 0..3, 4..7, 8..11 and 12..15 in order; x is widened to double once per call (zero padded to a
// multiple of 16) and the fold is the scalar one. Weights are widened 8 at a time through float32 (exact);
// F16 uses integer ops (AVX2 does not promise F16C) and MXFP4 a float lookup table per scale byte.
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "kernels.h"
#include "tiles.h"

namespace k3 {
namespace {

// Calls tile.run<R, TT>(o, t) with TT = tt (1..3) known at compile time.
template <int R, class Tile>
void run_tokens_dispatch(const Tile& tile, size_t o, size_t t, size_t tt) {
    switch (tt) {
        case 1: tile.template run<R, 1>(o, t); break;
        case 2: tile.template run<R, 2>(o, t); break;
        default: tile.template run<R, 3>(o, t); break;
    }
}

// ---- x widened to double, the fold ---------------------------------------------------------------------

// Token t's row at xd + t * stride; elements past `in` are +0.0, and +0.0 * +0.0 added to a lane changes
// no bit (a lane that starts at +0.0 is never -0.0).
const double* widen_x(const float* x, size_t in, size_t tokens, size_t stride) {
    thread_local std::vector<double> buf;
    buf.resize(tokens * stride);
    for (size_t t = 0; t < tokens; ++t) {
        const float* xt = x + t * in;
        double* dt = buf.data() + t * stride;
        size_t i = 0;
        for (; i + 4 <= in; i += 4) _mm256_storeu_pd(dt + i, _mm256_cvtps_pd(_mm_loadu_ps(xt + i)));
        for (; i < in; ++i) dt[i] = xt[i];
        for (; i < stride; ++i) dt[i] = 0.0;
    }
    return buf.data();
}

float fold(__m256d lanes0to3, __m256d lanes4to7, __m256d lanes8to11, __m256d lanes12to15) {
    alignas(32) double acc[kLanes];
    _mm256_store_pd(acc, lanes0to3);
    _mm256_store_pd(acc + 4, lanes4to7);
    _mm256_store_pd(acc + 8, lanes8to11);
    _mm256_store_pd(acc + 12, lanes12to15);
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
    static void eight(const Elem* p, __m256d& a, __m256d& b) {  // bf16 -> f32 is a 16-bit shift
        const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
        widen8(_mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)), a, b);
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

// The last n < 8 weights of a row (n may be 0), zero padded (x is zero there too).
template <class W>
void eight_tail(const typename W::Elem* p, size_t n, __m256d& a, __m256d& b) {
    typename W::Elem buf[8] = {};
    for (size_t k = 0; k < n; ++k) buf[k] = p[k];
    W::eight(buf, a, b);
}

template <class W>
struct LinearTile {
    static constexpr int kRowsGemv = 2, kRowsGemm = 1, kTokens = 3;
    const typename W::Elem* w;
    size_t in;
    const double* xd;
    size_t stride;
    float* y;
    size_t out;

    template <int R>
    void run_tokens(size_t o, size_t t, size_t tt) const { run_tokens_dispatch<R>(*this, o, t, tt); }

    // Rows o..o+R-1 for tokens t0..t0+TT-1; 8 weights (half h of a 16-lane block: registers 2h, 2h+1)
    // are widened once for all TT tokens.
    template <int R, int TT>
    void run(size_t o, size_t t0) const {
        __m256d acc[R][TT][4];
#pragma GCC unroll 16
        for (int k = 0; k < R * TT * 4; ++k) acc[k / (TT * 4)][k / 4 % TT][k % 4] = _mm256_setzero_pd();
        const typename W::Elem* row = w + o * in;
        for (size_t i = 0; i < stride; i += kLanes) {
            if (i * sizeof(typename W::Elem) % 64 == 0)  // stream the rows 2 KB ahead
#pragma GCC unroll 8
                for (int r = 0; r < R; ++r)
                    _mm_prefetch(reinterpret_cast<const char*>(row + r * in + i) + 2048, _MM_HINT_T1);
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h) {
                __m256d a[R], b[R];
#pragma GCC unroll 8
                for (int r = 0; r < R; ++r) {
                    const size_t k = i + 8 * h;
                    if (k + 8 <= in) W::eight(row + r * in + k, a[r], b[r]);
                    else eight_tail<W>(row + r * in + k, k < in ? in - k : 0, a[r], b[r]);
                }
#pragma GCC unroll 8
                for (int t = 0; t < TT; ++t) {
                    const double* xt = xd + (t0 + t) * stride + i + 8 * h;
                    const __m256d x0 = _mm256_loadu_pd(xt), x1 = _mm256_loadu_pd(xt + 4);
#pragma GCC unroll 8
                    for (int r = 0; r < R; ++r) {
                        acc[r][t][2 * h] = _mm256_fmadd_pd(a[r], x0, acc[r][t][2 * h]);
                        acc[r][t][2 * h + 1] = _mm256_fmadd_pd(b[r], x1, acc[r][t][2 * h + 1]);
                    }
                }
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
            for (int t = 0; t < TT; ++t) {
                const __m256d* a = acc[r][t];
                y[(t0 + t) * out + o + r] = fold(a[0], a[1], a[2], a[3]);
            }
    }
};

template <class W>
void linear_rows(const void* w, size_t in, const float* x, size_t tokens, float* y, size_t out, size_t r0,
                 size_t r1) {
    const size_t stride = (in + kLanes - 1) / kLanes * kLanes;
    const auto* wt = static_cast<const typename W::Elem*>(w);
    const LinearTile<W> tile{wt, in, widen_x(x, in, tokens, stride), stride, y, out};
    for_tiles(r0, r1, tokens, tile);
}

void linear(WeightType type, const void* w, size_t in, const float* x, size_t tokens, float* y, size_t out,
            size_t r0, size_t r1) {
    if (type == WeightType::BF16) linear_rows<Bf16>(w, in, x, tokens, y, out, r0, r1);
    else if (type == WeightType::F16) linear_rows<F16>(w, in, x, tokens, y, out, r0, r1);
    else linear_rows<F32>(w, in, x, tokens, y, out, r0, r1);
}

// ---- MXFP4 -------------------------------------------------------------------------------------------------

// 8 codes of one packed dword: shifting it right by 0, 4, .., 28 leaves code j in bits 3..0 of lane j.
// vpermps looks the magnitude up from bits 2..0; the table entry m is stored XOR (m << 28), so XOR with
// (lane << 28) -- the code in bits 31..28 -- cancels those bits again and sets the sign from bit 3.
// The float entry is E2M1[m] * 2^(s - 127), exact for every scale byte but 253 and 254 (they overflow
// float32); groups with those take an exact double path.
struct MagnitudeTables {
    alignas(32) float v[256][8];
    MagnitudeTables() {
        for (int s = 0; s < 256; ++s)
            for (uint32_t m = 0; m < 8; ++m) {
                const double exact = e2m1(static_cast<uint8_t>(m)) * e8m0(static_cast<uint8_t>(s));
                const float value = static_cast<float>(exact);
                uint32_t bits;
                std::memcpy(&bits, &value, sizeof bits);
                bits ^= m << 28;
                std::memcpy(&v[s][m], &bits, sizeof bits);
            }
    }
};
const MagnitudeTables kMagnitudes;

bool float_table_exact(uint8_t s) { return s < 253 || s == 255; }

inline void eight_codes(uint32_t packed4, __m256 table, __m256d& a, __m256d& b) {
    const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i idx = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(packed4)), shifts);
    const __m256 magnitude = _mm256_permutevar8x32_ps(table, idx);
    widen8(_mm256_xor_ps(magnitude, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28))), a, b);
}

inline void eight_codes_exact(const uint8_t* p, uint8_t s, __m256d& a, __m256d& b) {
    alignas(32) double w[8];
    for (int k = 0; k < 8; ++k) w[k] = e2m1(static_cast<uint8_t>(p[k / 2] >> (4 * (k % 2)))) * e8m0(s);
    a = _mm256_load_pd(w), b = _mm256_load_pd(w + 4);
}

struct Mx4Tile {
    static constexpr int kRowsGemv = 1, kRowsGemm = 1, kTokens = 3;
    const uint8_t* packed;
    const uint8_t* scale;
    size_t in;
    const double* xd;
    float* y;
    size_t out;

    template <int R>
    void run_tokens(size_t o, size_t t, size_t tt) const { run_tokens_dispatch<R>(*this, o, t, tt); }

    // Rows o..o+R-1 for tokens t0..t0+TT-1, 8 weights (4 packed bytes) at a time.
    template <int R, int TT>
    void run(size_t o, size_t t0) const {
        __m256d acc[R][TT][4];
#pragma GCC unroll 16
        for (int k = 0; k < R * TT * 4; ++k) acc[k / (TT * 4)][k / 4 % TT][k % 4] = _mm256_setzero_pd();
        const size_t groups = in / kGroup, row_bytes = in / 2;
        const uint8_t* p = packed + o * row_bytes;
        const uint8_t* s = scale + o * groups;
        const char* next = reinterpret_cast<const char*>(p + R * row_bytes);  // the next tile: a line per group
        for (size_t g = 0; g < groups; ++g) {
            _mm_prefetch(next + 64 * g, _MM_HINT_T0);
            __m256 table[R];
            bool exact = true;
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
                table[r] = _mm256_load_ps(kMagnitudes.v[s[r * groups + g]]);
                exact = exact && float_table_exact(s[r * groups + g]);
            }
#pragma GCC unroll 4
            for (int q = 0; q < 4; ++q) {  // elements 8q..8q+7 of the group: lanes 8h..8h+7, h = q % 2
                __m256d a[R], b[R];
#pragma GCC unroll 8
                for (int r = 0; r < R; ++r) {
                    const uint8_t* bytes = p + r * row_bytes + 16 * g + 4 * q;
                    if (exact) {
                        uint32_t packed4;
                        std::memcpy(&packed4, bytes, sizeof packed4);
                        eight_codes(packed4, table[r], a[r], b[r]);
                    } else {
                        eight_codes_exact(bytes, s[r * groups + g], a[r], b[r]);
                    }
                }
                const int h = q % 2;
#pragma GCC unroll 8
                for (int t = 0; t < TT; ++t) {
                    const double* xt = xd + (t0 + t) * in + kGroup * g + 8 * q;
                    const __m256d x0 = _mm256_loadu_pd(xt), x1 = _mm256_loadu_pd(xt + 4);
#pragma GCC unroll 8
                    for (int r = 0; r < R; ++r) {
                        acc[r][t][2 * h] = _mm256_fmadd_pd(a[r], x0, acc[r][t][2 * h]);
                        acc[r][t][2 * h + 1] = _mm256_fmadd_pd(b[r], x1, acc[r][t][2 * h + 1]);
                    }
                }
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
            for (int t = 0; t < TT; ++t) {
                const __m256d* a = acc[r][t];
                y[(t0 + t) * out + o + r] = fold(a[0], a[1], a[2], a[3]);
            }
    }
};

void mxfp4(const uint8_t* packed, const uint8_t* scale, size_t in, const float* x, size_t tokens, float* y,
           size_t out, size_t r0, size_t r1) {
    const Mx4Tile tile{packed, scale, in, widen_x(x, in, tokens, in), y, out};
    for_tiles(r0, r1, tokens, tile);
}

}  // namespace

const MatrixKernels kAvx2 = {"avx2", linear, mxfp4};

}  // namespace k3
