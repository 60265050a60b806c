/* A CUDA module that is no Lynx GPU application: a kernel of its own,
 * without LYNX_GPU_APP's description and kernels. The agent refuses it
 * (integration.plugin_sdk, unit_cuda_backend). */
#include <stdint.h>

extern "C" __global__ void scale(float *v, float k, uint32_t n) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    v[i] *= k;
}
