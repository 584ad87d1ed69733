#!/usr/bin/env bash
# `make neon-check`: prove the NEON backend gives the scalar backend's bytes, on this x86-64 machine.
#
# 1. Installs the aarch64 cross compiler and qemu user-mode emulation from Debian if they are missing
#    (needs root, as CI is; otherwise says what to install).
# 2. Builds native/test_driver.cpp natively and runs it (scalar, plus any x86 SIMD backend present and
#    supported by this CPU). Skip with NEON_CHECK_NATIVE=0.
# 3. Cross-compiles the driver with native/neon.cpp for aarch64 (static), runs it under qemu-aarch64,
#    and fails on any byte that differs.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=build/neon-check
CXXFLAGS_COMMON=(-O2 -ffp-contract=off -fno-fast-math -std=c++17 -Wall -Wextra -Inative)
PACKAGES=(g++-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)

say() { printf 'neon-check: %s\n' "$*"; }
die() { printf 'neon-check: ERROR: %s\n' "$*" >&2; exit 1; }

# The first FAIL lines of a driver log and its summary (no pipe: a closed pipe must not hide the error).
show_failures() {
    awk '/^(FAIL|     first)/ && shown++ < 40' "$1"
    tail -n 7 "$1"
}

qemu_bin() { command -v qemu-aarch64 || command -v qemu-aarch64-static || true; }

have_tools() {
    command -v aarch64-linux-gnu-g++ >/dev/null && [ -n "$(qemu_bin)" ] &&
        [ -e /usr/aarch64-linux-gnu/include/stdio.h ]
}

if ! have_tools; then
    if [ "$(id -u)" != 0 ]; then
        die "the aarch64 cross toolchain or qemu is missing; as root run:
    apt-get update && apt-get install -y ${PACKAGES[*]}"
    fi
    say "installing ${PACKAGES[*]} from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null ||
        die "apt-get install ${PACKAGES[*]} failed"
    have_tools || die "still missing aarch64-linux-gnu-g++ or qemu-aarch64 after installing ${PACKAGES[*]}"
fi

mkdir -p "$OUT/x86" "$OUT/aarch64"

# ---- native build: scalar (and x86 SIMD backends whose sources exist) ----
if [ "${NEON_CHECK_NATIVE:-1}" != 0 ]; then
    native_src=(native/test_driver.cpp native/common.cpp native/scalar.cpp native/cpu_features.cpp)
    native_defs=()
    case "$(uname -m)" in
        x86_64 | amd64)
            # Each SIMD file is compiled alone with its own instruction-set flags, as CMakeLists.txt does.
            objs=()
            for backend in avx2 avx512; do
                [ -f "native/$backend.cpp" ] || continue
                case $backend in
                    avx2) isa=(-mavx2 -mfma) ;;
                    avx512) isa=(-mavx512f -mavx512bw -mavx512vl -mavx2 -mfma) ;;
                esac
                g++ "${CXXFLAGS_COMMON[@]}" "${isa[@]}" -c "native/$backend.cpp" -o "$OUT/x86/$backend.o"
                objs+=("$OUT/x86/$backend.o")
                native_defs+=("-DK3_HAVE_${backend^^}")
            done
            ;;
        *) objs=() ;;
    esac
    say "native $(uname -m) build: g++ ${CXXFLAGS_COMMON[*]} ${native_defs[*]:-}"
    g++ "${CXXFLAGS_COMMON[@]}" "${native_defs[@]}" "${native_src[@]}" "${objs[@]}" -o "$OUT/x86/test_driver"
    "$OUT/x86/test_driver" >"$OUT/x86/log.txt" || {
        show_failures "$OUT/x86/log.txt"
        die "native driver found a mismatch (full log: $OUT/x86/log.txt)"
    }
    say "native run: $(tail -n 1 "$OUT/x86/log.txt")"
fi

# ---- aarch64 build under qemu: NEON against scalar ----
CROSS=aarch64-linux-gnu-g++
say "cross build: $CROSS ${CXXFLAGS_COMMON[*]} -static -DK3_HAVE_NEON"
# The NEON file and the driver must compile without a single warning.
$CROSS "${CXXFLAGS_COMMON[@]}" -Werror -c native/neon.cpp -o "$OUT/aarch64/neon.o"
$CROSS "${CXXFLAGS_COMMON[@]}" -Werror -DK3_HAVE_NEON -c native/test_driver.cpp -o "$OUT/aarch64/test_driver.o"
$CROSS "${CXXFLAGS_COMMON[@]}" -c native/common.cpp -o "$OUT/aarch64/common.o"
$CROSS "${CXXFLAGS_COMMON[@]}" -c native/scalar.cpp -o "$OUT/aarch64/scalar.o"
$CROSS -static "$OUT"/aarch64/{test_driver,neon,common,scalar}.o -o "$OUT/aarch64/test_driver"

QEMU=$(qemu_bin)
say "running under $(basename "$QEMU") ($("$QEMU" --version | sed -n 1p))"
if ! "$QEMU" "$OUT/aarch64/test_driver" >"$OUT/aarch64/log.txt"; then
    show_failures "$OUT/aarch64/log.txt"
    die "NEON differs from scalar (full log: $OUT/aarch64/log.txt)"
fi
grep -E '^(k3 kernel|fp environment|summary|ALL)' "$OUT/aarch64/log.txt"
if [ "${NEON_CHECK_NATIVE:-1}" != 0 ]; then
    # Same seed, same cases: scalar must give the same bytes on x86-64 and on aarch64.
    native_digest=$(grep '^summary: scalar output digest' "$OUT/x86/log.txt")
    arm_digest=$(grep '^summary: scalar output digest' "$OUT/aarch64/log.txt")
    [ "$native_digest" = "$arm_digest" ] ||
        die "scalar outputs differ between $(uname -m) ($native_digest) and aarch64 ($arm_digest)"
    say "scalar outputs are byte-identical on $(uname -m) and aarch64"
fi
if [ "${NEON_CHECK_VERBOSE:-0}" != 0 ]; then cat "$OUT/aarch64/log.txt"; fi
say "per-case lines: $OUT/aarch64/log.txt"
tail -n 1 "$OUT/aarch64/log.txt"
