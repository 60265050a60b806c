#!/usr/bin/env bash
# The tests on a busy machine: CI may run on a developer's machine that is
# doing other work, and a test that flakes there blocks a landing. This
# runs ctest with LYNX_HOGS CPU hogs (default: one per core) spinning
# beside it, as `make test-busy` does (which configures the build at time
# scale 3 first: docs/testing.md); the hogs end with it, however it ends.
# TIER is quick (the quick tier, label quick) or all; extra arguments go to
# ctest (e.g. -R integration). Skips are listed and checked as every make
# test goal does (tests/check-skips.py).
#
#   tests/run-busy.sh BUILD_DIR quick|all [CTEST_ARG...]
set -uo pipefail
BUILD=${1:?usage: tests/run-busy.sh BUILD_DIR quick|all [CTEST_ARG...]}
TIER=${2:?usage: tests/run-busy.sh BUILD_DIR quick|all [CTEST_ARG...]}
shift 2
case $TIER in
quick) sel=(-L '^quick$') ;;
all) sel=() ;;
*) echo "run-busy: tier '$TIER': want quick or all" >&2; exit 2 ;;
esac
HOGS=${LYNX_HOGS:-$(nproc)}
[[ $HOGS =~ ^[0-9]+$ ]] || { echo "LYNX_HOGS='$HOGS' is not a number" >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD=$(cd "$BUILD" && pwd) || exit 2
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
echo "run-busy: $HOGS CPU hogs (pids ${hogs[*]}) beside the $TIER tier, time scale $(cat "$BUILD/lynx-test-scale" 2>/dev/null || echo '?')" >&2
(cd "$BUILD" && ctest --output-on-failure -j "${TEST_JOBS:-$(nproc)}" \
  --output-junit "$BUILD/junit-busy.xml" ${sel[@]+"${sel[@]}"} "$@")
rc=$?
python3 "$here/check-skips.py" "$BUILD" "$BUILD/junit-busy.xml" || rc=1
exit "$rc"
