#!/usr/bin/env bash
# Compiles the device code with nvcc for every architecture the build
# targets, nvcc warnings as errors: the ring header (common/mqueue.h), the
# block I/O library (accel/cuda/lynx_dev.cuh, through ring_device.cu), the
# persistent kernel (accel/cuda/apps.cu, with LeNet's per-element code of
# accel/lenet.h through lenet_dev.cuh). The build compiles apps.cu too when
# LYNX_HAVE_CUDA; this script also checks a LYNX_CUDA=OFF build wherever nvcc
# exists. Skips (77) without nvcc. Nothing runs: it needs no GPU.
set -u
src=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$src/../.." && pwd)
NVCC=${NVCC:-}
for c in "$NVCC" "$(command -v nvcc 2>/dev/null)" /usr/local/cuda/bin/nvcc; do
  [ -n "$c" ] && [ -x "$c" ] && { NVCC=$c; break; }
done
if [ -z "$NVCC" ] || [ ! -x "$NVCC" ]; then
  echo "SKIP: nvcc not found (install the CUDA toolkit to check device builds)"
  exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flags=(-std=c++17 -Werror all-warnings
       -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
       -Xcompiler -Wall,-Wextra,-Werror,-fno-exceptions,-fno-rtti
       -I "$root/common" -I "$root/accel" -I "$root/accel/cuda")
for f in "$src/ring_device.cu" "$root/accel/cuda/apps.cu"; do
  "$NVCC" "${flags[@]}" -c "$f" -o "$out/$(basename "$f" .cu).o" || {
    echo "FAIL: $f does not compile for sm_80/sm_90"
    exit 1
  }
done
echo "mqueue.h, lynx_dev.cuh, lenet.h and apps.cu compile for sm_80 and sm_90 with" \
  "$("$NVCC" --version | tail -1)"
