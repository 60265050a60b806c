#!/usr/bin/env bash
# Compiles the ring header for the device with nvcc; skips (77) without nvcc.
set -u
src=$(cd "$(dirname "$0")" && pwd)
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
"$NVCC" -std=c++14 -arch=sm_75 -Werror all-warnings -I "$src/../../common" \
  -c "$src/ring_device.cu" -o "$out/ring_device.o" || exit 1
echo "ring header compiles for sm_75 with $("$NVCC" --version | tail -1)"
