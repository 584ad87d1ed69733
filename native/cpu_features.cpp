// Run-time CPU feature detection: cpuid via the compiler builtin on x86, NEON is baseline on aarch64.
#include "cpu_features.h"

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

}  // namespace k3
