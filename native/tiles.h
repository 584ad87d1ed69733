// The tile walk the AVX-512 and NEON backends share: which (rows, tokens) tiles a call runs, in what order.
// It only schedules work; every tile computes its own rows' and tokens' lanes, so the order never changes a bit.
#pragma once

#include <cstddef>

namespace k3 {

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

}  // namespace k3
