#!/usr/bin/env bash
# The test suite on a busy machine: CI may run on a developer's machine that
# is doing other work, and a test that flakes there blocks a landing. This
# runs ctest with LYNX_HOGS CPU hogs (default: one per core) spinning
# beside it, as `make test-busy` does; the hogs end with it, however it
# ends. Extra arguments go to ctest (e.g. -R integration).
#
#   tests/run-busy.sh BUILD_DIR [CTEST_ARG...]
set -euo pipefail
BUILD=${1:?usage: tests/run-busy.sh BUILD_DIR [CTEST_ARG...]}
shift
HOGS=${LYNX_HOGS:-$(nproc)}
[[ $HOGS =~ ^[0-9]+$ ]] || { echo "LYNX_HOGS='$HOGS' is not a number" >&2; exit 2; }
hogs=()
stop_hogs() {
  ((${#hogs[@]})) && kill "${hogs[@]}" 2>/dev/null
  wait "${hogs[@]}" 2>/dev/null || true
}
trap stop_hogs EXIT
for ((i = 0; i < HOGS; i++)); do
  yes >/dev/null &
  hogs+=($!)
done
echo "run-busy: $HOGS CPU hogs (pids ${hogs[*]}) beside the suite" >&2
cd "$BUILD"
ctest --output-on-failure -j 1 "$@"
