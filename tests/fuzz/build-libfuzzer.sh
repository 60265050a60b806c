#!/usr/bin/env bash
# build-libfuzzer.sh SRC DIR: configures DIR as a clang build of SRC with
# LYNX_FUZZ=ON (once; later runs only rebuild) and builds every fuzz
# harness there (target fuzz_all), binaries in DIR/bin.
#
# Exit 77 with the reason when clang or its libFuzzer is missing (the
# ctest fixture fuzz_libfuzzer_build: the fuzz_*.libfuzzer tests skip);
# `make fuzz` fails on it. LYNX_FUZZ_JOBS: parallel jobs (default nproc).
set -euo pipefail
if (($# != 2)); then
  echo "usage: $0 SRC DIR" >&2
  exit 2
fi
src=$1 dir=$2
CC=${LYNX_FUZZ_CC:-clang}
skip() {
  echo "SKIP: $* (deploy/install-deps.sh installs clang; docs/fuzzing.md)"
  exit 77
}
command -v "$CC" >/dev/null || skip "no $CC on PATH: the libFuzzer harnesses are not built"
probe=$(mktemp -d "${TMPDIR:-/tmp}/lynx-fuzz-probe.XXXXXX")
trap 'rm -rf "$probe"' EXIT
printf '%s\n' '#include <stddef.h>' '#include <stdint.h>' \
  'int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }' \
  >"$probe/p.c"
"$CC" -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" \
  >"$probe/log" 2>&1 ||
  skip "$CC cannot link -fsanitize=fuzzer,address,undefined: $(head -c 300 "$probe/log")"
if [[ ! -f $dir/CMakeCache.txt ]]; then
  cmake -S "$src" -B "$dir" -DCMAKE_C_COMPILER="$CC" -DLYNX_FUZZ=ON \
    -DLYNX_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$probe/cmake.log" 2>&1 ||
    { cat "$probe/cmake.log"; exit 1; }
fi
cmake --build "$dir" --target fuzz_all -j "${LYNX_FUZZ_JOBS:-$(nproc)}"
