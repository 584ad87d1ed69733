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
#else
    report_tile<2, 4>();
    report_tile<3, 4>();
    report_tile<2, 6>();
#endif
    return 0;
}
