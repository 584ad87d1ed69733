// The pybind11 module k3core._native: a Kernels object per backend (scalar, avx2, avx512, neon) whose
// methods take and return numpy arrays, release the GIL, and split output rows over a thread pool.
// Each method first checks the floating-point environment, once per call; then it takes every array
// argument through one checked view (element type, C-contiguous, number of dimensions) and checks the
// shapes against each other. A refusal is a ValueError that names the kernel and the array.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cpu_features.h"
#include "kernels.h"
#include "ops.h"
#include "exponent_code.h"
#include "planes.h"
#include "pool.h"

namespace py = pybind11;

namespace {

using k3::MatrixKernels;

// Rows of work below this many multiply-adds per part are not worth waking a thread.
constexpr size_t kMinWorkPerPart = 1 << 15;

// The kernel families whose threads Kernels.set_family_threads caps, and the kernels of each; a kernel not named in
// kFamilyOf is "other". Only the kernels that split rows over the pool read their family's cap.
enum Family : size_t { kDense, kExperts, kAttention, kOther, kFamilies };
constexpr const char* kFamilyNames[kFamilies] = {"dense", "experts", "attention", "other"};
constexpr std::pair<const char*, Family> kFamilyOf[] = {
    {"linear", kDense}, {"int8_linear", kDense}, {"int4_linear", kDense},
    {"mxfp4_linear", kExperts}, {"expert", kExperts},
    {"kda_recurrence", kAttention}, {"mqa_attention", kAttention}, {"short_conv", kAttention},
    {"kda_decay", kAttention},
};

Family family_of(const char* kernel) {
    for (const auto& [name, family] : kFamilyOf)
        if (std::strcmp(name, kernel) == 0) return family;
    return kOther;
}

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

// The ndim to ask of view() for the elementwise kernels, which take arrays of any shape.
constexpr int kAnyRank = -1;

std::string shape_text(const std::vector<size_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

// A numpy array argument that passed its checks: its data, shape and element count, and the name
// refusals call it by.
template <typename T>
struct View {
    std::string name;
    const T* ptr;
    std::vector<size_t> shape;
    size_t size;

    size_t rows() const { return shape[0]; }
    size_t cols() const { return shape[1]; }
    std::string text() const { return name + " " + shape_text(shape); }
};

// "x [5, 37], w [37, 4]": the names and shapes of some arrays, for a refusal.
template <typename... V>
std::string shapes(const V&... views) {
    std::string s;
    ((s += (s.empty() ? "" : ", ") + views.text()), ...);
    return s;
}

std::vector<const float*> pointers(const std::vector<View<float>>& views) {
    std::vector<const float*> p;
    for (const auto& v : views) p.push_back(v.ptr);
    return p;
}

// An MXFP4 weight [rows, in]: packed nibbles [rows, in/2] and E8M0 scales [rows, in/32].
struct Mxfp4 {
    View<uint8_t> packed, scale;

    size_t rows() const { return packed.rows(); }
    size_t in() const { return packed.cols() * 2; }
};

// The argument checks of one kernel call. Making one checks the floating-point environment, once per
// call; every refusal is a std::invalid_argument (ValueError in Python) led by the kernel's name. The
// message of a refusal is built only when the check fails.
class Call {
   public:
    explicit Call(const char* kernel) : kernel_(kernel) { check_fp_environment(); }

    Family family() const { return family_of(kernel_); }

    [[noreturn]] void refuse(const std::string& why) const {
        throw std::invalid_argument(std::string(kernel_) + ": " + why);
    }

    // a as a C-contiguous array of T with ndim dimensions (any number for kAnyRank).
    template <typename T>
    View<T> view(const py::array& a, const std::string& name, int ndim = 2) const {
        if (!py::isinstance<py::array_t<T>>(a))
            refuse(name + " must be a " + dtype_name(py::dtype::of<T>()) + " array, got " + dtype_name(a.dtype()));
        if (!(a.flags() & py::array::c_style)) refuse(name + " must be C-contiguous");
        if (ndim != kAnyRank && a.ndim() != ndim)
            refuse(name + " must have " + std::to_string(ndim) + " dimensions, got " + std::to_string(a.ndim()));
        return {name, static_cast<const T*>(a.data()), std::vector<size_t>(a.shape(), a.shape() + a.ndim()),
                static_cast<size_t>(a.size())};
    }

    // Each array of a list argument, the i-th named "<name>[i]".
    template <typename T>
    std::vector<View<T>> views(const std::vector<py::array>& arrays, const std::string& name, int ndim) const {
        std::vector<View<T>> v;
        for (size_t i = 0; i < arrays.size(); ++i)
            v.push_back(view<T>(arrays[i], name + "[" + std::to_string(i) + "]", ndim));
        return v;
    }

    // The two arrays of an MXFP4 weight, each 2-D uint8; require_scale_fits checks them against each other.
    Mxfp4 mxfp4(const py::array& packed, const std::string& packed_name, const py::array& scale,
                const std::string& scale_name) const {
        return {view<uint8_t>(packed, packed_name), view<uint8_t>(scale, scale_name)};
    }

    void require_scale_fits(const Mxfp4& w) const {
        if (w.scale.rows() != w.rows() || w.scale.cols() * k3::kGroup != w.in())
            refuse(w.scale.name + " shape " + shape_text(w.scale.shape) + " does not fit " + w.packed.text() +
                   ": an MXFP4 scale is [rows, packed columns / " + std::to_string(k3::kGroup / 2) + "]");
    }

    // A matrix product's input has as many columns as its weight takes.
    void require_columns(const char* input, size_t has, const char* weight, size_t takes) const {
        if (has != takes)
            refuse(std::string(input) + " has " + std::to_string(has) + " columns, " + weight + " " +
                   std::to_string(takes));
    }

    template <typename T>
    void require_same_size(const View<T>& a, const View<T>& b) const {
        if (a.size != b.size)
            refuse(b.name + " has " + std::to_string(b.size) + " values, " + a.name + " " + std::to_string(a.size));
    }

   private:
    static std::string dtype_name(const py::dtype& d) { return py::str(d).cast<std::string>(); }

    const char* kernel_;
};

template <typename T = float>
py::array_t<T> new_array(const std::vector<size_t>& shape) {
    return py::array_t<T>(shape);
}

// A new array holding v's values: the state a kernel then advances in place.
py::array_t<float> copy_of(const View<float>& v) {
    auto a = new_array(v.shape);
    std::copy_n(v.ptr, v.size, a.mutable_data());
    return a;
}

// Runs f with the GIL released: the kernels touch no Python object.
template <typename F>
void without_gil(F&& f) {
    py::gil_scoped_release release;
    f();
}

class Kernels {
   public:
    Kernels(const std::string& name, unsigned threads) : mk_(matrix_kernels(name)), pool_(threads), name_(name) {}

    std::string name() const { return name_; }
    unsigned threads() const { return pool_.threads(); }
    void set_threads(unsigned n) { pool_.set_threads(n); }

    void set_family_threads(const std::string& family, unsigned n) {
        for (size_t f = 0; f < kFamilies; ++f)
            if (family == kFamilyNames[f]) {
                caps_[f] = n;
                return;
            }
        std::string valid;
        for (const char* name : kFamilyNames) valid += (valid.empty() ? "" : ", ") + std::string(name);
        throw std::invalid_argument("no kernel family '" + family + "'; the families are " + valid);
    }

    py::dict family_threads() const {
        py::dict d;
        for (size_t f = 0; f < kFamilies; ++f) d[kFamilyNames[f]] = caps_[f].load();
        return d;
    }

    py::array_t<float> linear(const py::array& w, const std::string& dtype, const py::array& x) {
        const Call call("linear");
        if (dtype == "BF16") return linear_product(call, k3::WeightType::BF16, call.view<uint16_t>(w, "weight"), x);
        if (dtype == "F16") return linear_product(call, k3::WeightType::F16, call.view<uint16_t>(w, "weight"), x);
        if (dtype == "F32") return linear_product(call, k3::WeightType::F32, call.view<float>(w, "weight"), x);
        call.refuse("weight dtype " + dtype + " is not BF16, F16 or F32");
    }

    py::array_t<float> mxfp4_linear(const py::array& packed, const py::array& scale, const py::array& x_array) {
        const Call call("mxfp4_linear");
        const Mxfp4 w = call.mxfp4(packed, "packed", scale, "scale");
        call.require_scale_fits(w);
        const auto x = call.view<float>(x_array, "x");
        call.require_columns("x", x.cols(), "the weight", w.in());
        auto y = new_array({x.rows(), w.rows()});
        float* yp = y.mutable_data();
        without_gil([&] { mxfp4_rows(call, w, x.ptr, x.rows(), yp); });
        return y;
    }

    // The draft trunk's int8 rows: codes int8 [O, I], one float32 scale a row.
    py::array_t<float> int8_linear(const py::array& codes_array, const py::array& scale_array,
                                   const py::array& x_array) {
        const Call call("int8_linear");
        const auto codes = call.view<int8_t>(codes_array, "codes");
        const auto x = call.view<float>(x_array, "x"), scale = call.view<float>(scale_array, "scales", 1);
        if (scale.size != codes.rows())
            call.refuse("scales has " + std::to_string(scale.size) + " values, codes " + std::to_string(codes.rows()) +
                        " rows: an int8 draft matrix has one scale a row");
        call.require_columns("x", x.cols(), "the weight", codes.cols());
        return draft_product(call, x, codes.rows(), [&](const float* xp, size_t n, float* yp, size_t r0, size_t r1) {
            mk_->int8_rows(codes.ptr, scale.ptr, codes.cols(), xp, n, yp, codes.rows(), r0, r1);
        });
    }

    // The draft trunk's int4 groups: packed uint8 [O, G * 16] and float32 scales [O, G] of a matrix [O, cols],
    // G = ceil(cols / 32).
    py::array_t<float> int4_linear(const py::array& packed_array, const py::array& scale_array, size_t cols,
                                   const py::array& x_array) {
        const Call call("int4_linear");
        const auto packed = call.view<uint8_t>(packed_array, "packed");
        const auto scale = call.view<float>(scale_array, "scales"), x = call.view<float>(x_array, "x");
        const size_t groups = k3::int4_groups_of(cols), rows = packed.rows();
        if (packed.cols() != groups * (k3::kGroup / 2))
            call.refuse(packed.text() + " does not hold " + std::to_string(cols) + " columns: an int4 draft row is " +
                        std::to_string(groups) + " groups of " + std::to_string(k3::kGroup / 2) + " bytes");
        if (scale.shape != std::vector<size_t>{rows, groups})
            call.refuse(scale.text() + " does not fit " + packed.text() + ": one scale a row and group of " +
                        std::to_string(k3::kGroup) + " columns, [" + std::to_string(rows) + ", " +
                        std::to_string(groups) + "]");
        call.require_columns("x", x.cols(), "the weight", cols);
        return draft_product(call, x, rows, [&](const float* xp, size_t n, float* yp, size_t r0, size_t r1) {
            mk_->int4_groups(packed.ptr, scale.ptr, cols, xp, n, yp, rows, r0, r1);
        });
    }

    // w2 · SiTU-GLU(w1 z, w3 z) in one call, float32 between the steps. The packed arrays are checked
    // against z and each other before each scale against its packed array, so a refusal names the wrong one.
    py::array_t<float> expert(const py::array& w1p, const py::array& w1s, const py::array& w2p,
                              const py::array& w2s, const py::array& w3p, const py::array& w3s,
                              const py::array& z_array, double beta, double linear_beta) {
        const Call call("expert");
        const auto z = call.view<float>(z_array, "z");
        const Mxfp4 w1 = call.mxfp4(w1p, "w1", w1s, "w1 scale"), w2 = call.mxfp4(w2p, "w2", w2s, "w2 scale"),
                    w3 = call.mxfp4(w3p, "w3", w3s, "w3 scale");
        const size_t tokens = z.rows(), latent = z.cols(), inter = w1.rows();
        call.require_columns("z", latent, "w1", w1.in());
        call.require_columns("z", latent, "w3", w3.in());
        if (w3.rows() != inter)
            call.refuse("w3 has " + std::to_string(w3.rows()) + " rows, w1 " + std::to_string(inter));
        call.require_columns("SiTU-GLU(w1 z, w3 z)", inter, "w2", w2.in());
        if (w2.rows() != latent)
            call.refuse("w2 has " + std::to_string(w2.rows()) + " rows, z " + std::to_string(latent) +
                        " columns (the output is as wide as z)");
        call.require_scale_fits(w1);
        call.require_scale_fits(w2);
        call.require_scale_fits(w3);
        auto y = new_array({tokens, latent});
        float* yp = y.mutable_data();
        without_gil([&] {
            std::vector<float> g(tokens * inter), u(tokens * inter), h(tokens * inter);
            mxfp4_rows(call, w1, z.ptr, tokens, g.data());
            mxfp4_rows(call, w3, z.ptr, tokens, u.data());
            // elementwise, so split by token: an element's two tanh and one exp cost a few hundred multiply-adds
            parallel_rows(call, tokens, rows_per_part(inter * 256), [&](size_t t0, size_t t1) {
                k3::ops::situ_glu(g.data() + t0 * inter, u.data() + t0 * inter, (t1 - t0) * inter, beta, linear_beta,
                                  h.data() + t0 * inter);
            });
            mxfp4_rows(call, w2, h.data(), tokens, yp);
        });
        return y;
    }

    py::array_t<float> rmsnorm(const py::array& x_array, const std::optional<py::array>& w_array, double eps) {
        const Call call("rmsnorm");
        const auto x = call.view<float>(x_array, "x");
        const float* wp = nullptr;
        if (w_array) {
            const auto w = call.view<float>(*w_array, "weight", 1);
            if (w.size != x.cols())
                call.refuse("weight has " + std::to_string(w.size) + " values, x " + std::to_string(x.cols()) +
                            " columns");
            wp = w.ptr;
        }
        auto y = new_array(x.shape);
        float* yp = y.mutable_data();
        without_gil([&] { k3::ops::rmsnorm(x.ptr, x.rows(), x.cols(), wp, eps, yp); });
        return y;
    }

    py::array_t<float> l2norm_heads(const py::array& x_array, size_t heads, double eps) {
        const Call call("l2norm_heads");
        const auto x = call.view<float>(x_array, "x");
        if (heads == 0 || x.cols() % heads != 0)
            call.refuse("x has " + std::to_string(x.cols()) + " columns, not a multiple of " + std::to_string(heads) +
                        " heads");
        auto y = new_array(x.shape);
        float* yp = y.mutable_data();
        without_gil([&] { k3::ops::l2norm_heads(x.ptr, x.rows(), heads, x.cols() / heads, eps, yp); });
        return y;
    }

    py::array_t<float> situ_glu(const py::array& g_array, const py::array& u_array, double beta, double linear_beta) {
        const Call call("situ_glu");
        const auto g = call.view<float>(g_array, "g", kAnyRank), u = call.view<float>(u_array, "u", kAnyRank);
        call.require_same_size(g, u);
        auto y = new_array(g.shape);
        float* yp = y.mutable_data();
        without_gil([&] { k3::ops::situ_glu(g.ptr, u.ptr, g.size, beta, linear_beta, yp); });
        return y;
    }

    py::array_t<float> sigmoid(const py::array& x_array) {
        const Call call("sigmoid");
        const auto x = call.view<float>(x_array, "x", kAnyRank);
        auto y = new_array(x.shape);
        float* yp = y.mutable_data();
        without_gil([&] { k3::ops::sigmoid(x.ptr, x.size, yp); });
        return y;
    }

    py::array_t<float> mul_sigmoid(const py::array& y_array, const py::array& g_array) {
        const Call call("mul_sigmoid");
        const auto y = call.view<float>(y_array, "y", kAnyRank), g = call.view<float>(g_array, "g", kAnyRank);
        call.require_same_size(y, g);
        auto out = new_array(y.shape);
        float* op = out.mutable_data();
        without_gil([&] { k3::ops::mul_sigmoid(y.ptr, g.ptr, y.size, op); });
        return out;
    }

    py::tuple short_conv(const py::array& x_array, const py::array& history_array, const py::array& w_array) {
        const Call call("short_conv");
        const auto x = call.view<float>(x_array, "x"), history = call.view<float>(history_array, "history"),
                   w = call.view<float>(w_array, "w");
        const size_t tokens = x.rows(), channels = x.cols(), k = w.cols();
        if (w.rows() != channels || history.rows() + 1 != k || history.cols() != channels)
            call.refuse("shapes must be x [T, C], history [K-1, C], w [C, K]; got " + shapes(x, history, w));
        auto y = new_array({tokens, channels});
        auto hist = copy_of(history);  // updated in place below
        float *yp = y.mutable_data(), *hp = hist.mutable_data();
        without_gil([&] { k3::ops::short_conv(x.ptr, tokens, channels, hp, w.ptr, k, yp); });
        return py::make_tuple(y, hist);
    }

    py::array_t<float> kda_decay(const py::array& z_array, const py::array& a_log_array,
                                 const py::array& dt_bias_array, double lower_bound) {
        const Call call("kda_decay");
        const auto z = call.view<float>(z_array, "z", 3), a_log = call.view<float>(a_log_array, "A_log", 1),
                   dt_bias = call.view<float>(dt_bias_array, "dt_bias", 1);
        const size_t tokens = z.shape[0], heads = z.shape[1], d = z.shape[2];
        if (a_log.size < heads || dt_bias.size != heads * d)
            call.refuse("A_log needs one value per head, dt_bias one per channel; got " + shapes(z, a_log, dt_bias));
        auto alpha = new_array(z.shape);
        float* out = alpha.mutable_data();
        without_gil([&] { k3::ops::kda_decay(z.ptr, tokens, heads, d, a_log.ptr, dt_bias.ptr, lower_bound, out); });
        return alpha;
    }

    py::tuple kda_recurrence(const py::array& q_array, const py::array& k_array, const py::array& v_array,
                             const py::array& alpha_array, const py::array& beta_array, const py::array& state_array,
                             double scale) {
        const Call call("kda_recurrence");
        const auto q = call.view<float>(q_array, "q", 3), k = call.view<float>(k_array, "k", 3),
                   v = call.view<float>(v_array, "v", 3), alpha = call.view<float>(alpha_array, "alpha", 3),
                   beta = call.view<float>(beta_array, "beta", 2), state = call.view<float>(state_array, "state", 3);
        const size_t tokens = q.shape[0], heads = q.shape[1], d = q.shape[2];
        if (k.shape != q.shape || v.shape != q.shape || alpha.shape != q.shape ||
            beta.shape != std::vector<size_t>{tokens, heads} || state.shape != std::vector<size_t>{heads, d, d})
            call.refuse("shapes must be q, k, v, alpha [T, heads, D], beta [T, heads], state [heads, D, D]; got " +
                        shapes(q, k, v, alpha, beta, state));
        auto o = new_array(q.shape);
        auto S = copy_of(state);  // advanced in place below
        float *op = o.mutable_data(), *sp = S.mutable_data();
        without_gil([&] {
            parallel_rows(call, heads, rows_per_part(tokens * d * d * 4), [&](size_t h0, size_t h1) {
                k3::ops::kda_recurrence(*mk_, q.ptr, k.ptr, v.ptr, alpha.ptr, beta.ptr, tokens, heads, d, sp, scale,
                                        op, h0, h1);
            });
        });
        return py::make_tuple(o, S);
    }

    py::array_t<float> mqa_attention(const py::array& q_array, const py::array& keys_array,
                                     const py::array& values_array, double scale) {
        const Call call("mqa_attention");
        const auto q = call.view<float>(q_array, "q"), keys = call.view<float>(keys_array, "keys"),
                   values = call.view<float>(values_array, "values");
        const size_t heads = q.rows(), dk = q.cols(), n = keys.rows(), dv = values.cols();
        if (keys.cols() != dk || values.rows() != n || n == 0)
            call.refuse("shapes must be q [heads, dk], keys [n, dk], values [n, dv], n > 0; got " +
                        shapes(q, keys, values));
        auto out = new_array({heads, dv});
        float* op = out.mutable_data();
        without_gil([&] {
            parallel_rows(call, heads, rows_per_part(n * (dk + dv)), [&](size_t h0, size_t h1) {
                k3::ops::mqa_attention(*mk_, q.ptr, dk, keys.ptr, n, values.ptr, dv, scale, op, h0, h1);
            });
        });
        return out;
    }

    py::tuple router(const py::array& logits_array, const py::array& bias_array, size_t top_k, bool renormalize,
                     double scaling) {
        const Call call("router");
        const auto logits = call.view<float>(logits_array, "logits"), bias = call.view<float>(bias_array, "bias", 1);
        const size_t tokens = logits.rows(), experts = logits.cols();
        if (bias.size != experts || top_k < 1 || top_k > experts)
            call.refuse("bias needs one value per expert and 1 <= top_k <= experts; got " + shapes(logits, bias) +
                        ", top_k " + std::to_string(top_k));
        auto ids = new_array<int64_t>({tokens, top_k});
        auto w = new_array({tokens, top_k});
        int64_t* ip = ids.mutable_data();
        float* wp = w.mutable_data();
        without_gil([&] {
            k3::ops::router(logits.ptr, tokens, experts, bias.ptr, top_k, renormalize, scaling, ip, wp);
        });
        return py::make_tuple(ids, w);
    }

    py::array_t<float> combine(const std::vector<py::array>& out_arrays, const py::array& weights_array) {
        const Call call("combine");
        const auto outs = call.views<float>(out_arrays, "outputs", kAnyRank);
        const auto weights = call.view<float>(weights_array, "weights", 1);
        if (outs.empty() || weights.size != outs.size())
            call.refuse("one weight per output, at least one output; got " + std::to_string(weights.size) +
                        " weights, " + std::to_string(outs.size()) + " outputs");
        for (const auto& o : outs) call.require_same_size(outs[0], o);
        const std::vector<const float*> ptrs = pointers(outs);
        auto y = new_array(outs[0].shape);
        float* yp = y.mutable_data();
        without_gil([&] { k3::ops::combine(ptrs.data(), weights.ptr, ptrs.size(), outs[0].size, yp); });
        return y;
    }

    py::array_t<float> attnres(const std::vector<py::array>& source_arrays, const py::array& fold_array,
                               double eps) {
        const Call call("attnres");
        const auto sources = call.views<float>(source_arrays, "sources", 2);
        const auto fold = call.view<double>(fold_array, "fold", 1);
        if (sources.empty()) call.refuse("no sources");
        for (const auto& s : sources)
            if (s.shape != sources[0].shape) call.refuse("sources differ in shape: " + shapes(sources[0], s));
        const size_t tokens = sources[0].rows(), hidden = sources[0].cols();
        if (fold.size != hidden)
            call.refuse("fold has " + std::to_string(fold.size) + " values, the sources " + std::to_string(hidden) +
                        " columns");
        const std::vector<const float*> ptrs = pointers(sources);
        auto y = new_array({tokens, hidden});
        float* yp = y.mutable_data();
        without_gil([&] { k3::ops::attnres(ptrs.data(), ptrs.size(), tokens, hidden, fold.ptr, eps, yp); });
        return y;
    }

   private:
    // The pool's split of rows, taken by at most as many threads as the cap of call's kernel family.
    void parallel_rows(const Call& call, size_t rows, size_t min_rows, const std::function<void(size_t, size_t)>& fn) {
        pool_.parallel_rows(rows, min_rows, fn, caps_[call.family()].load());
    }

    static size_t rows_per_part(size_t work_per_row) {
        return work_per_row ? (kMinWorkPerPart + work_per_row - 1) / work_per_row : 1;
    }

    template <typename W>
    py::array_t<float> linear_product(const Call& call, k3::WeightType type, const View<W>& w,
                                      const py::array& x_array) {
        const auto x = call.view<float>(x_array, "x");
        call.require_columns("x", x.cols(), "the weight", w.cols());
        const size_t out = w.rows(), in = w.cols(), tokens = x.rows();
        auto y = new_array({tokens, out});
        float* yp = y.mutable_data();
        without_gil([&] {
            for_token_tiles(tokens, in, [&](size_t t0, size_t n) {
                parallel_rows(call, out, rows_per_part(in * n), [&](size_t r0, size_t r1) {
                    mk_->linear(type, w.ptr, in, x.ptr + t0 * in, n, yp + t0 * out, out, r0, r1);
                });
            });
        });
        return y;
    }

    // y [T, rows] of a draft product: token tiles, rows split over the pool as linear's; run(x, n, y, r0, r1)
    // runs the kernel on n tokens at x into y.
    template <class Rows>
    py::array_t<float> draft_product(const Call& call, const View<float>& x, size_t rows, const Rows& run) {
        const size_t in = x.cols(), tokens = x.rows();
        auto y = new_array({tokens, rows});
        float* yp = y.mutable_data();
        without_gil([&] {
            for_token_tiles(tokens, in, [&](size_t t0, size_t n) {
                parallel_rows(call, rows, rows_per_part(in * n), [&](size_t r0, size_t r1) {
                    run(x.ptr + t0 * in, n, yp + t0 * rows, r0, r1);
                });
            });
        });
        return y;
    }

    void mxfp4_rows(const Call& call, const Mxfp4& w, const float* x, size_t tokens, float* y) {
        for_token_tiles(tokens, w.in(), [&](size_t t0, size_t n) {
            parallel_rows(call, w.rows(), rows_per_part(w.in() * n), [&](size_t r0, size_t r1) {
                mk_->mxfp4(w.packed.ptr, w.scale.ptr, w.in(), x + t0 * w.in(), n, y + t0 * w.rows(), w.rows(), r0, r1);
            });
        });
    }

    // A product of many tokens goes a tile of tokens at a time, so that the tile's x widened to double (tokens x in
    // doubles) stays within kTileXBytes, about one core's L2, while every weight row passes it; past the last-level
    // cache each row block streamed x from DRAM again (`k3 bench prefill` on a Zen 3: bf16 at T = 512 ran at 56 % of
    // T = 64), and past L2 from the last-level cache (on an Ice Lake core, MXFP4 3072 x 3584 at T = 64 ran 1.15-1.21x
    // faster in tiles of 16 to 36 tokens than in one of 64 with AVX-512, 1.35-1.49x with AVX2; bf16 1024 x 7168 with
    // AVX2 in tiles of 13-18 tokens 1.30-1.45x; docs/performance-notes/avx512-batch-icelake.md). Never more than
    // kTokenTile tokens, never fewer than kMinTokenTile. Each tile is a batched call of its own, whose tokens get the
    // bits they get alone (kernels.h): no bit changes.
    static constexpr size_t kTokenTile = 64, kMinTokenTile = 8, kTileXBytes = size_t{1} << 20;
    static size_t token_tile(size_t in) {
        return std::clamp(kTileXBytes / (std::max<size_t>(in, 1) * sizeof(double)), kMinTokenTile, kTokenTile);
    }
    // The tokens split into as few tiles as token_tile allows, of sizes differing by at most one (128 tokens of 7,168
    // columns: 8 of 16, not 7 of 18 and one of 2, whose weights would be widened for 2 tokens).
    template <class F>
    static void for_token_tiles(size_t tokens, size_t in, F&& fn) {
        const size_t tile = token_tile(in), tiles = (tokens + tile - 1) / tile;
        for (size_t i = 0, t0 = 0; i < tiles; ++i) {
            const size_t n = tokens / tiles + (i < tokens % tiles ? 1 : 0);
            fn(t0, n);
            t0 += n;
        }
    }

    const MatrixKernels* mk_;
    k3::Pool pool_;
    std::atomic<unsigned> caps_[kFamilies] = {};  // threads per family, 0: all of pool_'s; read without the GIL
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
    m.def("fma_probe", [](const std::string& backend, size_t rounds) {
        const MatrixKernels* k = matrix_kernels(backend);
        py::gil_scoped_release released;
        return k->fma_probe(rounds);
    }, "Run `rounds` rounds of the backend's FMA-bound loop on this thread; returns the double multiply-adds done.");
    m.def("planes_checksum", [](py::buffer data) {
        const py::buffer_info b = data.request();
        if (b.itemsize != 1 || b.ndim != 1) throw std::invalid_argument("planes_checksum wants a 1-D byte buffer");
        uint64_t sum = 0;
        without_gil([&] { sum = k3::planes::checksum(static_cast<const uint8_t*>(b.ptr), b.size); });
        return sum;
    }, py::arg("data"), "The codec's block checksum of a byte buffer (native/planes.h).");
    m.def("planes_join", [](py::buffer rest, py::buffer exponent, py::buffer out) {
        const py::buffer_info l = rest.request(), h = exponent.request(), o = out.request(true);
        for (const py::buffer_info* b : {&l, &h, &o})
            if (b->itemsize != 1 || b->ndim != 1) throw std::invalid_argument("planes_join wants 1-D byte buffers");
        const size_t n = o.size;
        if (static_cast<size_t>(l.size) != (n + 1) / 2 || static_cast<size_t>(h.size) != n / 2)
            throw std::invalid_argument("planes_join: out has " + std::to_string(n) + " bytes, so rest needs " +
                                        std::to_string((n + 1) / 2) + " and exponent " + std::to_string(n / 2) +
                                        "; got " + std::to_string(l.size) + " and " + std::to_string(h.size));
        uint64_t sum = 0;
        without_gil([&] {
            sum = k3::planes::join(static_cast<const uint8_t*>(l.ptr), static_cast<const uint8_t*>(h.ptr), n,
                                   static_cast<uint8_t*>(o.ptr));
        });
        return sum;
    }, py::arg("rest"), py::arg("exponent"), py::arg("out"),
          "Join the rest (sign + mantissa) and exponent planes into out's 16-bit words (native/planes.h); "
          "returns out's block checksum.");
    m.def("exponent_encode", [](py::buffer exponents) {
        const py::buffer_info e = exponents.request();
        if (e.itemsize != 1 || e.ndim != 1 || e.size == 0)
            throw std::invalid_argument("exponent_encode wants a non-empty 1-D byte buffer");
        std::string out(k3::planes::piece_bound(e.size), '\0');
        size_t n = 0;
        without_gil([&] {
            n = k3::planes::encode_piece(static_cast<const uint8_t*>(e.ptr), e.size, reinterpret_cast<uint8_t*>(out.data()));
        });
        out.resize(n);
        return py::bytes(out);
    }, py::arg("exponents"), "One stored piece of the exponent code (native/exponent_code.h).");
    m.def("exponent_decode", [](py::buffer piece, size_t count) {
        const py::buffer_info p = piece.request();
        if (p.itemsize != 1 || p.ndim != 1 || count == 0)
            throw std::invalid_argument("exponent_decode wants a 1-D byte buffer and a positive count");
        std::string out(count, '\0');
        const char* why = nullptr;
        without_gil([&] {
            why = k3::planes::decode_piece(static_cast<const uint8_t*>(p.ptr), p.size, count,
                                           reinterpret_cast<uint8_t*>(out.data()));
        });
        if (why) throw std::invalid_argument(why);
        return py::bytes(out);
    }, py::arg("piece"), py::arg("count"), "The `count` exponents of one stored piece (native/exponent_code.h); "
          "ValueError naming what is malformed.");
    m.def("planes_restore", [](py::buffer stored, py::buffer out) {
        const py::buffer_info s = stored.request(), o = out.request(true);
        if (s.itemsize != 1 || s.ndim != 1 || o.itemsize != 1 || o.ndim != 1)
            throw std::invalid_argument("planes_restore wants 1-D byte buffers");
        uint64_t sum = 0;
        const char* why = nullptr;
        without_gil([&] {
            why = k3::planes::restore(static_cast<const uint8_t*>(s.ptr), s.size, o.size, static_cast<uint8_t*>(o.ptr), &sum);
        });
        if (why) throw std::invalid_argument(why);
        return sum;
    }, py::arg("stored"), py::arg("out"), "Restore a planes block's bytes into out (native/planes.h); returns "
          "their block checksum, or ValueError naming what is malformed.");
    py::class_<Kernels>(m, "Kernels")
        .def(py::init<const std::string&, unsigned>(), py::arg("name"), py::arg("threads") = 1)
        .def_property_readonly("name", &Kernels::name)
        .def_property("threads", &Kernels::threads, &Kernels::set_threads)
        .def("set_family_threads", &Kernels::set_family_threads, py::arg("family"), py::arg("threads"),
             "Split the rows of a family's kernels (dense, experts, attention, other) over at most `threads` threads; "
             "0 clears the cap. Never changes a bit.")
        .def("family_threads", &Kernels::family_threads, "Each family's thread cap; 0: the pool's thread count.")
        .def("linear", &Kernels::linear)
        .def("mxfp4_linear", &Kernels::mxfp4_linear)
        .def("int8_linear", &Kernels::int8_linear)
        .def("int4_linear", &Kernels::int4_linear)
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
