// What the SIMD backends share: how a product's folded lanes are finished, which (rows, tokens) tiles a call runs
// and in what order (AVX-512 and NEON), which (tokens, columns) tiles attention's column dots run (all three).
// It only schedules work; every tile computes its own rows' and tokens' lanes, so the order never changes a bit.
#pragma once

#include <cstddef>
#include <type_traits>

#include "kernels.h"

namespace k3 {

// What row o's folded lanes v become in y (kernels.h): the float32 of v; of the int8 product's scale times v; or,
// for dots_f64, v itself.
struct Plain {
    float operator()(size_t, double v) const { return to_f32(v); }
};
struct RowScaled {
    const float* scale;
    float operator()(size_t o, double v) const { return to_f32(static_cast<double>(scale[o]) * v); }
};
struct Unrounded {
    double operator()(size_t, double v) const { return v; }
};

// Tiles: R rows x TT tokens share every widened weight block; each tile type sets kRowsGemv (R for one
// token) and kRowsGemm x kTokens (R x TT for a batch). Batches walk 8 tiles of rows at a time, all token
// blocks over those rows, so the chunk's weights stay in cache while x streams. Every loop over a tile's
// accumulator array is fully unrolled (#pragma GCC unroll), the final one too: one rolled loop and GCC
// keeps the array in memory, storing every accumulator on every step.

template <class Tile>
void for_tiles(size_t r0, size_t r1, size_t tokens, const Tile& tile) {
    if (tokens == 1) {
        size_t o = r0;
        for (; o + Tile::kRowsGemv <= r1; o += Tile::kRowsGemv) tile.template run<Tile::kRowsGemv, 1>(o, 0);
        for (; o < r1; ++o) tile.template run<1, 1>(o, 0);
        return;
    }
    const size_t chunk = 8 * Tile::kRowsGemm;
    for (size_t c0 = r0; c0 < r1; c0 += chunk) {
        const size_t c1 = c0 + chunk < r1 ? c0 + chunk : r1;
        for (size_t t = 0; t < tokens; t += Tile::kTokens) {
            const size_t tt = tokens - t < Tile::kTokens ? tokens - t : Tile::kTokens;
            size_t o = c0;
            for (; o + Tile::kRowsGemm <= c1; o += Tile::kRowsGemm)
                tile.template run_tokens<Tile::kRowsGemm>(o, t, tt);
            for (; o < c1; ++o) tile.template run_tokens<1>(o, t, tt);
        }
    }
}

// Attention's column dots (kernels.h) as the SIMD backends walk them: blocks of Tile::kWide columns, then of
// Tile::kNarrow, each for Tile::kTokens tokens at a time and then one. tile.run<HB, W>(t, j) computes columns
// j..j+W-1 of tokens t..t+HB-1; returns the first column left (d % kNarrow of them, for scalar code).
template <class Tile>
size_t for_column_tiles(size_t d, size_t tokens, const Tile& tile) {
    size_t j = 0;
    auto blocks = [&](auto width) {
        constexpr size_t W = decltype(width)::value;
        for (; j + W <= d; j += W) {
            size_t t = 0;
            for (; t + Tile::kTokens <= tokens; t += Tile::kTokens) tile.template run<Tile::kTokens, W>(t, j);
            for (; t < tokens; ++t) tile.template run<1, W>(t, j);
        }
    };
    blocks(std::integral_constant<size_t, Tile::kWide>{});
    blocks(std::integral_constant<size_t, Tile::kNarrow>{});
    return j;
}

}  // namespace k3
