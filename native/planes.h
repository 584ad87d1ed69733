// Byte planes of the lossless trunk codec (k3core/io/codec.py): a block of n bytes is stored as its
// even bytes (the low plane, verbatim) and its odd bytes (the high plane, entropy-coded elsewhere).
// Not kernels: storage only, one implementation, no backend variants.
#pragma once

#include <cstddef>
#include <cstdint>

namespace k3::planes {

// The block checksum: words w_i = bytes [8i, 8i + 8) little-endian, the last zero-padded;
// sum of w_i * (2i + 1) mod 2^64. Any single changed byte changes it (the multiplier is odd).
uint64_t checksum(const uint8_t* data, size_t n);

// out[2j] = low[j], out[2j + 1] = high[j] for the n bytes of out (low has (n + 1) / 2 bytes, high
// n / 2); returns checksum(out, n), computed while writing.
uint64_t join(const uint8_t* low, const uint8_t* high, size_t n, uint8_t* out);

}  // namespace k3::planes
