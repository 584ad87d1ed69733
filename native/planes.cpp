#include "planes.h"

#include <cstring>
#include <vector>

#include "exponent_code.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace k3::planes {
namespace {

uint64_t word_at(const uint8_t* p, size_t avail) {
    uint64_t w = 0;
    std::memcpy(&w, p, avail < 8 ? avail : 8);  // little-endian hosts only (x86-64, aarch64)
    return w;
}

#if defined(__SSE2__)
// The checksum's sum over words without a multiply: words are taken 4 at a time (lanes j = i mod 4, two
// per vector), and for a lane's words x_0 … x_{M-1}, Σ m·x_m = (M − 1)·Σ x − Q with Q the sum of its
// prefix sums before each word — two 64-bit adds per word. All mod 2^64, so the sum is exactly the
// scalar one; `finish` turns the lanes into Σ w_i (2i + 1) for words 0 … 4M − 1.
struct Lanes {
    __m128i p01 = _mm_setzero_si128(), q01 = _mm_setzero_si128();  // words i ≡ 0, 1 (mod 4)
    __m128i p23 = _mm_setzero_si128(), q23 = _mm_setzero_si128();  // words i ≡ 2, 3 (mod 4)
    uint64_t steps = 0;

    void add(__m128i w01, __m128i w23) {
        q01 = _mm_add_epi64(q01, p01);
        p01 = _mm_add_epi64(p01, w01);
        q23 = _mm_add_epi64(q23, p23);
        p23 = _mm_add_epi64(p23, w23);
        ++steps;
    }

    uint64_t finish() const {
        uint64_t p[4], q[4];
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p), p01);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 2), p23);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q), q01);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 2), q23);
        uint64_t sum = 0;  // word i = 4m + j: (2i + 1) = 8m + 2j + 1
        for (uint64_t j = 0; j < 4; ++j)
            sum += 8 * ((steps - 1) * p[j] - q[j]) + (2 * j + 1) * p[j];
        return steps ? sum : 0;
    }
};
#endif

}  // namespace

uint64_t checksum(const uint8_t* data, size_t n) {
    uint64_t sum = 0;
    size_t i = 0;
#if defined(__SSE2__)
    Lanes lanes;
    for (; 8 * i + 32 <= n; i += 4)
        lanes.add(_mm_loadu_si128(reinterpret_cast<const __m128i*>(data + 8 * i)),
                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(data + 8 * i + 16)));
    sum = lanes.finish();
#endif
    for (; 8 * i + 8 <= n; ++i) sum += word_at(data + 8 * i, 8) * (2 * i + 1);
    if (8 * i < n) sum += word_at(data + 8 * i, n - 8 * i) * (2 * i + 1);
    return sum;
}

uint64_t join(const uint8_t* rest, const uint8_t* exponent, size_t n, uint8_t* out) {
    uint64_t sum = 0;
    size_t i = 0;  // output word index (of 8 bytes): bytes [8i, 8i + 8) come from the planes' [4i, 4i + 4)
#if defined(__SSE2__)
    Lanes lanes;
    for (; 8 * i + 32 <= n; i += 4) {  // 16 + 16 plane bytes -> 32 output bytes = words i … i + 3
        const __m128i r = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rest + 4 * i));
        const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(exponent + 4 * i));
        const __m128i x01 = _mm_unpacklo_epi8(r, e), x23 = _mm_unpackhi_epi8(r, e);  // rotl(w, 1) per lane
        const __m128i w01 = _mm_or_si128(_mm_srli_epi16(x01, 1), _mm_slli_epi16(x01, 15));
        const __m128i w23 = _mm_or_si128(_mm_srli_epi16(x23, 1), _mm_slli_epi16(x23, 15));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 8 * i), w01);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 8 * i + 16), w23);
        lanes.add(w01, w23);
    }
    sum = lanes.finish();
#endif
    for (size_t j = 4 * i; j < n / 2; ++j) {
        const unsigned x = static_cast<unsigned>(exponent[j]) << 8 | rest[j];  // rotl(w, 1)
        const uint16_t w = static_cast<uint16_t>((x >> 1) | (x << 15));
        std::memcpy(out + 2 * j, &w, 2);
    }
    if (n & 1) out[n - 1] = rest[n / 2];
    for (; 8 * i + 8 <= n; ++i) sum += word_at(out + 8 * i, 8) * (2 * i + 1);
    if (8 * i < n) sum += word_at(out + 8 * i, n - 8 * i) * (2 * i + 1);
    return sum;
}

const char* restore(const uint8_t* stored, size_t stored_len, size_t n, uint8_t* out, uint64_t* sum) {
    const size_t rest = (n + 1) / 2, words = n / 2;
    if (stored_len < rest + 4) return "a block shorter than its rest plane and piece count";
    uint32_t k;
    std::memcpy(&k, stored + rest, 4);
    if (k > words || (k == 0) != (words == 0) || stored_len - rest - 4 < 8 * size_t{k})
        return "a damaged piece table";
    thread_local std::vector<uint8_t> exponent;
    if (exponent.size() < words) exponent.resize(words);
    const uint8_t* table = stored + rest + 4;
    size_t at = rest + 4 + 8 * size_t{k}, done = 0;
    for (uint32_t i = 0; i < k; ++i) {
        uint32_t count, size;
        std::memcpy(&count, table + 8 * i, 4);
        std::memcpy(&size, table + 8 * i + 4, 4);
        if (!count || count > words - done || size > stored_len - at) return "a damaged piece table";
        if (const char* why = decode_piece(stored + at, size, count, exponent.data() + done)) return why;
        done += count;
        at += size;
    }
    if (done != words || at != stored_len) return "a damaged piece table";
    *sum = join(stored, exponent.data(), n, out);
    return nullptr;
}

}  // namespace k3::planes
