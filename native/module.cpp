// The pybind11 module k3core._native: build facts and CPU features so far; the kernel
// backends (scalar, AVX2, NEON) are added by the kernels work and registered here.
#include <pybind11/pybind11.h>

#include "cpu_features.h"

namespace py = pybind11;

PYBIND11_MODULE(_native, m) {
    m.doc() = "k3 native kernels (C++).";
    m.def("cpu_features", [] {
        const k3::CpuFeatures f = k3::detect_cpu_features();
        py::dict d;
        d["avx2"] = f.avx2;
        d["fma"] = f.fma;
        d["avx512f"] = f.avx512f;
        d["neon"] = f.neon;
        return d;
    }, "CPU features detected at run time.");
    m.def("build_info", [] {
        py::dict d;
#if defined(__clang__)
        d["compiler"] = "clang " __clang_version__;
#elif defined(__GNUC__)
        d["compiler"] = "g++ " __VERSION__;
#else
        d["compiler"] = "unknown";
#endif
        d["flags"] = K3_CXX_FLAGS;
        return d;
    }, "Compiler and floating-point flags the module was built with.");
}
