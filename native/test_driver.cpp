// Standalone exactness check of the matrix kernels, KDA's row kernels and attention's products (no Python, no
// pybind11): every backend compiled in must give the scalar backend's bytes for every input.
//
// Build (see native/neon-check.sh): common.cpp + scalar.cpp + this file, plus neon.cpp with
// -DK3_HAVE_NEON on aarch64, or avx2.cpp / avx512.cpp with -DK3_HAVE_AVX2 / -DK3_HAVE_AVX512 on x86-64
// (those also need cpu_features.cpp; a backend the CPU lacks is skipped). With no SIMD backend compiled
// in, scalar is compared with itself, a determinism sanity check.
//
// Inputs come from a fixed-seed PRNG: widths that are not multiples of any SIMD width, several row and
// token counts, and data kinds that reach every special case (+-inf, NaN and signalling NaN, f32, bf16 and
// f16 subnormals, huge values that overflow float32 on the way out, cancellation, MXFP4 scale bytes
// 0/1/254/255; the draft trunk's int8 rows and int4 groups with scales 0, subnormal, huge, inf and NaN,
// int8 code -128, and int4 padding nibbles that must stay unread under an infinite or NaN scale). Each case
// also counts how many of its outputs would change under a wrong summation order, so a pass means
// something. One line per case, a summary, exit status 1 on any mismatch.
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <algorithm>
#include <vector>

#include "kernels.h"

#if defined(K3_HAVE_AVX2) || defined(K3_HAVE_AVX512)
#include "cpu_features.h"
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace {

using k3::MatrixKernels;
using k3::WeightType;

// ---- deterministic random numbers ---------------------------------------------------------------------

struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed) {}
    uint64_t next() {  // splitmix64
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    uint32_t below(uint32_t n) { return static_cast<uint32_t>(next() % n); }
    int range(int lo, int hi) { return lo + static_cast<int>(below(static_cast<uint32_t>(hi - lo + 1))); }
    bool chance(double p) { return (next() >> 11) * (1.0 / 9007199254740992.0) < p; }
};

float f32_bits(uint32_t b) {
    float f;
    std::memcpy(&f, &b, sizeof f);
    return f;
}
uint32_t bits_f32(float f) {
    uint32_t b;
    std::memcpy(&b, &f, sizeof b);
    return b;
}

// A float32 with a random sign and mantissa and an unbiased exponent in [elo, ehi] (clamped to the
// normal range; an exponent below -126 gives a subnormal of about that size).
float f32_random(Rng& r, int elo, int ehi) {
    const int e = r.range(elo, ehi);
    const uint32_t sign = static_cast<uint32_t>(r.below(2)) << 31;
    const uint32_t mant = static_cast<uint32_t>(r.next()) & 0x7FFFFF;
    if (e < -126) {  // subnormal: keep the top (149 + e) mantissa bits
        const int keep = 149 + e;
        const uint32_t m = keep <= 0 ? 1u : ((mant | 0x800000u) >> (24 - keep));
        return f32_bits(sign | (m & 0x7FFFFF ? m & 0x7FFFFF : 1u));
    }
    const int be = e > 127 ? 254 : e + 127;
    return f32_bits(sign | (static_cast<uint32_t>(be) << 23) | mant);
}

const uint32_t kF32Specials[] = {0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u, 0x7F800001u /*sNaN*/,
                                 0x7FA5A5A5u /*sNaN payload*/, 0x00000001u, 0x80000001u, 0x007FFFFFu,
                                 0x00400000u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x00800000u, 0x80000000u, 0x00000000u};
const uint16_t kBf16Specials[] = {0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81 /*sNaN*/, 0x0001, 0x8001, 0x007F,
                                  0x0040, 0x7F7F, 0xFF7F, 0x0080, 0x8000, 0x0000};
const uint16_t kF16Specials[] = {0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01 /*sNaN*/, 0x7D55, 0x0001, 0x8001,
                                 0x03FF, 0x0200, 0x7BFF, 0xFBFF, 0x0400, 0x8000, 0x0000};

template <typename T, size_t N>
T pick(Rng& r, const T (&a)[N]) {
    return a[r.below(N)];
}

// The data kinds. Exponent ranges are chosen so that products and sums round (order matters), reach
// float32 subnormal results, or overflow float32 on the way out.
enum class Kind { Random, Cancel, Subnormal, Huge, Specials, Count };
const char* kind_name(Kind k) {
    switch (k) {
        case Kind::Random: return "random";
        case Kind::Cancel: return "cancel";
        case Kind::Subnormal: return "subnormal";
        case Kind::Huge: return "huge";
        case Kind::Specials: return "specials";
        default: return "?";
    }
}

float x_value(Rng& r, Kind k) {
    switch (k) {
        case Kind::Random: return f32_random(r, -24, 24);
        case Kind::Cancel: return f32_random(r, -2, 2);  // big paired values are overlaid (add_cancelling_pairs)
        case Kind::Subnormal:
            return r.chance(0.6) ? f32_random(r, -149, -127) : f32_random(r, -126, -100);
        case Kind::Huge: return f32_random(r, 40, 64);
        case Kind::Specials: return r.chance(0.03) ? f32_bits(pick(r, kF32Specials)) : f32_random(r, -30, 30);
        default: return 0.0f;
    }
}

// Weight bits of each type for a kind: F32 as float bits, BF16 as the top half of a float, F16 encoded
// directly (exponent field 0 = subnormal, 31 = inf/NaN).
uint16_t f16_random(Rng& r, int elo, int ehi) {  // ehi <= 15, elo >= -24
    const uint16_t sign = static_cast<uint16_t>(r.below(2) << 15);
    const int e = r.range(elo, ehi);
    const uint16_t mant = static_cast<uint16_t>(r.next() & 0x3FF);
    if (e < -14) {  // subnormal of about 2^e
        const int keep = 24 + e;  // 0..9 significant bits
        uint16_t m = static_cast<uint16_t>((mant | 0x400) >> (11 - keep));
        if (m == 0) m = 1;
        return static_cast<uint16_t>(sign | (m & 0x3FF ? m & 0x3FF : 1));
    }
    return static_cast<uint16_t>(sign | ((e + 15) << 10) | mant);
}

uint32_t w_bits(Rng& r, Kind k, WeightType t) {
    if (t == WeightType::F16) {
        switch (k) {
            case Kind::Random: return f16_random(r, -14, 15);
            case Kind::Cancel: return f16_random(r, -2, 2);
            case Kind::Subnormal: return r.chance(0.7) ? f16_random(r, -24, -15) : f16_random(r, -14, -8);
            case Kind::Huge: return f16_random(r, 10, 15);
            case Kind::Specials: return r.chance(0.03) ? pick(r, kF16Specials) : f16_random(r, -24, 15);
            default: return 0;
        }
    }
    uint32_t b;
    switch (k) {
        case Kind::Random: b = bits_f32(f32_random(r, -24, 24)); break;
        case Kind::Cancel: b = bits_f32(f32_random(r, -2, 2)); break;
        case Kind::Subnormal: b = bits_f32(r.chance(0.6) ? f32_random(r, -149, -127) : f32_random(r, -30, 0)); break;
        case Kind::Huge: b = bits_f32(f32_random(r, 40, 64)); break;
        case Kind::Specials:
            if (r.chance(0.03))
                return t == WeightType::BF16 ? pick(r, kBf16Specials) : pick(r, kF32Specials);
            b = bits_f32(f32_random(r, -30, 30));
            break;
        default: b = 0;
    }
    if (t == WeightType::BF16) {
        uint32_t h = b >> 16;
        if ((h & 0x7FFF) == 0 && (b & 0x7FFFFFFF)) h |= 1;  // keep a subnormal a subnormal
        return h;
    }
    return b;
}

uint8_t scale_byte(Rng& r, Kind k) {
    static const uint8_t kEdge[] = {0, 1, 254, 255};
    switch (k) {
        case Kind::Random: return static_cast<uint8_t>(r.range(112, 142));
        case Kind::Cancel: return static_cast<uint8_t>(r.chance(0.5) ? r.range(125, 129) : r.range(145, 150));
        case Kind::Subnormal: return r.chance(0.5) ? pick(r, kEdge) : static_cast<uint8_t>(r.range(0, 40));
        case Kind::Huge: return r.chance(0.5) ? pick(r, kEdge) : static_cast<uint8_t>(r.range(220, 255));
        case Kind::Specials: return r.chance(0.3) ? pick(r, kEdge) : static_cast<uint8_t>(r.range(100, 154));
        default: return 127;
    }
}

// x for an MXFP4 case: scale 0 or 1 with subnormal x, 254 with huge x, 255 with inf (0 * inf = NaN).
float mx_x_value(Rng& r, Kind k) {
    switch (k) {
        case Kind::Subnormal: return r.chance(0.5) ? f32_random(r, -149, -127) : f32_random(r, -126, -90);
        case Kind::Huge: return f32_random(r, -10, 30);
        default: return x_value(r, k);
    }
}

// Cancellation that survives the rounding to float32: pairs of positions (p, q) whose products are
// exactly opposite (w_q = -w_p, x_q = x_p, both big) among small terms. Their exact sum is the small
// terms' sum, but each partial sum in a lane absorbs small terms according to the order, so a wrong
// order changes the float32 result. Pairs are drawn within blocks of `block` positions (an MXFP4 group
// keeps one scale); they are the same for every row and token of a case.
std::vector<std::pair<size_t, size_t>> cancelling_pairs(Rng& r, size_t in, size_t block) {
    std::vector<std::pair<size_t, size_t>> pairs;
    for (size_t b0 = 0; b0 < in; b0 += block) {
        const size_t n = std::min(block, in - b0);
        std::vector<size_t> pos(n);
        for (size_t i = 0; i < n; ++i) pos[i] = b0 + i;
        for (size_t i = n; i > 1; --i) std::swap(pos[i - 1], pos[r.below(static_cast<uint32_t>(i))]);
        for (size_t i = 0; i + 1 < n && i < n * 3 / 5; i += 2) pairs.emplace_back(pos[i], pos[i + 1]);
    }
    return pairs;
}

// Big weight bits for a pair's first member (the second gets the sign flipped).
uint32_t big_w_bits(Rng& r, WeightType t) {
    if (t == WeightType::F16) return f16_random(r, 8, 15);
    const uint32_t b = bits_f32(f32_random(r, 20, 34));
    return t == WeightType::BF16 ? b >> 16 : b;
}

// ---- reference dots with other orders: how order-sensitive is each case's data? ---------------------

// lanes = 16 is the contract; lanes = 1 is a plain sequential sum; lanes = 8 is the order of a backend
// that keeps 8 accumulators (fold 4, 2, 1: the unused lanes stay +0.0, and adding +0.0 to a sum that
// started at +0.0 changes no bit). Note that some wrong-looking mappings are NOT different orders:
// element i into lane (i + c) mod 16, or into lane i XOR c, only relabels the leaves of the fold tree
// (8, 4, 2, 1 pairs lanes by their low bits, and addition is commutative), so it gives identical bits.
float other_order_dot(const double* w, const float* x, size_t n, int lanes, double scale) {
    double acc[k3::kLanes] = {0.0};
    for (size_t i = 0; i < n; ++i) acc[i % lanes] += w[i] * static_cast<double>(x[i]);
    return k3::to_f32(scale * k3::lane_combine(acc));
}

// ---- backends -------------------------------------------------------------------------------------------

std::vector<const MatrixKernels*> backends_under_test() {
    std::vector<const MatrixKernels*> b;
#if defined(K3_HAVE_AVX2) || defined(K3_HAVE_AVX512)
    const k3::CpuFeatures f = k3::detect_cpu_features();
#endif
#if defined(K3_HAVE_AVX512) && defined(K3_AVX512_EMULATED)  // native/avx512-check.sh: any x86-64 CPU runs it
    b.push_back(&k3::kAvx512);
    (void)f;
#elif defined(K3_HAVE_AVX512)
    if (f.avx512f && f.avx512bw && f.avx512vl) b.push_back(&k3::kAvx512);
    else std::printf("note: avx512 compiled in but this CPU lacks AVX-512 F/BW/VL: skipped\n");
#endif
#if defined(K3_HAVE_AVX2)
    if (f.avx2 && f.fma) b.push_back(&k3::kAvx2);
    else std::printf("note: avx2 compiled in but this CPU lacks AVX2/FMA: skipped\n");
#endif
#if defined(K3_HAVE_NEON)
    b.push_back(&k3::kNeon);
#endif
    if (b.empty()) b.push_back(&k3::kScalar);  // determinism sanity: scalar against itself
    return b;
}

// The floating-point environment the contract needs: round to nearest, no flush-to-zero.
bool check_fp_environment() {
    bool ok = true;
#if defined(__aarch64__)
    uint64_t fpcr;
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
    const bool fz = (fpcr >> 24) & 1, fz16 = (fpcr >> 19) & 1, dn = (fpcr >> 25) & 1;
    const unsigned rmode = (fpcr >> 22) & 3;
    std::printf("fp environment: aarch64 FPCR=0x%08" PRIx64 " (FZ=%d FZ16=%d DN=%d RMode=%u)\n", fpcr, fz, fz16,
                dn, rmode);
    ok = !fz && !fz16 && rmode == 0;
#elif defined(__x86_64__) || defined(__i386__)
    const unsigned csr = _mm_getcsr();
    const bool ftz = (csr >> 15) & 1, daz = (csr >> 6) & 1;
    const unsigned rc = (csr >> 13) & 3;
    std::printf("fp environment: x86 MXCSR=0x%04x (FTZ=%d DAZ=%d RC=%u)\n", csr, ftz, daz, rc);
    ok = !ftz && !daz && rc == 0;
#endif
    volatile float tiny = f32_bits(1u);  // the smallest subnormal must survive a round trip via double
    volatile double wide = tiny;
    if (wide == 0.0 || bits_f32(static_cast<float>(wide)) != 1u) ok = false;
    if (!ok) std::printf("FAIL: flush-to-zero or a non-default rounding mode is on; the contract needs neither\n");
    return ok;
}

// ---- one case -------------------------------------------------------------------------------------------

struct Totals {
    int passed = 0, failed = 0;
    long outputs = 0, nan = 0, inf = 0, subnormal = 0, zero = 0, seq_differs = 0, eight_differs = 0;
    uint64_t digest = 0xCBF29CE484222325ull;  // FNV-1a over every scalar output byte, in case order
};

const uint32_t kSentinel = 0x7FBADBADu;  // a signalling-NaN pattern no kernel ever writes

using Run = void (*)(const MatrixKernels&, const void* ctx, float* y, size_t r0, size_t r1);

struct Case {
    std::string label;
    size_t in, rows, tokens;
    const void* ctx;
    Run run;
    const double* wide;  // rows x in widened weights, for the order-sensitivity count
    const float* x;
    const float* row_scale = nullptr;  // int8: each row's sum is then multiplied by its scale
};

// First difference between two output buffers, or -1.
long first_difference(const std::vector<float>& a, const std::vector<float>& b) {
    for (size_t i = 0; i < a.size(); ++i)
        if (bits_f32(a[i]) != bits_f32(b[i])) return static_cast<long>(i);
    return -1;
}

bool check_case(const Case& c, const std::vector<const MatrixKernels*>& backends, Totals& tot) {
    const size_t n = c.tokens * c.rows;
    std::vector<float> want(n, f32_bits(kSentinel));
    c.run(k3::kScalar, c.ctx, want.data(), 0, c.rows);

    // What the data exercises: special outputs and order sensitivity (against the scalar result).
    long nan = 0, inf = 0, sub = 0, zero = 0, seq = 0, eight = 0;
    for (size_t t = 0; t < c.tokens; ++t)
        for (size_t o = 0; o < c.rows; ++o) {
            const float v = want[t * c.rows + o];
            if (std::isnan(v)) ++nan;
            else if (std::isinf(v)) ++inf;
            else if (v == 0.0f) ++zero;
            else if (std::fpclassify(v) == FP_SUBNORMAL) ++sub;
            const double* w = c.wide + o * c.in;
            const float* x = c.x + t * c.in;
            const uint32_t b = bits_f32(v);
            const double scale = c.row_scale ? static_cast<double>(c.row_scale[o]) : 1.0;
            if (bits_f32(other_order_dot(w, x, c.in, 1, scale)) != b) ++seq;
            if (bits_f32(other_order_dot(w, x, c.in, 8, scale)) != b) ++eight;
        }
    tot.outputs += static_cast<long>(n), tot.nan += nan, tot.inf += inf, tot.subnormal += sub, tot.zero += zero;
    tot.seq_differs += seq, tot.eight_differs += eight;
    for (float v : want) {
        const uint32_t b = bits_f32(v);
        for (int s = 0; s < 32; s += 8) tot.digest = (tot.digest ^ ((b >> s) & 0xFF)) * 0x100000001B3ull;
    }

    bool all_ok = true;
    for (const MatrixKernels* b : backends) {
        std::string why;
        // (a) all rows in one call
        std::vector<float> got(n, f32_bits(kSentinel));
        c.run(*b, c.ctx, got.data(), 0, c.rows);
        long d = first_difference(got, want);
        if (d >= 0) why = "all rows";
        // (b) rows split over three calls, as threads would
        if (why.empty()) {
            std::fill(got.begin(), got.end(), f32_bits(kSentinel));
            const size_t a = c.rows / 3, e = c.rows - c.rows / 4;
            c.run(*b, c.ctx, got.data(), 0, a);
            c.run(*b, c.ctx, got.data(), a, e);
            c.run(*b, c.ctx, got.data(), e, c.rows);
            d = first_difference(got, want);
            if (d >= 0) why = "rows split";
        }
        // (c) an inner row range writes those rows only
        if (why.empty() && c.rows >= 3) {
            std::fill(got.begin(), got.end(), f32_bits(kSentinel));
            c.run(*b, c.ctx, got.data(), 1, c.rows - 1);
            std::vector<float> expect(want);
            for (size_t t = 0; t < c.tokens; ++t) {
                expect[t * c.rows] = f32_bits(kSentinel);
                expect[t * c.rows + c.rows - 1] = f32_bits(kSentinel);
            }
            d = first_difference(got, expect);
            if (d >= 0) why = "inner rows";
        }
        const bool ok = why.empty();
        all_ok = all_ok && ok;
        std::printf("%s %-6s %s nan=%ld inf=%ld subnormal=%ld zero=%ld of %zu; other orders differ: "
                    "sequential %ld, 8 lanes %ld\n",
                    ok ? "PASS" : "FAIL", b->name, c.label.c_str(), nan, inf, sub, zero, n, seq, eight);
        if (!ok) {
            const size_t t = static_cast<size_t>(d) / c.rows, o = static_cast<size_t>(d) % c.rows;
            std::printf("     first mismatch (%s): token %zu row %zu: scalar 0x%08x, %s 0x%08x\n", why.c_str(), t,
                        o, bits_f32(want[static_cast<size_t>(d)]), b->name,
                        bits_f32(got[static_cast<size_t>(d)]));
        }
        (ok ? tot.passed : tot.failed)++;
    }
    return all_ok;
}

// ---- linear (BF16 / F16 / F32) ------------------------------------------------------------------------

struct LinearCtx {
    WeightType type;
    std::vector<uint16_t> w16;
    std::vector<float> w32;
    size_t in, rows, tokens;
    std::vector<float> x;
};

void run_linear(const MatrixKernels& k, const void* p, float* y, size_t r0, size_t r1) {
    const LinearCtx& c = *static_cast<const LinearCtx*>(p);
    const void* w = c.type == WeightType::F32 ? static_cast<const void*>(c.w32.data())
                                              : static_cast<const void*>(c.w16.data());
    k.linear(c.type, w, c.in, c.x.data(), c.tokens, y, c.rows, r0, r1);
}

const char* type_name(WeightType t) {
    return t == WeightType::BF16 ? "BF16" : t == WeightType::F16 ? "F16" : "F32";
}

// ---- MXFP4 ------------------------------------------------------------------------------------------------

struct MxCtx {
    std::vector<uint8_t> packed, scale;
    size_t in, rows, tokens;
    std::vector<float> x;
};

void run_mxfp4(const MatrixKernels& k, const void* p, float* y, size_t r0, size_t r1) {
    const MxCtx& c = *static_cast<const MxCtx*>(p);
    k.mxfp4(c.packed.data(), c.scale.data(), c.in, c.x.data(), c.tokens, y, c.rows, r0, r1);
}

// ---- the draft trunk's int8 rows and int4 groups ------------------------------------------------------------

// A float32 scale for a kind: 0, subnormal, huge, inf and NaN among them where the kind asks. Subnormal scales
// with x near 1 give subnormal and zero results; huge ones with x near 1 overflow float32 on the way out, or not.
float draft_scale(Rng& r, Kind k) {
    switch (k) {
        case Kind::Random: return std::fabs(f32_random(r, -12, 0));
        case Kind::Cancel: return std::fabs(f32_random(r, -2, 2));
        case Kind::Subnormal: return r.chance(0.1) ? 0.0f : std::fabs(f32_random(r, -149, -120));
        case Kind::Huge: return std::fabs(f32_random(r, 70, 127));
        case Kind::Specials: return r.chance(0.1) ? f32_bits(pick(r, kF32Specials)) : f32_random(r, -20, 5);
        default: return 1.0f;
    }
}

float draft_x(Rng& r, Kind k) {
    switch (k) {
        case Kind::Subnormal: return r.chance(0.3) ? x_value(r, k) : f32_random(r, -8, 8);
        case Kind::Huge: return r.chance(0.02) ? x_value(r, k) : f32_random(r, -30, 8);
        default: return x_value(r, k);
    }
}

struct Int8Ctx {
    std::vector<int8_t> codes;
    std::vector<float> scale;
    size_t in, rows, tokens;
    std::vector<float> x;
};

void run_int8(const MatrixKernels& k, const void* p, float* y, size_t r0, size_t r1) {
    const Int8Ctx& c = *static_cast<const Int8Ctx*>(p);
    k.int8_rows(c.codes.data(), c.scale.data(), c.in, c.x.data(), c.tokens, y, c.rows, r0, r1);
}

struct Int4Ctx {
    std::vector<uint8_t> packed;  // rows x G * 16, the padding's nibbles random too
    std::vector<float> scale;     // rows x G
    size_t in, rows, tokens;
    std::vector<float> x;
};

void run_int4(const MatrixKernels& k, const void* p, float* y, size_t r0, size_t r1) {
    const Int4Ctx& c = *static_cast<const Int4Ctx*>(p);
    k.int4_groups(c.packed.data(), c.scale.data(), c.in, c.x.data(), c.tokens, y, c.rows, r0, r1);
}

void draft_cases(Rng& rng, const std::vector<const MatrixKernels*>& backends, Totals& tot) {
    const size_t kDraftIn[] = {0, 1, 15, 17, 31, 32, 33, 100, 257, 600};
    const size_t kRows[] = {1, 3, 17};
    const size_t kTokens[] = {1, 2, 3, 5, 64};
    for (int k = 0; k < static_cast<int>(Kind::Count); ++k)
        for (size_t in : kDraftIn)
            for (size_t rows : kRows)
                for (size_t tokens : kTokens) {
                    const Kind kind = static_cast<Kind>(k);
                    Int8Ctx c;
                    c.in = in, c.rows = rows, c.tokens = tokens;
                    for (size_t i = 0; i < rows * in; ++i)
                        c.codes.push_back(static_cast<int8_t>(
                            kind == Kind::Specials && rng.chance(0.05) ? -128 : rng.range(-127, 127)));
                    for (size_t o = 0; o < rows; ++o) c.scale.push_back(draft_scale(rng, kind));
                    for (size_t i = 0; i < tokens * in; ++i) c.x.push_back(draft_x(rng, kind));
                    if (kind == Kind::Cancel)  // opposite codes, equal big x
                        for (const auto& pq : cancelling_pairs(rng, in, in)) {
                            for (size_t o = 0; o < rows; ++o) {
                                const int8_t code = static_cast<int8_t>(rng.range(1, 127));
                                c.codes[o * in + pq.first] = code;
                                c.codes[o * in + pq.second] = static_cast<int8_t>(-code);
                            }
                            for (size_t t = 0; t < tokens; ++t)
                                c.x[t * in + pq.first] = c.x[t * in + pq.second] = f32_random(rng, 16, 30);
                        }
                    std::vector<double> wide(c.codes.begin(), c.codes.end());
                    char label[128];
                    std::snprintf(label, sizeof label, "int8_rows   in=%-4zu rows=%-2zu tokens=%-2zu %-9s", in, rows,
                                  tokens, kind_name(kind));
                    Case cs{label, in, rows, tokens, &c, run_int8, wide.data(), c.x.data()};
                    cs.row_scale = c.scale.data();
                    check_case(cs, backends, tot);
                }
    for (int k = 0; k < static_cast<int>(Kind::Count); ++k)
        for (size_t in : kDraftIn)
            for (size_t rows : kRows)
                for (size_t tokens : kTokens) {
                    const Kind kind = static_cast<Kind>(k);
                    Int4Ctx c;
                    c.in = in, c.rows = rows, c.tokens = tokens;
                    const size_t groups = k3::int4_groups_of(in), row_bytes = groups * k3::kGroup / 2;
                    for (size_t i = 0; i < rows * row_bytes; ++i) c.packed.push_back(static_cast<uint8_t>(rng.next()));
                    for (size_t i = 0; i < rows * groups; ++i) c.scale.push_back(draft_scale(rng, kind));
                    if (kind == Kind::Specials)  // a padded group's scale is inf or NaN: its padding must stay unread
                        for (size_t o = 0; o < rows && in % k3::kGroup; ++o)
                            c.scale[o * groups + groups - 1] = f32_bits(rng.chance(0.5) ? 0x7F800000u : 0x7FC00000u);
                    for (size_t i = 0; i < tokens * in; ++i) c.x.push_back(draft_x(rng, kind));
                    if (kind == Kind::Cancel)  // opposite codes (nibbles n and 16 - n) in one group, equal big x
                        for (const auto& pq : cancelling_pairs(rng, in, k3::kGroup)) {
                            for (size_t o = 0; o < rows; ++o) {
                                const uint8_t n = static_cast<uint8_t>(rng.range(1, 15));
                                const uint8_t nibbles[2] = {n, static_cast<uint8_t>(16 - n)};
                                const size_t ps[2] = {pq.first, pq.second};
                                for (int m = 0; m < 2; ++m) {
                                    uint8_t& byte = c.packed[o * row_bytes + ps[m] / 2];
                                    byte = ps[m] % 2 == 0 ? static_cast<uint8_t>((byte & 0xF0) | nibbles[m])
                                                          : static_cast<uint8_t>((byte & 0x0F) | (nibbles[m] << 4));
                                }
                            }
                            for (size_t t = 0; t < tokens; ++t)
                                c.x[t * in + pq.first] = c.x[t * in + pq.second] = f32_random(rng, 8, 24);
                        }
                    std::vector<double> wide(rows * in);  // the contract's decode, written out again here
                    for (size_t o = 0; o < rows; ++o)
                        for (size_t i = 0; i < in; ++i) {
                            const uint8_t byte = c.packed[o * row_bytes + i / 2];
                            const int code = (i % 2 == 0 ? (byte & 0x0F) : (byte >> 4)) - 8;
                            wide[o * in + i] = code * static_cast<double>(c.scale[o * groups + i / k3::kGroup]);
                        }
                    char label[128];
                    std::snprintf(label, sizeof label, "int4_groups in=%-4zu rows=%-2zu tokens=%-2zu %-9s", in, rows,
                                  tokens, kind_name(kind));
                    check_case({label, in, rows, tokens, &c, run_int4, wide.data(), c.x.data()}, backends, tot);
                }
}

// ---- KDA's state rows -----------------------------------------------------------------------------------

// A lane double's bytes for comparison: every NaN one pattern (lanes are sums inside the recurrence, whose NaN
// payloads depend on operand order; each reaches the output only through to_f32, which makes it canonical).
uint64_t lane_bits(double v) {
    if (std::isnan(v)) return 0x7FF8000000000000ull;
    uint64_t b;
    std::memcpy(&b, &v, sizeof b);
    return b;
}

long first_lane_difference(const std::vector<double>& a, const std::vector<double>& b) {
    for (size_t i = 0; i < a.size(); ++i)
        if (lane_bits(a[i]) != lane_bits(b[i])) return static_cast<long>(i);
    return -1;
}

struct KdaRow {
    std::vector<float> s;
    std::vector<double> lane, delta;
    double a, k, q;
};

// Both row kernels on one row, each from the same s and lane: the decayed row into one lane, then the updated row
// (s in place) into another. Compared with the scalar backend's bytes, lanes with every NaN alike.
void check_kda_row(const std::string& label, const KdaRow& row, const std::vector<const MatrixKernels*>& backends,
                   Totals& tot) {
    const size_t d = row.s.size();
    auto run = [&](const MatrixKernels& b, std::vector<float>& s, std::vector<double>& decayed,
                   std::vector<double>& updated) {
        s = row.s, decayed = row.lane, updated = row.lane;
        b.kda_decay_row(s.data(), d, row.a, row.k, decayed.data());
        b.kda_update_row(s.data(), d, row.a, row.k, row.delta.data(), row.q, updated.data());
    };
    std::vector<float> want_s;
    std::vector<double> want_decayed, want_updated;
    run(k3::kScalar, want_s, want_decayed, want_updated);
    long nan = 0, inf = 0, sub = 0;
    for (float v : want_s) {
        nan += std::isnan(v), inf += std::isinf(v), sub += std::fpclassify(v) == FP_SUBNORMAL;
        const uint32_t b = bits_f32(v);
        for (int sh = 0; sh < 32; sh += 8) tot.digest = (tot.digest ^ ((b >> sh) & 0xFF)) * 0x100000001B3ull;
    }
    for (const auto* lanes : {&want_decayed, &want_updated})
        for (double v : *lanes) {
            const uint64_t b = lane_bits(v);
            for (int sh = 0; sh < 64; sh += 8) tot.digest = (tot.digest ^ ((b >> sh) & 0xFF)) * 0x100000001B3ull;
        }
    for (const MatrixKernels* b : backends) {
        std::vector<float> got_s;
        std::vector<double> got_decayed, got_updated;
        run(*b, got_s, got_decayed, got_updated);
        const long ds = first_difference(got_s, want_s), dd = first_lane_difference(got_decayed, want_decayed),
                   du = first_lane_difference(got_updated, want_updated);
        const bool ok = ds < 0 && dd < 0 && du < 0;
        std::printf("%s %-6s %s state nan=%ld inf=%ld subnormal=%ld of %zu\n", ok ? "PASS" : "FAIL", b->name,
                    label.c_str(), nan, inf, sub, d);
        if (!ok)
            std::printf("     first mismatch: %s column %ld\n",
                        ds >= 0 ? "updated state" : dd >= 0 ? "decayed lane" : "updated lane",
                        ds >= 0 ? ds : dd >= 0 ? dd : du);
        (ok ? tot.passed : tot.failed)++;
    }
}

// Widths that are not multiples of any SIMD width, every data kind; then rows where an FMA shows: s·a + k·delta
// at 1 + 2^-24 + 2^-53 (a float32 tie) once k·delta is rounded, just above it when it is not (a fused multiply-add),
// so the float32 state comes out 1 instead of 1 + 2^-23.
void kda_row_cases(Rng& rng, const std::vector<const MatrixKernels*>& backends, Totals& tot) {
    const size_t kWidths[] = {0, 1, 3, 4, 7, 8, 9, 15, 16, 17, 31, 37, 100, 128, 131};
    char label[128];
    for (int kk = 0; kk < static_cast<int>(Kind::Count); ++kk)
        for (size_t d : kWidths) {
            const Kind kind = static_cast<Kind>(kk);
            KdaRow row;
            for (size_t j = 0; j < d; ++j) {
                row.s.push_back(x_value(rng, kind));
                row.lane.push_back(static_cast<double>(x_value(rng, kind)) * x_value(rng, Kind::Random));
                row.delta.push_back(static_cast<double>(x_value(rng, kind)) * x_value(rng, Kind::Random) / 3);
            }
            row.a = std::exp(-std::fabs(static_cast<double>(x_value(rng, Kind::Cancel))));
            row.k = x_value(rng, kind), row.q = static_cast<double>(x_value(rng, kind)) * 0.0883883476483184;
            std::snprintf(label, sizeof label, "kda rows    d=%-4zu %-9s", d, kind_name(kind));
            check_kda_row(label, row, backends, tot);
        }
    for (size_t d : kWidths) {
        KdaRow row{std::vector<float>(d, 1.0f), std::vector<double>(d, 0.0), std::vector<double>(d), 1 + 0x1p-24, 3.0,
                   0.5};
        for (size_t j = 0; j < d; ++j) row.delta[j] = 0x1.5555555555556p-55;  // 3 x this: 2^-53 (1 + 2^-52)
        std::snprintf(label, sizeof label, "kda rows    d=%-4zu fma trap ", d);
        check_kda_row(label, row, backends, tot);
    }
}

// ---- attention's products: dots_f64 and column_dots ------------------------------------------------------------

// One double output array per backend against the scalar backend's (every NaN alike, as for the KDA lanes).
void check_doubles(const std::string& label, const std::vector<const MatrixKernels*>& backends, Totals& tot,
                   const std::function<void(const MatrixKernels&, std::vector<double>&)>& run) {
    std::vector<double> want;
    run(k3::kScalar, want);
    long nan = 0, inf = 0;
    for (double v : want) {
        nan += std::isnan(v), inf += std::isinf(v);
        const uint64_t b = lane_bits(v);
        for (int sh = 0; sh < 64; sh += 8) tot.digest = (tot.digest ^ ((b >> sh) & 0xFF)) * 0x100000001B3ull;
    }
    for (const MatrixKernels* b : backends) {
        std::vector<double> got;
        run(*b, got);
        const long d = first_lane_difference(got, want);
        std::printf("%s %-6s %s nan=%ld inf=%ld of %zu\n", d < 0 ? "PASS" : "FAIL", b->name, label.c_str(), nan, inf,
                    want.size());
        if (d >= 0) std::printf("     first mismatch: output %ld\n", d);
        (d < 0 ? tot.passed : tot.failed)++;
    }
}

// Scores (dots_f64: keys x queries, all rows and an inner range) and values (column_dots: softmax-like weights in
// double) on widths and counts that are not multiples of any SIMD width or tile.
void attention_cases(Rng& rng, const std::vector<const MatrixKernels*>& backends, Totals& tot) {
    const size_t kIn[] = {1, 15, 17, 41, 100};
    const size_t kCols[] = {1, 7, 9, 37, 64, 100};
    const size_t kRows[] = {1, 5, 17, 40};
    const size_t kTokens[] = {1, 3, 6};
    char label[128];
    for (int kk = 0; kk < static_cast<int>(Kind::Count); ++kk) {
        const Kind kind = static_cast<Kind>(kk);
        for (size_t in : kIn)
            for (size_t n : kRows)
                for (size_t tokens : kTokens) {
                    std::vector<float> w(n * in), x(tokens * in);
                    for (float& v : w) v = x_value(rng, kind);
                    for (float& v : x) v = x_value(rng, kind);
                    std::snprintf(label, sizeof label, "dots_f64    in=%-4zu rows=%-2zu tokens=%-2zu %-9s", in, n, tokens,
                                  kind_name(kind));
                    check_doubles(label, backends, tot, [&](const MatrixKernels& b, std::vector<double>& y) {
                        y.assign(tokens * n, 0.0);
                        b.dots_f64(w.data(), in, x.data(), tokens, y.data(), n, 0, n);
                        if (n >= 3) b.dots_f64(w.data(), in, x.data(), tokens, y.data(), n, 1, n - 1);  // the same bits
                    });
                }
        for (size_t d : kCols)
            for (size_t n : kRows)
                for (size_t tokens : kTokens) {
                    std::vector<float> rows(n * d);
                    std::vector<double> x(tokens * n);
                    for (float& v : rows) v = x_value(rng, kind);
                    for (double& v : x) v = static_cast<double>(x_value(rng, kind)) * x_value(rng, Kind::Random) / 3;
                    std::snprintf(label, sizeof label, "column_dots d=%-4zu rows=%-2zu tokens=%-2zu %-9s", d, n, tokens,
                                  kind_name(kind));
                    check_doubles(label, backends, tot, [&](const MatrixKernels& b, std::vector<double>& y) {
                        y.assign(tokens * d, 0.0);
                        b.column_dots(rows.data(), n, d, x.data(), tokens, y.data());
                    });
                }
    }
}

}  // namespace

int main() {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    const std::vector<const MatrixKernels*> backends = backends_under_test();
    std::string names;
    for (const MatrixKernels* b : backends) names += std::string(names.empty() ? "" : ", ") + b->name;
    std::printf("k3 kernel exactness driver: backends under test against scalar: %s%s\n", names.c_str(),
                backends.size() == 1 && backends[0] == &k3::kScalar ? " (no SIMD backend compiled in: self-check)"
                                                                     : "");
    const bool env_ok = check_fp_environment();

    const size_t kLinearIn[] = {0, 1, 3, 15, 16, 17, 33, 100, 257, 600};
    const size_t kMxIn[] = {32, 96, 160, 352, 1056};
    const size_t kRows[] = {1, 3, 17};
    const size_t kTokens[] = {1, 2, 5, 64};
    const WeightType kTypes[] = {WeightType::BF16, WeightType::F16, WeightType::F32};

    Totals tot;
    Rng rng(0x6B33C0DEull);
    for (WeightType type : kTypes)
        for (int k = 0; k < static_cast<int>(Kind::Count); ++k)
            for (size_t in : kLinearIn)
                for (size_t rows : kRows)
                    for (size_t tokens : kTokens) {
                        const Kind kind = static_cast<Kind>(k);
                        LinearCtx c;
                        c.type = type, c.in = in, c.rows = rows, c.tokens = tokens;
                        std::vector<double> wide(rows * in);
                        for (size_t i = 0; i < rows * in; ++i) {
                            const uint32_t b = w_bits(rng, kind, type);
                            if (type == WeightType::F32) {
                                c.w32.push_back(f32_bits(b));
                                wide[i] = f32_bits(b);
                            } else {
                                c.w16.push_back(static_cast<uint16_t>(b));
                                wide[i] = type == WeightType::BF16 ? k3::bf16_to_f64(static_cast<uint16_t>(b))
                                                                   : k3::f16_to_f64(static_cast<uint16_t>(b));
                            }
                        }
                        for (size_t i = 0; i < tokens * in; ++i)
                            c.x.push_back(kind == Kind::Huge && type == WeightType::F16 ? f32_random(rng, 100, 113)
                                                                                       : x_value(rng, kind));
                        if (kind == Kind::Cancel) {
                            const uint32_t sign = type == WeightType::F32 ? 0x80000000u : 0x8000u;
                            for (const auto& pq : cancelling_pairs(rng, in, in)) {
                                for (size_t o = 0; o < rows; ++o) {
                                    const uint32_t b = big_w_bits(rng, type);
                                    const size_t p = o * in + pq.first, q = o * in + pq.second;
                                    if (type == WeightType::F32) {
                                        c.w32[p] = f32_bits(b), c.w32[q] = f32_bits(b ^ sign);
                                        wide[p] = c.w32[p], wide[q] = c.w32[q];
                                    } else {
                                        c.w16[p] = static_cast<uint16_t>(b), c.w16[q] = static_cast<uint16_t>(b ^ sign);
                                        wide[p] = type == WeightType::BF16 ? k3::bf16_to_f64(c.w16[p]) : k3::f16_to_f64(c.w16[p]);
                                        wide[q] = -wide[p];
                                    }
                                }
                                for (size_t t = 0; t < tokens; ++t)
                                    c.x[t * in + pq.first] = c.x[t * in + pq.second] = f32_random(rng, 8, 24);
                            }
                        }
                        char label[128];
                        std::snprintf(label, sizeof label, "linear %-4s in=%-4zu rows=%-2zu tokens=%-2zu %-9s",
                                      type_name(type), in, rows, tokens, kind_name(kind));
                        check_case({label, in, rows, tokens, &c, run_linear, wide.data(), c.x.data()}, backends,
                                   tot);
                    }

    for (int k = 0; k < static_cast<int>(Kind::Count); ++k)
        for (size_t in : kMxIn)
            for (size_t rows : kRows)
                for (size_t tokens : kTokens) {
                    const Kind kind = static_cast<Kind>(k);
                    MxCtx c;
                    c.in = in, c.rows = rows, c.tokens = tokens;
                    for (size_t i = 0; i < rows * in / 2; ++i) c.packed.push_back(static_cast<uint8_t>(rng.next()));
                    for (size_t i = 0; i < rows * in / k3::kGroup; ++i) c.scale.push_back(scale_byte(rng, kind));
                    for (size_t i = 0; i < tokens * in; ++i) c.x.push_back(mx_x_value(rng, kind));
                    if (kind == Kind::Cancel) {  // opposite codes (sign bit 8) in one group, equal big x
                        for (const auto& pq : cancelling_pairs(rng, in, k3::kGroup)) {
                            for (size_t o = 0; o < rows; ++o) {
                                const uint8_t code = static_cast<uint8_t>(rng.range(1, 15) & 0x0F);
                                const uint8_t codes[2] = {static_cast<uint8_t>(code == 8 ? 7 : code),
                                                          static_cast<uint8_t>((code == 8 ? 7 : code) ^ 8)};
                                const size_t ps[2] = {pq.first, pq.second};
                                for (int m = 0; m < 2; ++m) {
                                    uint8_t& byte = c.packed[o * (in / 2) + ps[m] / 2];
                                    byte = ps[m] % 2 == 0 ? static_cast<uint8_t>((byte & 0xF0) | codes[m])
                                                          : static_cast<uint8_t>((byte & 0x0F) | (codes[m] << 4));
                                }
                            }
                            for (size_t t = 0; t < tokens; ++t)
                                c.x[t * in + pq.first] = c.x[t * in + pq.second] = f32_random(rng, 8, 24);
                        }
                    }
                    std::vector<double> wide(rows * in);  // the contract's decode, written out again here
                    for (size_t o = 0; o < rows; ++o)
                        for (size_t i = 0; i < in; ++i) {
                            const uint8_t byte = c.packed[o * (in / 2) + i / 2];
                            const uint8_t code = i % 2 == 0 ? (byte & 0x0F) : (byte >> 4);
                            wide[o * in + i] = k3::e2m1(code) * k3::e8m0(c.scale[o * (in / k3::kGroup) + i / 32]);
                        }
                    char label[128];
                    std::snprintf(label, sizeof label, "mxfp4       in=%-4zu rows=%-2zu tokens=%-2zu %-9s", in, rows,
                                  tokens, kind_name(kind));
                    check_case({label, in, rows, tokens, &c, run_mxfp4, wide.data(), c.x.data()}, backends, tot);
                }

    draft_cases(rng, backends, tot);
    kda_row_cases(rng, backends, tot);
    attention_cases(rng, backends, tot);

    std::printf("\nsummary: %d backend-case checks, %d passed, %d failed (backends: %s)\n", tot.passed + tot.failed,
                tot.passed, tot.failed, names.c_str());
    std::printf("summary: %ld scalar outputs: %ld NaN, %ld inf, %ld subnormal, %ld zero\n", tot.outputs, tot.nan,
                tot.inf, tot.subnormal, tot.zero);
    std::printf("summary: outputs a wrong order would change: %ld (sequential sum), %ld (8 lanes instead of 16)\n",
                tot.seq_differs, tot.eight_differs);
    // The scalar backend itself must give the same bytes on every machine: neon-check.sh compares this
    // line between the native x86-64 run and the aarch64 run under qemu.
    std::printf("summary: scalar output digest %016" PRIx64 "\n", tot.digest);
    if (!env_ok) ++tot.failed;
    std::printf("%s\n", tot.failed == 0 ? "ALL BACKENDS MATCH SCALAR BYTE FOR BYTE" : "MISMATCH: see FAIL lines above");
    std::printf("test_driver: %d passed, %d failed\n", tot.passed, tot.failed);
    return tot.failed == 0 ? 0 : 1;
}
