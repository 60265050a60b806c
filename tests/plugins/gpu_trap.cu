/* A GPU module whose kernel faults on purpose: it echoes every request but
 * one that begins with "LYNX-TRAP", on which the block executes a trap
 * (an unspecified launch failure: a sticky error that poisons the GPU's
 * CUDA context, as a wild pointer would). integration.gpu_fault sends it
 * on a GPU host; over the fake runtime its twin (tests/fakegpu) does. */
#include <lynx/lynx_kernel.cuh>

static __device__ int echo_or_trap(const struct lynx_cuda_launch *l,
                                   struct lynx_mq *mq,
                                   const struct lynx_msg *req, int *replied) {
  __shared__ __align__(16) uint8_t head[16];
  int rc;
  (void)l;
  lynx_block_copy(head, req->data, req->len < 9 ? req->len : 9);
  if (lynx_block_any(lynx_block_io_thread() && req->len >= 9 &&
                     head[0] == 'L' && head[1] == 'Y' && head[2] == 'N' &&
                     head[3] == 'X' && head[4] == '-' && head[5] == 'T' &&
                     head[6] == 'R' && head[7] == 'A' && head[8] == 'P'))
    __trap();
  rc = lynx_block_send(mq, req->tag, req->data, req->len);
  *replied = rc == 0;
  return rc == -11 ? LYNX_GPU_AGAIN : 0;
}

LYNX_GPU_APP("gpu-trap", "echoes, and faults on LYNX-TRAP", echo_or_trap)
