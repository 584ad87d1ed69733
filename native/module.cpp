// The pybind11 module k3core._native: a Kernels object per backend (scalar, avx2, avx512, neon) whose
// methods take and return numpy arrays, release the GIL, and split output rows over a thread pool.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu_features.h"
#include "kernels.h"
#include "ops.h"
#include "pool.h"

namespace py = pybind11;

namespace {

using k3::MatrixKernels;

// Rows of work below this many multiply-adds per part are not worth waking a thread.
constexpr size_t kMinWorkPerPart = 1 << 15;

std::vector<std::string> available_backends() {
    std::vector<std::string> names;
    const k3::CpuFeatures f = k3::detect_cpu_features();
#if defined(K3_HAVE_AVX512)
    if (f.avx512f && f.avx512bw && f.avx512vl) names.push_back("avx512");
#endif
#if defined(K3_HAVE_AVX2)
    if (f.avx2 && f.fma) names.push_back("avx2");
#endif
#if defined(K3_HAVE_NEON)
    if (f.neon) names.push_back("neon");
#endif
    (void)f;
    names.push_back("scalar");
    return names;
}

const MatrixKernels* matrix_kernels(const std::string& name) {
    for (const std::string& n : available_backends()) {
        if (n != name) continue;
        if (name == "scalar") return &k3::kScalar;
#if defined(K3_HAVE_AVX2)
        if (name == "avx2") return &k3::kAvx2;
#endif
#if defined(K3_HAVE_AVX512)
        if (name == "avx512") return &k3::kAvx512;
#endif
#if defined(K3_HAVE_NEON)
        if (name == "neon") return &k3::kNeon;
#endif
    }
    throw std::invalid_argument("kernel backend '" + name + "' is not available on this machine");
}

// Every kernel call first checks the calling thread's floating-point environment.
void check_fp_environment() {
    const char* problem = k3::fp_environment_problem();
    if (*problem)
        throw std::runtime_error(std::string("k3 kernels refuse to run: ") + problem +
                                 " in this process (a library built with -ffast-math may have switched it on); "
                                 "results would differ from every other configuration");
}

template <typename T>
const T* in_ptr(const py::array& a, const char* what, int ndim) {
    check_fp_environment();
    if (!py::isinstance<py::array_t<T>>(a) || !(a.flags() & py::array::c_style))
        throw std::invalid_argument(std::string(what) + ": expected a C-contiguous " +
                                    py::str(py::dtype::of<T>()).cast<std::string>() + " array, got " +
                                    py::str(a.dtype()).cast<std::string>());
    if (ndim >= 0 && a.ndim() != ndim)
        throw std::invalid_argument(std::string(what) + ": expected " + std::to_string(ndim) + " dimensions");
    return static_cast<const T*>(a.data());
}

py::array_t<float> new_f32(std::vector<py::ssize_t> shape) { return py::array_t<float>(shape); }

void require(bool ok, const std::string& message) {
    if (!ok) throw std::invalid_argument(message);
}

class Kernels {
   public:
    Kernels(const std::string& name, unsigned threads) : mk_(matrix_kernels(name)), pool_(threads), name_(name) {}

    std::string name() const { return name_; }
    unsigned threads() const { return pool_.threads(); }
    void set_threads(unsigned n) { pool_.set_threads(n); }

    py::array_t<float> linear(const py::array& w, const std::string& dtype, const py::array& x) {
        k3::WeightType type;
        const void* wp;
        if (dtype == "BF16") type = k3::WeightType::BF16, wp = in_ptr<uint16_t>(w, "weight", 2);
        else if (dtype == "F16") type = k3::WeightType::F16, wp = in_ptr<uint16_t>(w, "weight", 2);
        else if (dtype == "F32") type = k3::WeightType::F32, wp = in_ptr<float>(w, "weight", 2);
        else throw std::invalid_argument("linear: weight dtype " + dtype + " is not BF16, F16 or F32");
        const float* xp = in_ptr<float>(x, "x", 2);
        const size_t out = w.shape(0), in = w.shape(1), tokens = x.shape(0);
        require(static_cast<size_t>(x.shape(1)) == in, "linear: x has " + std::to_string(x.shape(1)) +
                                                           " columns, the weight " + std::to_string(in));
        auto y = new_f32({static_cast<py::ssize_t>(tokens), static_cast<py::ssize_t>(out)});
        float* yp = y.mutable_data();
        {
            py::gil_scoped_release release;
            pool_.parallel_rows(out, rows_per_part(in * tokens), [&](size_t r0, size_t r1) {
                mk_->linear(type, wp, in, xp, tokens, yp, out, r0, r1);
            });
        }
        return y;
    }

    py::array_t<float> mxfp4_linear(const py::array& packed, const py::array& scale, const py::array& x) {
        const uint8_t* pp = in_ptr<uint8_t>(packed, "packed", 2);
        const uint8_t* sp = in_ptr<uint8_t>(scale, "scale", 2);
        const float* xp = in_ptr<float>(x, "x", 2);
        const size_t out = packed.shape(0), in = packed.shape(1) * 2, tokens = x.shape(0);
        require(static_cast<size_t>(scale.shape(0)) == out && static_cast<size_t>(scale.shape(1)) * k3::kGroup == in,
                "mxfp4_linear: scale shape does not match packed (need [rows, in/32])");
        require(static_cast<size_t>(x.shape(1)) == in, "mxfp4_linear: x width does not match the weight");
        auto y = new_f32({static_cast<py::ssize_t>(tokens), static_cast<py::ssize_t>(out)});
        float* yp = y.mutable_data();
        {
            py::gil_scoped_release release;
            mxfp4_rows(pp, sp, in, xp, tokens, yp, out);
        }
        return y;
    }

    // w2 · SiTU-GLU(w1 z, w3 z) in one call, float32 between the steps.
    py::array_t<float> expert(const py::array& w1p, const py::array& w1s, const py::array& w2p,
                              const py::array& w2s, const py::array& w3p, const py::array& w3s,
                              const py::array& z, double beta, double linear_beta) {
        const float* zp = in_ptr<float>(z, "z", 2);
        const size_t tokens = z.shape(0), latent = z.shape(1), inter = w1p.shape(0);
        require(static_cast<size_t>(w1p.shape(1)) * 2 == latent && static_cast<size_t>(w2p.shape(1)) * 2 == inter &&
                    static_cast<size_t>(w2p.shape(0)) == latent && w3p.shape(0) == w1p.shape(0),
                "expert: w1/w2/w3 shapes do not fit the latent width");
        const uint8_t *a = in_ptr<uint8_t>(w1p, "w1", 2), *as = in_ptr<uint8_t>(w1s, "w1 scale", 2),
                      *b = in_ptr<uint8_t>(w2p, "w2", 2), *bs = in_ptr<uint8_t>(w2s, "w2 scale", 2),
                      *c = in_ptr<uint8_t>(w3p, "w3", 2), *cs = in_ptr<uint8_t>(w3s, "w3 scale", 2);
        auto y = new_f32({static_cast<py::ssize_t>(tokens), static_cast<py::ssize_t>(latent)});
        float* yp = y.mutable_data();
        {
            py::gil_scoped_release release;
            std::vector<float> g(tokens * inter), u(tokens * inter), h(tokens * inter);
            mxfp4_rows(a, as, latent, zp, tokens, g.data(), inter);
            mxfp4_rows(c, cs, latent, zp, tokens, u.data(), inter);
            k3::ops::situ_glu(g.data(), u.data(), g.size(), beta, linear_beta, h.data());
            mxfp4_rows(b, bs, inter, h.data(), tokens, yp, latent);
        }
        return y;
    }

    py::array_t<float> rmsnorm(const py::array& x, const py::object& w, double eps) {
        const float* xp = in_ptr<float>(x, "x", 2);
        const size_t rows = x.shape(0), n = x.shape(1);
        const float* wp = nullptr;
        if (!w.is_none()) {
            py::array wa = w.cast<py::array>();
            wp = in_ptr<float>(wa, "weight", 1);
            require(static_cast<size_t>(wa.shape(0)) == n, "rmsnorm: weight length does not match x");
        }
        auto y = new_f32({static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(n)});
        float* yp = y.mutable_data();
        py::gil_scoped_release release;
        k3::ops::rmsnorm(xp, rows, n, wp, eps, yp);
        return y;
    }

    py::array_t<float> l2norm_heads(const py::array& x, size_t heads, double eps) {
        const float* xp = in_ptr<float>(x, "x", 2);
        require(heads > 0 && x.shape(1) % heads == 0, "l2norm_heads: width is not a multiple of heads");
        auto y = new_f32({x.shape(0), x.shape(1)});
        float* yp = y.mutable_data();
        py::gil_scoped_release release;
        k3::ops::l2norm_heads(xp, x.shape(0), heads, x.shape(1) / heads, eps, yp);
        return y;
    }

    py::array_t<float> situ_glu(const py::array& g, const py::array& u, double beta, double linear_beta) {
        const float *gp = in_ptr<float>(g, "g", -1), *up = in_ptr<float>(u, "u", -1);
        require(g.size() == u.size(), "situ_glu: g and u differ in size");
        auto y = same_shape(g);
        float* yp = y.mutable_data();
        py::gil_scoped_release release;
        k3::ops::situ_glu(gp, up, g.size(), beta, linear_beta, yp);
        return y;
    }

    py::array_t<float> sigmoid(const py::array& x) {
        const float* xp = in_ptr<float>(x, "x", -1);
        auto y = same_shape(x);
        float* yp = y.mutable_data();
        py::gil_scoped_release release;
        k3::ops::sigmoid(xp, x.size(), yp);
        return y;
    }

    py::array_t<float> mul_sigmoid(const py::array& y, const py::array& g) {
        const float *yp = in_ptr<float>(y, "y", -1), *gp = in_ptr<float>(g, "g", -1);
        require(y.size() == g.size(), "mul_sigmoid: y and g differ in size");
        auto out = same_shape(y);
        float* op = out.mutable_data();
        py::gil_scoped_release release;
        k3::ops::mul_sigmoid(yp, gp, y.size(), op);
        return out;
    }

    py::tuple short_conv(const py::array& x, const py::array& history, const py::array& w) {
        const float *xp = in_ptr<float>(x, "x", 2), *wp = in_ptr<float>(w, "w", 2);
        in_ptr<float>(history, "history", 2);
        const size_t tokens = x.shape(0), channels = x.shape(1), k = w.shape(1);
        require(static_cast<size_t>(w.shape(0)) == channels && static_cast<size_t>(history.shape(0)) == k - 1 &&
                    static_cast<size_t>(history.shape(1)) == channels,
                "short_conv: shapes must be x [T, C], history [K-1, C], w [C, K]");
        auto y = new_f32({static_cast<py::ssize_t>(tokens), static_cast<py::ssize_t>(channels)});
        py::array_t<float> hist(history.request());  // a copy, updated in place below
        float *yp = y.mutable_data(), *hp = hist.mutable_data();
        {
            py::gil_scoped_release release;
            k3::ops::short_conv(xp, tokens, channels, hp, wp, k, yp);
        }
        return py::make_tuple(y, hist);
    }

    py::array_t<float> kda_decay(const py::array& z, const py::array& a_log, const py::array& dt_bias,
                                 double lower_bound) {
        const float *zp = in_ptr<float>(z, "z", 3), *ap = in_ptr<float>(a_log, "A_log", 1),
                    *dp = in_ptr<float>(dt_bias, "dt_bias", 1);
        const size_t tokens = z.shape(0), heads = z.shape(1), d = z.shape(2);
        require(static_cast<size_t>(a_log.shape(0)) >= heads && static_cast<size_t>(dt_bias.shape(0)) == heads * d,
                "kda_decay: A_log needs one value per head, dt_bias one per channel");
        auto alpha = same_shape(z);
        float* out = alpha.mutable_data();
        py::gil_scoped_release release;
        k3::ops::kda_decay(zp, tokens, heads, d, ap, dp, lower_bound, out);
        return alpha;
    }

    py::tuple kda_recurrence(const py::array& q, const py::array& k, const py::array& v, const py::array& alpha,
                             const py::array& beta, const py::array& state, double scale) {
        const float *qp = in_ptr<float>(q, "q", 3), *kp = in_ptr<float>(k, "k", 3), *vp = in_ptr<float>(v, "v", 3),
                    *ap = in_ptr<float>(alpha, "alpha", 3), *bp = in_ptr<float>(beta, "beta", 2);
        in_ptr<float>(state, "state", 3);
        const size_t tokens = q.shape(0), heads = q.shape(1), d = q.shape(2);
        require(k.size() == q.size() && v.size() == q.size() && alpha.size() == q.size() &&
                    static_cast<size_t>(beta.size()) == tokens * heads && static_cast<size_t>(state.size()) == heads * d * d,
                "kda_recurrence: q, k, v, alpha [T, heads, D], beta [T, heads], state [heads, D, D]");
        auto o = same_shape(q);
        py::array_t<float> S(state.request());  // a copy, advanced in place below
        float *op = o.mutable_data(), *sp = S.mutable_data();
        {
            py::gil_scoped_release release;
            pool_.parallel_rows(heads, rows_per_part(tokens * d * d * 4), [&](size_t h0, size_t h1) {
                k3::ops::kda_recurrence(qp, kp, vp, ap, bp, tokens, heads, d, sp, scale, op, h0, h1);
            });
        }
        return py::make_tuple(o, S);
    }

    py::array_t<float> mqa_attention(const py::array& q, const py::array& keys, const py::array& values, double scale) {
        const float *qp = in_ptr<float>(q, "q", 2), *kp = in_ptr<float>(keys, "keys", 2),
                    *vp = in_ptr<float>(values, "values", 2);
        const size_t heads = q.shape(0), dk = q.shape(1), n = keys.shape(0), dv = values.shape(1);
        require(static_cast<size_t>(keys.shape(1)) == dk && static_cast<size_t>(values.shape(0)) == n && n > 0,
                "mqa_attention: q [heads, dk], keys [n, dk], values [n, dv], n > 0");
        auto out = new_f32({static_cast<py::ssize_t>(heads), static_cast<py::ssize_t>(dv)});
        float* op = out.mutable_data();
        {
            py::gil_scoped_release release;
            pool_.parallel_rows(heads, rows_per_part(n * (dk + dv)), [&](size_t h0, size_t h1) {
                k3::ops::mqa_attention(qp, dk, kp, n, vp, dv, scale, op, h0, h1);
            });
        }
        return out;
    }

    py::tuple router(const py::array& logits, const py::array& bias, size_t top_k, bool renormalize, double scaling) {
        const float *lp = in_ptr<float>(logits, "logits", 2), *bp = in_ptr<float>(bias, "bias", 1);
        const size_t tokens = logits.shape(0), experts = logits.shape(1);
        require(static_cast<size_t>(bias.shape(0)) == experts && top_k >= 1 && top_k <= experts,
                "router: bias needs one value per expert and 1 <= top_k <= experts");
        py::array_t<int64_t> ids({static_cast<py::ssize_t>(tokens), static_cast<py::ssize_t>(top_k)});
        auto w = new_f32({static_cast<py::ssize_t>(tokens), static_cast<py::ssize_t>(top_k)});
        int64_t* ip = ids.mutable_data();
        float* wp = w.mutable_data();
        {
            py::gil_scoped_release release;
            k3::ops::router(lp, tokens, experts, bp, top_k, renormalize, scaling, ip, wp);
        }
        return py::make_tuple(ids, w);
    }

    py::array_t<float> combine(const std::vector<py::array>& outs, const py::array& weights) {
        require(!outs.empty() && static_cast<size_t>(weights.size()) == outs.size(),
                "combine: one weight per output, at least one output");
        const float* wp = in_ptr<float>(weights, "weights", 1);
        std::vector<const float*> ptrs;
        for (const auto& o : outs) {
            ptrs.push_back(in_ptr<float>(o, "output", -1));
            require(o.size() == outs[0].size(), "combine: outputs differ in size");
        }
        auto y = same_shape(outs[0]);
        float* yp = y.mutable_data();
        py::gil_scoped_release release;
        k3::ops::combine(ptrs.data(), wp, ptrs.size(), outs[0].size(), yp);
        return y;
    }

    py::array_t<float> attnres(const std::vector<py::array>& sources, const py::array& fold, double eps) {
        require(!sources.empty(), "attnres: no sources");
        const double* fp = in_ptr<double>(fold, "fold", 1);
        std::vector<const float*> ptrs;
        for (const auto& s : sources) {
            ptrs.push_back(in_ptr<float>(s, "source", 2));
            require(s.shape(0) == sources[0].shape(0) && s.shape(1) == sources[0].shape(1),
                    "attnres: sources differ in shape");
        }
        const size_t tokens = sources[0].shape(0), hidden = sources[0].shape(1);
        require(static_cast<size_t>(fold.shape(0)) == hidden, "attnres: fold length does not match hidden");
        auto y = new_f32({static_cast<py::ssize_t>(tokens), static_cast<py::ssize_t>(hidden)});
        float* yp = y.mutable_data();
        py::gil_scoped_release release;
        k3::ops::attnres(ptrs.data(), ptrs.size(), tokens, hidden, fp, eps, yp);
        return y;
    }

   private:
    static size_t rows_per_part(size_t work_per_row) {
        return work_per_row ? (kMinWorkPerPart + work_per_row - 1) / work_per_row : 1;
    }

    static py::array_t<float> same_shape(const py::array& a) {
        std::vector<py::ssize_t> shape(a.shape(), a.shape() + a.ndim());
        return py::array_t<float>(shape);
    }

    void mxfp4_rows(const uint8_t* p, const uint8_t* s, size_t in, const float* x, size_t tokens, float* y,
                    size_t out) {
        pool_.parallel_rows(out, rows_per_part(in * tokens), [&](size_t r0, size_t r1) {
            mk_->mxfp4(p, s, in, x, tokens, y, out, r0, r1);
        });
    }

    const MatrixKernels* mk_;
    k3::Pool pool_;
    std::string name_;
};

}  // namespace

PYBIND11_MODULE(_native, m) {
    m.doc() = "k3 native kernels (C++): one Kernels object per backend; see native/kernels.h.";
    m.def("cpu_features", [] {
        const k3::CpuFeatures f = k3::detect_cpu_features();
        py::dict d;
        d["avx2"] = f.avx2;
        d["fma"] = f.fma;
        d["avx512f"] = f.avx512f;
        d["avx512bw"] = f.avx512bw;
        d["avx512vl"] = f.avx512vl;
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
    m.def("available_backends", &available_backends, "Backends this CPU runs, best first.");
    py::class_<Kernels>(m, "Kernels")
        .def(py::init<const std::string&, unsigned>(), py::arg("name"), py::arg("threads") = 1)
        .def_property_readonly("name", &Kernels::name)
        .def_property("threads", &Kernels::threads, &Kernels::set_threads)
        .def("linear", &Kernels::linear)
        .def("mxfp4_linear", &Kernels::mxfp4_linear)
        .def("expert", &Kernels::expert)
        .def("rmsnorm", &Kernels::rmsnorm)
        .def("l2norm_heads", &Kernels::l2norm_heads)
        .def("situ_glu", &Kernels::situ_glu)
        .def("sigmoid", &Kernels::sigmoid)
        .def("mul_sigmoid", &Kernels::mul_sigmoid)
        .def("short_conv", &Kernels::short_conv)
        .def("kda_decay", &Kernels::kda_decay)
        .def("kda_recurrence", &Kernels::kda_recurrence)
        .def("mqa_attention", &Kernels::mqa_attention)
        .def("router", &Kernels::router)
        .def("combine", &Kernels::combine)
        .def("attnres", &Kernels::attnres);
}
