#!/usr/bin/env bash
# pack.sh - carry a CUDA build to a GPU host that has no packages
# (docs/gpu.md, "One command on a GPU host"): the workplace's gpu-pack
# (../shared/tools/gpu-pack, or $LYNX_GPU_PACK) bundles the binaries,
# the libraries that host may lack, sockperf, memcached, jq and curl into
# .gpu/; this adds the Fashion-MNIST test set (t10k, 4.4 MB) that
# gpu_lenet and the LeNet figures read, as .gpu/data/fashion-mnist/, which
# tests/gpu/prove.sh finds by itself, and the build's plug-ins and GPU
# modules (BUILD/plugins: the examples' and the tests' own) as
# .gpu/plugins/, where gpu_fault finds them beside .gpu/bin.
#
#   make LYNX_CUDA=ON BUILD=build-gpu && tests/gpu/pack.sh build-gpu
#   then on the GPU host: bash .gpu/run tests/gpu/prove.sh .gpu/bin
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${1:-build-gpu}
PACK=${LYNX_GPU_PACK:-$ROOT/../shared/tools/gpu-pack}
DATA=${LYNX_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
[[ -x $PACK ]] || { echo "pack: no gpu-pack at $PACK (set LYNX_GPU_PACK)" >&2; exit 2; }
[[ -x $BUILD/bin/lynx-gpu-probe ]] ||
  { echo "pack: $BUILD/bin has no lynx-gpu-probe: build with CUDA first (make LYNX_CUDA=ON BUILD=$BUILD)" >&2; exit 2; }
for f in t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
  [[ -r $DATA/$f ]] || { echo "pack: no $DATA/$f (deploy/install-deps.sh bench installs dataset-fashion-mnist)" >&2; exit 2; }
done
(cd "$ROOT" && "$PACK" "$BUILD")
mkdir -p "$ROOT/.gpu/data/fashion-mnist"
cp "$DATA"/t10k-images-idx3-ubyte.gz "$DATA"/t10k-labels-idx1-ubyte.gz "$ROOT/.gpu/data/fashion-mnist/"
[[ -d $BUILD/plugins ]] && cp -r "$BUILD/plugins" "$ROOT/.gpu/plugins"
du -sh "$ROOT/.gpu" | awk '{print "pack: .gpu is " $1 ", the test set included"}'
