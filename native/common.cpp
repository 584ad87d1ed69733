// Helpers shared by every backend: the lane fold, float32 rounding with a canonical NaN, KDA's state rows and
// attention's column dots in scalar code, and the exact widening of BF16, F16, E2M1, E8M0 and the draft int4
// codes to double.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels.h"

namespace k3 {

double lane_combine(double acc[kLanes]) {
    for (int w = kLanes / 2; w >= 1; w /= 2)
        for (int j = 0; j < w; ++j) acc[j] = acc[j] + acc[j + w];
    return acc[0];
}

double lane_dot_f64(const double* a, const double* b, size_t n) {
    double acc[kLanes] = {0.0};
    for (size_t i = 0; i < n; ++i) acc[i % kLanes] += a[i] * b[i];
    return lane_combine(acc);
}

float to_f32(double v) {
    if (std::isnan(v)) {
        const uint32_t quiet = 0x7FC00000u;
        float f;
        std::memcpy(&f, &quiet, sizeof f);
        return f;
    }
    return static_cast<float>(v);
}

void kda_decay_columns(const float* s, size_t j0, size_t d, double a, double k, double* lane) {
    for (size_t j = j0; j < d; ++j) lane[j] = lane[j] + (static_cast<double>(s[j]) * a) * k;
}

void kda_update_columns(float* s, size_t j0, size_t d, double a, double k, const double* delta, double q,
                        double* lane) {
    for (size_t j = j0; j < d; ++j) {
        s[j] = to_f32(static_cast<double>(s[j]) * a + k * delta[j]);
        lane[j] = lane[j] + static_cast<double>(s[j]) * q;
    }
}

// Each token's lanes of the columns as [16][d - j0], the rows walked in order (a column walk would touch a cache
// line per element); the fold is lane_combine's, on every column at once.
void column_dots_from(const float* rows, size_t n, size_t d, const double* x, size_t tokens, double* y, size_t j0) {
    if (j0 >= d) return;
    const size_t w = d - j0;
    std::vector<double> lanes(kLanes * w);
    for (size_t t = 0; t < tokens; ++t) {
        std::fill(lanes.begin(), lanes.end(), 0.0);
        for (size_t i = 0; i < n; ++i) {
            double* lane = lanes.data() + i % kLanes * w;
            const float* row = rows + i * d + j0;
            const double xi = x[t * n + i];
            for (size_t j = 0; j < w; ++j) lane[j] = lane[j] + static_cast<double>(row[j]) * xi;
        }
        fold_lane_columns(lanes.data(), w, y + t * d + j0);
    }
}

void fold_lane_columns(double* lanes, size_t w, double* out) {
    for (size_t half = kLanes / 2; half >= 1; half /= 2)
        for (size_t l = 0; l < half; ++l)
            for (size_t j = 0; j < w; ++j) lanes[l * w + j] = lanes[l * w + j] + lanes[(l + half) * w + j];
    std::copy(lanes, lanes + w, out);
}

double bf16_to_f64(uint16_t bits) {
    const uint32_t wide = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &wide, sizeof f);
    return f;
}

double f16_to_f64(uint16_t bits) {
    const int sign = bits >> 15, exponent = (bits >> 10) & 0x1F, mantissa = bits & 0x3FF;
    double v;
    if (exponent == 0)
        v = std::ldexp(static_cast<double>(mantissa), -24);  // zero and subnormals
    else if (exponent == 31)
        v = mantissa ? std::nan("") : INFINITY;
    else
        v = std::ldexp(static_cast<double>(mantissa | 0x400), exponent - 25);
    return sign ? -v : v;
}

double e2m1(uint8_t code) {
    static const double kValues[16] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0};
    return kValues[code & 0x0F];
}

double e8m0(uint8_t scale) {
    return scale == 255 ? 0.0 : std::ldexp(1.0, static_cast<int>(scale) - 127);
}

double int4_code(uint8_t nibble) { return static_cast<double>(static_cast<int>(nibble & 0x0F) - 8); }

double* line_aligned(std::vector<double>& v, size_t n) {
    constexpr size_t kLine = 64;
    v.resize(n + kLine / sizeof(double) - 1);
    const auto address = reinterpret_cast<uintptr_t>(v.data());
    return v.data() + (kLine - address % kLine) % kLine / sizeof(double);
}

}  // namespace k3
