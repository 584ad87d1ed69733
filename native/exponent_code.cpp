#include "exponent_code.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace k3::planes {
namespace {

constexpr uint32_t kMask = (1u << kMaxBits) - 1;
constexpr size_t kFixedHeader = 2 + 12;  // f, l, three stream lengths

uint32_t get_u32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

void put_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

size_t quarter(size_t m) { return (m + 3) / 4; }

// Huffman code lengths of the 256 counts, none longer than kMaxBits; at least 1 for every symbol that
// occurs (a lone symbol gets 1).
void code_lengths(const uint64_t* count, uint8_t* len) {
    std::memset(len, 0, 256);
    std::vector<int> used;
    for (int s = 0; s < 256; ++s)
        if (count[s]) used.push_back(s);
    if (used.size() == 1) {
        len[used[0]] = 1;
        return;
    }
    // The two-queue construction over symbols sorted by count: leaves 0 … n-1, inner nodes n … 2n-2.
    std::sort(used.begin(), used.end(), [&](int a, int b) { return count[a] != count[b] ? count[a] < count[b] : a < b; });
    const size_t n = used.size();
    std::vector<uint64_t> weight(2 * n - 1);
    std::vector<size_t> parent(2 * n - 1, 0);
    for (size_t i = 0; i < n; ++i) weight[i] = count[used[i]];
    size_t leaf = 0, inner = n, next = n;
    auto take = [&]() {
        if (leaf < n && (inner >= next || weight[leaf] <= weight[inner])) return leaf++;
        return inner++;
    };
    for (; next < 2 * n - 1; ++next) {
        const size_t a = take(), b = take();
        weight[next] = weight[a] + weight[b];
        parent[a] = parent[b] = next;
    }
    std::vector<int> depth(2 * n - 1, 0);
    for (size_t i = 2 * n - 2; i-- > 0;) depth[i] = depth[parent[i]] + 1;
    // Length-limit: cap at kMaxBits, then lengthen the least frequent shorter codes until the Kraft sum
    // (in units of 2^-kMaxBits) is back to at most 1.
    int64_t kraft = 0;
    for (size_t i = 0; i < n; ++i) {
        len[used[i]] = static_cast<uint8_t>(std::min(depth[i], kMaxBits));
        kraft += int64_t{1} << (kMaxBits - len[used[i]]);
    }
    while (kraft > (int64_t{1} << kMaxBits))
        for (size_t i = 0; i < n && kraft > (int64_t{1} << kMaxBits); ++i)
            if (len[used[i]] < kMaxBits) {
                kraft -= int64_t{1} << (kMaxBits - len[used[i]] - 1);
                ++len[used[i]];
            }
}

uint32_t reverse_bits(uint32_t c, int n) {
    uint32_t r = 0;
    for (int i = 0; i < n; ++i) r |= ((c >> i) & 1u) << (n - 1 - i);
    return r;
}

// Canonical codes (bit-reversed) of `len`; false if the lengths over-subscribe the code space.
bool canonical_codes(const uint8_t* len, uint16_t* code) {
    uint32_t per[kMaxBits + 1] = {0};
    for (int s = 0; s < 256; ++s) {
        if (len[s] > kMaxBits) return false;
        if (len[s]) ++per[len[s]];
    }
    uint32_t next[kMaxBits + 1] = {0}, c = 0, kraft = 0;
    for (int l = 1; l <= kMaxBits; ++l) {
        c = (c + per[l - 1]) << 1;
        next[l] = c;
        kraft += per[l] << (kMaxBits - l);
    }
    if (kraft > (1u << kMaxBits)) return false;
    for (int s = 0; s < 256; ++s)
        if (len[s]) code[s] = static_cast<uint16_t>(reverse_bits(next[len[s]]++, len[s]));
    return true;
}

// A decode-table entry: the bits its exponents take (byte 0, so that a shift by the entry itself consumes
// them), how many exponents (byte 1), the first one's bits (byte 2), up to four exponents (bytes 4-7).
// Holes of an incomplete code decode to exponent 0 in kMaxBits bits: only a damaged stream reaches one,
// and the block checksum catches it.
uint64_t entry(uint32_t exps, unsigned n, unsigned bits, unsigned first) {
    return uint64_t{bits} | uint64_t{n} << 8 | uint64_t{first} << 16 | uint64_t{exps} << 32;
}

void build_table(const uint8_t* len, const uint16_t* code, uint64_t* table) {
    uint16_t one[1u << kMaxBits];  // single-exponent table: exponent | bits << 8
    std::fill(one, one + (1u << kMaxBits), static_cast<uint16_t>(kMaxBits << 8));
    for (int s = 0; s < 256; ++s)
        if (len[s])
            for (uint32_t k = code[s]; k < (1u << kMaxBits); k += 1u << len[s])
                one[k] = static_cast<uint16_t>(s | len[s] << 8);
    for (uint32_t idx = 0; idx <= kMask; ++idx) {  // greedily as many whole codes as the window holds
        uint32_t exps = 0;
        unsigned n = 0, bits = 0;
        const unsigned first = one[idx] >> 8;
        while (n < 4) {
            const uint16_t o = one[(idx >> bits) & kMask];
            const unsigned b = o >> 8;
            if (n && bits + b > static_cast<unsigned>(kMaxBits)) break;  // that code runs past the window
            exps |= static_cast<uint32_t>(o & 0xFF) << (8 * n);
            bits += b;
            ++n;
            if (bits >= static_cast<unsigned>(kMaxBits)) break;
        }
        table[idx] = entry(exps, n, bits, first);
    }
}

// Stream bytes as little-endian 64-bit loads at any bit position; `safe` zero-fills past the end (a
// stream that needed it is damaged: its position ends past its bytes, which the caller checks).
struct Stream {
    const uint8_t* start;
    size_t bytes;

    uint64_t at(size_t pos) const {  // the 57+ bits from bit `pos`, unchecked: pos / 8 + 8 <= bytes
        uint64_t w;
        std::memcpy(&w, start + (pos >> 3), 8);
        return w >> (pos & 7);
    }
    uint64_t safe(size_t pos) const {
        if ((pos >> 3) + 8 <= bytes) return at(pos);
        uint64_t w = 0;
        for (size_t i = pos >> 3, k = 0; i < bytes && k < 8; ++i, ++k) w |= static_cast<uint64_t>(start[i]) << (8 * k);
        return w >> (pos & 7);
    }
};

}  // namespace

size_t piece_bound(size_t m) { return kFixedHeader + 128 + (m * kMaxBits + 7) / 8 + 4 * 8; }

size_t encode_piece(const uint8_t* e, size_t m, uint8_t* out) {
    uint64_t count[256] = {0};
    for (size_t i = 0; i < m; ++i) ++count[e[i]];
    uint8_t len[256];
    uint16_t code[256] = {0};
    code_lengths(count, len);
    canonical_codes(len, code);
    int f = 0, l = 255;
    while (!len[f]) ++f;
    while (!len[l]) --l;
    out[0] = static_cast<uint8_t>(f);
    out[1] = static_cast<uint8_t>(l);
    uint8_t* at = out + 2;
    for (int s = f; s <= l; s += 2) *at++ = static_cast<uint8_t>(len[s] | (s + 1 <= l ? len[s + 1] << 4 : 0));
    uint8_t* sizes = at;
    at += 12;
    if (f == l) {  // one distinct exponent: no streams
        std::memset(sizes, 0, 12);
        return static_cast<size_t>(at - out);
    }
    const size_t q = quarter(m);
    for (size_t k = 0; k < 4; ++k) {
        const uint8_t* from = at;
        uint64_t acc = 0;
        unsigned used = 0;
        for (size_t i = std::min(m, k * q); i < std::min(m, (k + 1) * q); ++i) {
            acc |= static_cast<uint64_t>(code[e[i]]) << used;
            used += len[e[i]];
            if (used >= 32) {
                put_u32(at, static_cast<uint32_t>(acc));
                at += 4;
                acc >>= 32;
                used -= 32;
            }
        }
        for (; used > 0; used = used > 8 ? used - 8 : 0, acc >>= 8) *at++ = static_cast<uint8_t>(acc);
        if (k < 3) put_u32(sizes + 4 * k, static_cast<uint32_t>(at - from));
    }
    return static_cast<size_t>(at - out);
}

// x86-64 before BMI2 shifts by a variable count only through CL, which serialises the four streams: GCC
// builds the function twice and picks at load time (the same results either way).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
const char* decode_piece(const uint8_t* in, size_t len_in, size_t m, uint8_t* e) {
    if (len_in < 2) return "a piece shorter than its header";
    const unsigned f = in[0], l = in[1];
    if (l < f) return "a piece whose exponent range is empty";
    const size_t nibbles = (l - f + 2) / 2;
    if (len_in < 2 + nibbles + 12) return "a piece shorter than its header";
    uint8_t len[256] = {0};
    for (unsigned s = f; s <= l; ++s) len[s] = (in[2 + (s - f) / 2] >> (4 * ((s - f) & 1))) & 15;
    uint16_t code[256] = {0};
    if (!canonical_codes(len, code)) return "code lengths that are not a prefix code";
    if (f == l) {  // one distinct exponent: no streams
        if (len[f] != 1 || len_in != 2 + nibbles + 12 || get_u32(in + 3) | get_u32(in + 7) | get_u32(in + 11))
            return "a one-exponent piece with streams";
        std::memset(e, static_cast<int>(f), m);
        return nullptr;
    }
    uint64_t table[1u << kMaxBits];  // 16 KiB on the stack: as a thread_local it cost a TLS lookup in the loop
    build_table(len, code, table);
    const uint8_t* sizes = in + 2 + nibbles;
    Stream st[4];
    size_t at = 2 + nibbles + 12;
    for (int k = 0; k < 4; ++k) {
        const size_t n = k < 3 ? get_u32(sizes + 4 * k) : len_in - at;
        if (n > len_in - at) return "stream lengths that do not fit the piece";
        st[k] = {in + at, n};
        at += n;
    }
    const size_t q = quarter(m);
    uint8_t* o[4];
    uint8_t* stop[4];
    size_t pos[4] = {0, 0, 0, 0};
    for (size_t k = 0; k < 4; ++k) {
        o[k] = e + std::min(m, k * q);
        stop[k] = e + std::min(m, (k + 1) * q);
    }
    // The hot loop: four streams in lockstep, five lookups each per load (5 x kMaxBits <= 57 bits). A
    // lookup stores four bytes and keeps as many as it decoded (1 … 4), and takes at most kMaxBits bits,
    // so `rounds` counts rounds that stay inside every stream's output and input whatever they decode;
    // then it is counted again. The state lives in locals (a byte store could alias anything).
    const uint64_t* __restrict tab = table;
    for (;;) {
        size_t rounds = SIZE_MAX;
        for (int k = 0; k < 4; ++k) {
            const size_t room = static_cast<size_t>(stop[k] - o[k]), left = st[k].bytes - std::min(st[k].bytes, pos[k] >> 3);
            rounds = std::min({rounds, room < 20 ? 0 : (room - 20) / 20 + 1, left < 16 ? 0 : (left - 16) / 7 + 1});
        }
        if (rounds < 4) break;
        // bit positions from the piece's start, so one base register serves the four streams
        uint8_t *o0 = o[0], *o1 = o[1], *o2 = o[2], *o3 = o[3];
        size_t q0 = pos[0] + 8 * static_cast<size_t>(st[0].start - in), q1 = pos[1] + 8 * static_cast<size_t>(st[1].start - in);
        size_t q2 = pos[2] + 8 * static_cast<size_t>(st[2].start - in), q3 = pos[3] + 8 * static_cast<size_t>(st[3].start - in);
        const Stream all{in, len_in};
        for (size_t r = 0; r < rounds; ++r) {
            uint64_t b0 = all.at(q0), b1 = all.at(q1), b2 = all.at(q2), b3 = all.at(q3);
            for (int i = 0; i < 5; ++i) {
                const uint64_t e0 = tab[b0 & kMask], e1 = tab[b1 & kMask], e2 = tab[b2 & kMask], e3 = tab[b3 & kMask];
                b0 >>= e0 & 63, b1 >>= e1 & 63, b2 >>= e2 & 63, b3 >>= e3 & 63;
                q0 += e0 & 0xFF, q1 += e1 & 0xFF, q2 += e2 & 0xFF, q3 += e3 & 0xFF;
                const uint32_t x0 = static_cast<uint32_t>(e0 >> 32), x1 = static_cast<uint32_t>(e1 >> 32);
                const uint32_t x2 = static_cast<uint32_t>(e2 >> 32), x3 = static_cast<uint32_t>(e3 >> 32);
                std::memcpy(o0, &x0, 4), o0 += (e0 >> 8) & 0xFF;
                std::memcpy(o1, &x1, 4), o1 += (e1 >> 8) & 0xFF;
                std::memcpy(o2, &x2, 4), o2 += (e2 >> 8) & 0xFF;
                std::memcpy(o3, &x3, 4), o3 += (e3 >> 8) & 0xFF;
            }
        }
        o[0] = o0, o[1] = o1, o[2] = o2, o[3] = o3;
        pos[0] = q0 - 8 * static_cast<size_t>(st[0].start - in), pos[1] = q1 - 8 * static_cast<size_t>(st[1].start - in);
        pos[2] = q2 - 8 * static_cast<size_t>(st[2].start - in), pos[3] = q3 - 8 * static_cast<size_t>(st[3].start - in);
    }
    for (int k = 0; k < 4; ++k) {  // each stream's tail, one exponent per lookup
        for (uint8_t* x = o[k]; x < stop[k]; ++x) {
            const uint64_t t = tab[st[k].safe(pos[k]) & kMask];
            *x = static_cast<uint8_t>(t >> 32);
            pos[k] += (t >> 16) & 0xFF;
        }
        if (pos[k] > st[k].bytes * 8) return "a stream that ends before its exponents do";
    }
    return nullptr;
}

}  // namespace k3::planes
