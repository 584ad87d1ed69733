// Run-time CPU feature detection: cpuid via the compiler builtin on x86, NEON is baseline on aarch64.
#include "cpu_features.h"

#include <cstdint>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace k3 {

CpuFeatures detect_cpu_features() {
    CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    f.avx2 = __builtin_cpu_supports("avx2");
    f.fma = __builtin_cpu_supports("fma");
    f.avx512f = __builtin_cpu_supports("avx512f");
    f.avx512bw = __builtin_cpu_supports("avx512bw");
    f.avx512vl = __builtin_cpu_supports("avx512vl");
#elif defined(__aarch64__)
    f.neon = true;
#endif
    return f;
}

const char* fp_environment_problem() {
#if defined(__x86_64__) || defined(__i386__)
    const unsigned csr = _mm_getcsr();
    if (csr & (1u << 15)) return "flush-to-zero (MXCSR.FTZ) is on";
    if (csr & (1u << 6)) return "denormals-are-zero (MXCSR.DAZ) is on";
    if (csr & (3u << 13)) return "the rounding mode is not round-to-nearest";
#elif defined(__aarch64__)
    uint64_t fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    if (fpcr & (1u << 24)) return "flush-to-zero (FPCR.FZ) is on";
    if (fpcr & (3u << 22)) return "the rounding mode is not round-to-nearest";
#endif
    return "";
}

}  // namespace k3
