#!/usr/bin/env bash
# emu-wrappers.sh BIN OUT EMULATOR...: for every program in BIN (a build
# of another architecture: make LYNX_ARCH=arm64), a script of the same name
# in OUT that runs it under EMULATOR (qemu-user), so that the integration
# tests, which run "$LYNX_BIN_DIR/lynx-agent" and the like, run the arm64
# programs where binfmt_misc cannot (a container). Run by the ctest
# fixture emu_wrappers of a cross build (tests/integration/CMakeLists.txt).
set -euo pipefail
if (($# < 3)); then
  echo "usage: $0 BIN OUT EMULATOR [ARG...]" >&2
  exit 2
fi
bin=$(cd "$1" && pwd) out=$2
shift 2
command -v "$1" >/dev/null || {
  echo "SKIP: the emulator $1 is not installed (deploy/install-deps.sh --arm64)"
  exit 77
}
mkdir -p "$out"
rm -f "$out"/*
n=0
for p in "$bin"/*; do
  [[ -f $p && -x $p ]] || continue
  {
    echo '#!/bin/sh'
    printf 'exec'
    printf ' %q' "$@" "$p"
    echo ' "$@"'
  } >"$out/$(basename "$p")"
  chmod +x "$out/$(basename "$p")"
  n=$((n + 1))
done
echo "emu-wrappers: $n programs of $bin wrapped in $out (under $*)"
((n > 0))
