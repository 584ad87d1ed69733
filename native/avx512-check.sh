#!/usr/bin/env bash
# Check the AVX-512 backend on a CPU without AVX-512: native/avx512.cpp compiled with its intrinsics emulated by
# SIMDe (Debian's libsimde-dev, header-only, each _mm512_* op written in portable code or AVX2), then run by
# native/test_driver.cpp against the scalar backend, byte for byte, as make neon-check does for NEON under qemu
# (qemu-user has no AVX-512). It checks the lane layout, the tails, the masks and the walk, not the instruction
# timings; on a CPU with AVX-512, tests/native runs the real thing.
#
# The few intrinsics SIMDe 0.7 does not emulate (the widening conversions avx512.cpp uses) are written below in
# scalar code. Installs libsimde-dev when missing and run as root (as CI is); otherwise says what to install.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=build/avx512-check
FLAGS=(-O2 -ffp-contract=off -fno-fast-math -std=c++17 -Wall -Wextra -Inative -I"$OUT")

say() { printf 'avx512-check: %s\n' "$*"; }
die() { printf 'avx512-check: ERROR: %s\n' "$*" >&2; exit 1; }

[ "$(uname -m)" = x86_64 ] || die "an x86-64 check (this machine is $(uname -m))"
if [ ! -e /usr/include/simde/x86/avx512.h ]; then
    [ "$(id -u)" = 0 ] || die "SIMDe is missing; as root run: apt-get update && apt-get install -y libsimde-dev"
    say "installing libsimde-dev from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends libsimde-dev >/dev/null ||
        die "apt-get install libsimde-dev failed"
fi
mkdir -p "$OUT"

cat >"$OUT/emulated_avx512.h" <<'SHIM'
// The AVX-512 intrinsics as SIMDe emulates them, and the widening conversions it does not, in scalar code.
#pragma once
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>
#include <cstdint>

static inline simde__m512d k3_cvtps_pd(simde__m256 a) {
    float f[8];
    double d[8];
    simde_mm256_storeu_ps(f, a);
    for (int i = 0; i < 8; ++i) d[i] = f[i];
    return simde_mm512_loadu_pd(d);
}
static inline simde__m512 k3_cvtph_ps(simde__m256i a) {
    float f[16];
    simde_mm256_storeu_ps(f, simde_mm256_cvtph_ps(simde_mm256_extracti128_si256(a, 0)));
    simde_mm256_storeu_ps(f + 8, simde_mm256_cvtph_ps(simde_mm256_extracti128_si256(a, 1)));
    return simde_mm512_loadu_ps(f);
}
static inline simde__m512i k3_cvtepu8_epi64(simde__m128i a) {
    uint8_t b[16];
    int64_t q[8];
    simde_mm_storeu_si128(reinterpret_cast<simde__m128i*>(b), a);
    for (int i = 0; i < 8; ++i) q[i] = b[i];
    return simde_mm512_loadu_si512(q);
}
static inline simde__m512i k3_cvtepi8_epi32(simde__m128i a) {
    int8_t b[16];
    int32_t q[16];
    simde_mm_storeu_si128(reinterpret_cast<simde__m128i*>(b), a);
    for (int i = 0; i < 16; ++i) q[i] = b[i];
    return simde_mm512_loadu_si512(q);
}
static inline simde__m512d k3_cvtepi32_pd(simde__m256i a) {
    int32_t q[8];
    double d[8];
    simde_mm256_storeu_si256(reinterpret_cast<simde__m256i*>(q), a);
    for (int i = 0; i < 8; ++i) d[i] = q[i];
    return simde_mm512_loadu_pd(d);
}
static inline simde__m256 k3_cvtpd_ps(simde__m512d a) {
    double d[8];
    float f[8];
    simde_mm512_storeu_pd(d, a);
    for (int i = 0; i < 8; ++i) f[i] = static_cast<float>(d[i]);
    return simde_mm256_loadu_ps(f);
}
#define _mm512_cvtps_pd k3_cvtps_pd
#define _mm512_cvtpd_ps k3_cvtpd_ps
#define _mm512_cvtph_ps k3_cvtph_ps
#define _mm512_cvtepu8_epi64 k3_cvtepu8_epi64
#define _mm512_cvtepi8_epi32 k3_cvtepi8_epi32
#define _mm512_cvtepi32_pd k3_cvtepi32_pd
SHIM

sed 's|#include <immintrin.h>|#include "emulated_avx512.h"|' native/avx512.cpp >"$OUT/avx512_emulated.cpp"
grep -q emulated_avx512.h "$OUT/avx512_emulated.cpp" || die "native/avx512.cpp no longer includes <immintrin.h>"
say "building native/avx512.cpp on SIMDe (-mavx2 -mfma -mf16c: SIMDe uses them for the halves)"
# SIMDe's own headers warn (a GCC ABI note, unused parameters): only the driver must build without a warning.
g++ "${FLAGS[@]}" -w -Wno-psabi -mavx2 -mfma -mf16c -c "$OUT/avx512_emulated.cpp" -o "$OUT/avx512.o"
g++ "${FLAGS[@]}" -Werror -DK3_HAVE_AVX512 -DK3_AVX512_EMULATED native/test_driver.cpp native/common.cpp \
    native/scalar.cpp native/cpu_features.cpp "$OUT/avx512.o" -o "$OUT/test_driver"
if ! "$OUT/test_driver" >"$OUT/log.txt"; then
    awk '/^(FAIL|     first)/ && shown++ < 40' "$OUT/log.txt"
    tail -n 7 "$OUT/log.txt"
    die "avx512 (emulated) differs from scalar (full log: $OUT/log.txt)"
fi
grep -E '^(k3 kernel|summary|ALL)' "$OUT/log.txt"
say "per-case lines: $OUT/log.txt"
tail -n 1 "$OUT/log.txt"
