// How close to the FMA probe can a product under k3's contract get on this core? (`make bench-ceiling`)
//
// The contract (native/kernels.h) gives every (row, token) 16 double lanes, so a SIMD product keeps two (AVX-512) or
// four (AVX2) vector accumulators per (row, token) and every multiply-add needs a weight vector and an x vector:
// a register tile of R rows x T tokens loads R + T vectors for R x T FMAs. This measures, on one thread:
//   probe        12 independent chains of the widest double FMA, register operands only (what `k3 bench
//                kernels` calls the FMA probe)
//   FMA + load   12 chains, each FMA reading one vector from L1: how many vector loads a cycle feed the FMAs
//   tile R x T   the register tiles of the batch kernels (R x T accumulators, R weight vectors and one x vector in
//                registers) over weights and x already widened to double and resident in L1, the accumulators
//                loaded and stored every 32 steps as a blocked product's are: the ceiling of a GEMM built on them,
//                before widening, cache misses and the fold
//   widened      (AVX-512) the same tiles with the kernels' widening inside them, bf16 and MXFP4 as native/avx512.cpp
//                decodes them, every operand in L1: "16 lanes" keeps both halves of each (row, token) in registers as
//                the kernels do (two accumulators a pair), "half" one half in a pass of its own (one accumulator a
//                pair, twice the pairs per widened vector): what a product that widens in registers can reach here
// Built twice, for AVX-512 (WIDTH=512) and AVX2 + FMA (WIDTH=256); a binary on a CPU without its instructions says
// so and measures nothing. Each line: the best of 5 timed runs, in G double multiply-adds per second, and its share
// of the probe measured again right after it (a shared host's noise moves both). Only ratios within a run compare.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

#if WIDTH == 512
using V = __m512d;
constexpr int N = 8;
constexpr const char* kName = "AVX-512 (zmm)";
constexpr const char* kFeature = "avx512f";
V zero() { return _mm512_setzero_pd(); }
V set(double v) { return _mm512_set1_pd(v); }
V load(const double* p) { return _mm512_load_pd(p); }
void store(double* p, V v) { _mm512_store_pd(p, v); }
V fma(V a, V b, V c) { return _mm512_fmadd_pd(a, b, c); }
#elif WIDTH == 256
using V = __m256d;
constexpr int N = 4;
constexpr const char* kName = "AVX2 (ymm)";
constexpr const char* kFeature = "avx2";
V zero() { return _mm256_setzero_pd(); }
V set(double v) { return _mm256_set1_pd(v); }
V load(const double* p) { return _mm256_load_pd(p); }
void store(double* p, V v) { _mm256_store_pd(p, v); }
V fma(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
#else
#error "build with -DWIDTH=512 -mavx512f or -DWIDTH=256 -mavx2 -mfma"
#endif

using Clock = std::chrono::steady_clock;
constexpr int kSteps = 32;  // vectors per tile row: 2 KB (zmm) or 1 KB (ymm), so 12 rows and tokens stay in L1

template <class F>
double best_seconds(F&& run) {
    double best = 1e30;
    for (int i = 0; i < 5; ++i) {
        const auto t0 = Clock::now();
        run();
        best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return best;
}

__attribute__((noinline)) double probe(size_t rounds, double* sink) {
    V acc[12];
#pragma GCC unroll 12
    for (int k = 0; k < 12; ++k) acc[k] = set(k);
    const V m = set(1.0000001), c = set(1e-9);
    for (size_t i = 0; i < rounds; ++i)
#pragma GCC unroll 12
        for (int k = 0; k < 12; ++k) acc[k] = fma(acc[k], m, c);
#pragma GCC unroll 12
    for (int k = 0; k < 12; ++k) store(sink + k * N, acc[k]);
    return static_cast<double>(rounds) * 12 * N;
}

template <int C>
__attribute__((noinline)) double fma_load(const double* buf, size_t rounds, double* sink) {
    V acc[C];
#pragma GCC unroll 24
    for (int k = 0; k < C; ++k) acc[k] = zero();
    const V m = set(1.0000001);
    for (size_t i = 0; i < rounds; ++i) {
#pragma GCC unroll 24
        for (int k = 0; k < C; ++k) acc[k] = fma(m, load(buf + k * N), acc[k]);
        __asm__ volatile("" ::: "memory");  // the loads happen every round
    }
#pragma GCC unroll 24
    for (int k = 0; k < C; ++k) store(sink + k * N, acc[k]);
    return static_cast<double>(rounds) * C * N;
}

// acc[r][t] += w_r * x_t over kSteps vectors, from and back to memory per call, as the batch kernels' tiles run.
template <int R, int T>
__attribute__((noinline)) double tile(const double* w, const double* x, size_t calls, double* acc_mem) {
    for (size_t c = 0; c < calls; ++c) {
        V acc[R][T];
#pragma GCC unroll 32
        for (int k = 0; k < R * T; ++k) acc[k / T][k % T] = load(acc_mem + k * N);
        for (int s = 0; s < kSteps * N; s += N) {
            V wv[R];
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) wv[r] = load(w + r * kSteps * N + s);
#pragma GCC unroll 8
            for (int t = 0; t < T; ++t) {
                V xv = load(x + t * kSteps * N + s);
                __asm__("" : "+v"(xv));  // x loaded once for the tile's R rows, as the kernels do: GCC would fold
                                         // the load into each row's FMA and read x R times
#pragma GCC unroll 8
                for (int r = 0; r < R; ++r) acc[r][t] = fma(wv[r], xv, acc[r][t]);
            }
        }
#pragma GCC unroll 32
        for (int k = 0; k < R * T; ++k) store(acc_mem + k * N, acc[k / T][k % T]);
    }
    return static_cast<double>(calls) * R * T * kSteps * N;
}

#if WIDTH == 512
// The widened tiles' operands: up to 12 rows of kCols weights, 12 tokens of x and 24 pairs' accumulators, in L1.
constexpr int kCols = 256;
alignas(64) uint16_t bf16_rows[12 * kCols];
alignas(64) uint8_t mxfp4_rows[12 * kCols / 2];
alignas(64) double x_rows[12 * kCols], pairs[24 * 16];
alignas(64) double mxfp4_table[16];  // one table for every group (the kernels look one up a group and row)

// Lanes h (0 even, 1 odd) of 16 bf16 weights: the 32-bit words shifted left 16, or their low halves cleared.
V bf16_half(const uint16_t* p, int h) {
    const __m256i words = _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_cvtps_pd(_mm256_castsi256_ps(h == 0 ? _mm256_slli_epi32(words, 16)
                                                      : _mm256_and_si256(words, _mm256_set1_epi32(-65536))));
}

// Lanes h of 16 MXFP4 weights (8 bytes): low nibbles index the table for the even lanes, high ones the odd.
V mxfp4_half(const uint8_t* p, int h) {
    __m512i idx = _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    if (h == 1) idx = _mm512_srli_epi64(idx, 4);
    return _mm512_permutex2var_pd(load(mxfp4_table), idx, load(mxfp4_table + 8));
}

template <bool kMxfp4>
V widen(int row, int column, int h) {
    if (kMxfp4) return mxfp4_half(mxfp4_rows + (row * kCols + column) / 2, h);
    return bf16_half(bf16_rows + row * kCols + column, h);
}

// R x T pairs over kCols columns, 16 at a time; Halves = 2: both halves of every pair at once, Halves = 1: a pass
// per half. Accumulators from and back to memory per pass, as a blocked product's.
template <bool kMxfp4, int R, int T, int Halves>
__attribute__((noinline)) double widened_tile(size_t calls) {
    for (size_t c = 0; c < calls; ++c)
        for (int pass = 0; pass < 2 / Halves; ++pass) {
            V acc[R * T][Halves];  // pair r * T + t
#pragma GCC unroll 32
            for (int k = 0; k < R * T * Halves; ++k) acc[k / Halves][k % Halves] = load(pairs + k * N);
            for (int i = 0; i < kCols; i += 16) {
                V wv[R][Halves];
#pragma GCC unroll 8
                for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
                    for (int h = 0; h < Halves; ++h) wv[r][h] = widen<kMxfp4>(r, i, Halves == 2 ? h : pass);
#pragma GCC unroll 16
                for (int t = 0; t < T; ++t)
#pragma GCC unroll 2
                    for (int h = 0; h < Halves; ++h) {
                        V xv = load(x_rows + t * kCols + i + 8 * (Halves == 2 ? h : pass));
                        __asm__("" : "+v"(xv));  // x loaded once for the tile's rows, as above
#pragma GCC unroll 8
                        for (int r = 0; r < R; ++r) acc[r * T + t][h] = fma(wv[r][h], xv, acc[r * T + t][h]);
                    }
            }
#pragma GCC unroll 32
            for (int k = 0; k < R * T * Halves; ++k) store(pairs + k * N, acc[k / Halves][k % Halves]);
        }
    return static_cast<double>(calls) * R * T * kCols;
}
#endif

double* base;  // 8 rows, 8 tokens and the accumulators, 64-byte aligned

double probe_rate() {
    double macs = 0;
    const double s = best_seconds([&] { macs = probe(4'000'000, base + 16 * kSteps * N); });
    return macs / s;
}

void report(const char* what, double macs, double seconds) {
    const double probe = probe_rate(), rate = macs / seconds;  // the probe again beside each line: a noisy host
    std::printf("  %-32s %6.1f G/s  %5.1f %% of the probe (%.1f G/s)\n", what, rate / 1e9, 100 * rate / probe,
                probe / 1e9);
}

template <int R, int T>
void report_tile() {
    const size_t calls = 400'000 / (R * T);
    const double* w = base;
    const double* x = base + 8 * kSteps * N;
    double macs = 0;
    const double s = best_seconds([&] { macs = tile<R, T>(w, x, calls, base + 16 * kSteps * N); });
    char name[64];
    std::snprintf(name, sizeof name, "tile %d rows x %d tokens, L1", R, T);
    report(name, macs, s);
}

#if WIDTH == 512
template <bool kMxfp4, int R, int T, int Halves>
void report_widened() {
    const size_t calls = 1'600'000 / (R * T * 16);
    double macs = 0;
    const double s = best_seconds([&] { macs = widened_tile<kMxfp4, R, T, Halves>(calls); });
    char name[64];
    std::snprintf(name, sizeof name, "%s %s %d x %d, L1", kMxfp4 ? "mxfp4" : "bf16", Halves == 2 ? "16 lanes" : "half",
                  R, T);
    report(name, macs, s);
}
#endif

}  // namespace

int main() {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports(kFeature)) {
        std::printf("%s: this CPU lacks %s, nothing to measure\n", kName, kFeature);
        return 0;
    }
    std::vector<double> store(17 * kSteps * N + 64, 0.0);
    base = store.data() + (64 - reinterpret_cast<uintptr_t>(store.data()) % 64) % 64 / sizeof(double);
    std::printf("%s, one thread, G double multiply-adds per second\n", kName);
    double macs = 0;
    double s = best_seconds([&] { macs = probe(4'000'000, base); });
    report("probe (register operands)", macs, s);
    s = best_seconds([&] { macs = fma_load<12>(base, 4'000'000, base + 16 * kSteps * N); });
    report("FMA + one L1 load each", macs, s);
#if WIDTH == 512
    report_tile<3, 4>();
    report_tile<4, 6>();
    report_tile<5, 5>();
    report_tile<6, 4>();
    std::printf("widened in the tile, as native/avx512.cpp does (the kernels' tiles first)\n");
    report_widened<false, 3, 4, 2>();
    report_widened<false, 4, 6, 1>();
    report_widened<false, 3, 8, 1>();
    report_widened<true, 2, 4, 2>();
    report_widened<true, 3, 6, 1>();
    report_widened<true, 2, 12, 1>();
#else
    report_tile<2, 4>();
    report_tile<3, 4>();
    report_tile<2, 6>();
#endif
    return 0;
}
