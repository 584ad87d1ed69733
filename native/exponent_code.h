// The exponent planes' entropy code (format 4 of the lossless trunk, k3core/io/codec.py): a canonical
// Huffman code per piece of a block's exponent plane, four interleaved streams, decoded up to four
// exponents per table lookup. Storage only, no backend variants: the same instructions everywhere.
//
// A piece of m exponents (m >= 1) is stored as
//   [f: u8][l: u8]                       the smallest and largest exponent that occurs (f <= l)
//   [(l - f + 2) / 2 bytes]              code lengths of exponents f … l, 4 bits each (f + 2i in the low
//                                        nibble of byte i, f + 2i + 1 in the high one); 0: absent;
//                                        at most kMaxBits; together a prefix code (Kraft sum <= 1)
//   [3 x u32 LE]                         byte lengths of streams 0, 1, 2 (stream 3 is the rest)
//   [stream 0][stream 1][stream 2][stream 3]
// Stream k codes exponents [k q, min(m, (k + 1) q)) with q = ceil(m / 4). Codes are canonical (shorter
// first, equal lengths by exponent), written least significant bit first, each code's bits reversed, so
// a decoder indexes a table with the next kMaxBits bits. A piece of one distinct exponent (f = l, its
// length 1) has no streams: its three lengths are 0 and nothing follows.
#pragma once

#include <cstddef>
#include <cstdint>

namespace k3::planes {

constexpr int kMaxBits = 11;  // the longest code: the decoder's table has 2^kMaxBits entries (16 KiB)

// Bytes encode_piece may write for m exponents, at most.
size_t piece_bound(size_t m);

// The stored piece of exponents e[0 … m) into out (piece_bound(m) bytes); returns the bytes written.
size_t encode_piece(const uint8_t* e, size_t m, uint8_t* out);

// The m exponents of a stored piece (`len` bytes at `in`) into e; nullptr, or what is malformed. A
// damaged stream that still parses decodes to other exponents: the block checksum tells.
const char* decode_piece(const uint8_t* in, size_t len, size_t m, uint8_t* e);

}  // namespace k3::planes
