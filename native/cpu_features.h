// CPU features the kernel backends can use, detected at run time (never assumed at build time).
#pragma once

namespace k3 {

struct CpuFeatures {
    bool avx2 = false;
    bool fma = false;
    bool avx512f = false;
    bool avx512bw = false;
    bool avx512vl = false;
    bool neon = false;
};

CpuFeatures detect_cpu_features();

// Empty when this thread's floating-point environment is the IEEE default the kernels need
// (round to nearest, no flush-to-zero, no denormals-are-zero); else what is wrong. A library built
// with -ffast-math can switch flush-to-zero on for a whole process when it loads.
const char* fp_environment_problem();

}  // namespace k3
