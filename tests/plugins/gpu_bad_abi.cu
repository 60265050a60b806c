/* A GPU module built for another GPU ABI version (99): the agent refuses
 * it with both versions (integration.plugin_sdk, unit_cuda_backend). Its
 * kernels are the SDK's, over a handler that drops every request. */
#include <lynx/lynx_kernel.cuh>

static __device__ int drop(const struct lynx_cuda_launch *l, struct lynx_mq *mq,
                           const struct lynx_msg *req, int *replied) {
  (void)l;
  *replied = 0;
  return lynx_block_drop(mq, req->tag) == -11 ? LYNX_GPU_AGAIN : 0;
}

extern "C" __device__ const struct lynx_gpu_app_info lynx_gpu_app_info = {
    99u,
    sizeof(struct lynx_gpu_app_info),
    sizeof(struct lynx_cuda_launch),
    sizeof(struct lynx_cuda_kctl),
    sizeof(struct lynx_mq),
    0,
    "gpu-bad-abi",
    "",
    "built for GPU ABI 99"};
extern "C" {
LYNX_GPU_KERNELS(lynx_gpu_kernel, lynx_gpu_kernel_wide, drop)
}
