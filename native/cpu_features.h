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

}  // namespace k3
