// Byte planes of the lossless trunk codec (k3core/io/codec.py): a block of n bytes is n / 2 little-endian
// 16-bit words w (BF16: sign, 8 exponent bits, 7 mantissa bits), each rotated left one bit, x = rotl(w, 1),
// so that its bytes are
//   exponent  e = x >> 8   = the 8 exponent bits            (entropy-coded elsewhere)
//   rest      r = x & 0xFF = mantissa << 1 | sign            (noise, verbatim)
// stored as two planes of one byte per word; an odd n's last byte follows the rest plane.
// Not kernels: storage only, one implementation, no backend variants.
#pragma once

#include <cstddef>
#include <cstdint>

namespace k3::planes {

// The block checksum: words w_i = bytes [8i, 8i + 8) little-endian, the last zero-padded;
// sum of w_i * (2i + 1) mod 2^64. Any single changed byte changes it (the multiplier is odd).
uint64_t checksum(const uint8_t* data, size_t n);

// The n bytes of out from the rest plane `rest` ((n + 1) / 2 bytes: one per word, then an odd n's last
// byte) and the exponent plane `exponent` (n / 2 bytes); returns checksum(out, n), computed while writing.
uint64_t join(const uint8_t* rest, const uint8_t* exponent, size_t n, uint8_t* out);

// A planes block's n restored bytes into out from its stored bytes (`stored`, `stored_len` of them):
//   [rest plane: (n + 1) / 2 bytes][k: u32][k x (exponents: u32, bytes: u32)][k pieces (exponent_code.h)]
// the pieces' exponents, in order, being the exponent plane. *sum gets checksum(out, n). Returns nullptr,
// or what is malformed (the caller names the block).
const char* restore(const uint8_t* stored, size_t stored_len, size_t n, uint8_t* out, uint64_t* sum);

}  // namespace k3::planes
