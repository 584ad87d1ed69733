#include "planes.h"

#include <cstring>

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

// The 4 bytes of a at the even bytes of a word: b0 b1 b2 b3 -> b0 0 b1 0 b2 0 b3 0.
inline uint64_t spread(uint32_t a) {
    uint64_t x = a;
    x = (x | (x << 16)) & 0x0000FFFF0000FFFFull;
    x = (x | (x << 8)) & 0x00FF00FF00FF00FFull;
    return x;
}

}  // namespace

uint64_t checksum(const uint8_t* data, size_t n) {
    uint64_t sum = 0;
    size_t i = 0;
    for (; 8 * i + 8 <= n; ++i) sum += word_at(data + 8 * i, 8) * (2 * i + 1);
    if (8 * i < n) sum += word_at(data + 8 * i, n - 8 * i) * (2 * i + 1);
    return sum;
}

uint64_t join(const uint8_t* low, const uint8_t* high, size_t n, uint8_t* out) {
    uint64_t sum = 0;
    size_t i = 0;  // output word index: bytes [8i, 8i + 8) come from low/high [4i, 4i + 4)
#if defined(__SSE2__)
    for (; 8 * i + 32 <= n; i += 4) {  // 16 + 16 source bytes -> 32 output bytes, then their 4 words summed
        const __m128i l = _mm_loadu_si128(reinterpret_cast<const __m128i*>(low + 4 * i));
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(high + 4 * i));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 8 * i), _mm_unpacklo_epi8(l, h));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 8 * i + 16), _mm_unpackhi_epi8(l, h));
        for (size_t k = 0; k < 4; ++k) sum += word_at(out + 8 * (i + k), 8) * (2 * (i + k) + 1);
    }
#endif
    for (; 8 * i + 8 <= n; ++i) {
        uint32_t l, h;
        std::memcpy(&l, low + 4 * i, 4);
        std::memcpy(&h, high + 4 * i, 4);
        const uint64_t w = spread(l) | (spread(h) << 8);
        std::memcpy(out + 8 * i, &w, 8);
        sum += w * (2 * i + 1);
    }
    for (size_t b = 8 * i; b < n; ++b) out[b] = (b & 1) ? high[b / 2] : low[b / 2];
    if (8 * i < n) sum += word_at(out + 8 * i, n - 8 * i) * (2 * i + 1);
    return sum;
}

}  // namespace k3::planes
