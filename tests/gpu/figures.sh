#!/usr/bin/env bash
# figures.sh - the GPU figures, second after prove.sh, in one call that
# fits 5 minutes (make gpu-figures; docs/gpu.md, "One command on a GPU
# host"): bench/gpu.sh at one size (64 B), one under-load rate and 3 s
# runs, then the LeNet part of bench/paper-gpu.sh at 3 s, each bounded by
# its share of FIGURES_BUDGET_S (300). Their results go to bench/results/
# as the benchmarks write them; this prints the lines that hold the
# targets (GPU over shm round trip <= 19 us p50 and <= 0.5x the
# host-centric server; LeNet >= 1.25x the host-centric baseline).
#
#   tests/gpu/figures.sh [BUILD_DIR]    BUILD_DIR: build, or .gpu
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" 2>/dev/null && pwd) || {
  echo "figures: no build directory ${1:-$ROOT/build}" >&2
  exit 2
}
BUDGET=${FIGURES_BUDGET_S:-300}
if [[ -z ${LYNX_FASHION_MNIST:-} && -r $ROOT/.gpu/data/fashion-mnist/t10k-images-idx3-ubyte.gz ]]; then
  export LYNX_FASHION_MNIST=$ROOT/.gpu/data/fashion-mnist
fi
rc=0
echo "== bench/gpu.sh (SIZES=64 RATES=10000 DURATION=3), at most $((BUDGET * 3 / 5)) s"
timeout -k 5 $((BUDGET * 3 / 5)) env SIZES=64 RATES=10000 DURATION=3 \
  bash "$ROOT/bench/gpu.sh" "$BUILD" || rc=1
echo "== bench/paper-gpu.sh (PARTS=lenet DURATION=3), at most $((BUDGET * 2 / 5 - 10)) s"
timeout -k 5 $((BUDGET * 2 / 5 - 10)) env PARTS=lenet DURATION=3 \
  bash "$ROOT/bench/paper-gpu.sh" "$BUILD" || rc=1
echo "== figures: $( ((rc)) && echo 'a benchmark failed or ran out of time (above)' || echo done); results in bench/results/"
exit "$rc"
