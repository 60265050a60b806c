/*
 * vector_sum.cu - a GPU application for Lynx-C (docs/writing-apps.md,
 * "GPU applications"): the sum of a vector of 32-bit integers, computed by
 * a whole threadblock, for every request of its service.
 *
 * The handler is all the application is: the SDK's persistent kernel
 * (lynx_kernel.cuh, through LYNX_GPU_APP) polls the mqueues, orders the
 * accesses, honours the lease fence and the stop word and stamps latencies.
 * Built to a fatbin against the installed SDK alone (Makefile), loaded by
 * an agent with --app-load vector-sum=vector-sum.fatbin.
 */
#include <lynx/lynx_kernel.cuh>

#include "vector_sum.h"

/* The request comes through shared memory in chunks of this many bytes:
 * every thread copies (lynx_block_copy: L1-bypassing loads, several in
 * flight), then every thread adds its elements. */
#define VS_CHUNK 4096u

static __device__ int vector_sum(const struct lynx_cuda_launch *l,
                                 struct lynx_mq *mq, const struct lynx_msg *req,
                                 int *replied) {
  __shared__ __align__(16) uint8_t chunk[VS_CHUNK];
  __shared__ unsigned long long total;
  uint8_t *out;
  int rc;
  (void)l;
  *replied = 0;
  /* the answer's slot first: a full TX ring is retried before any work */
  rc = lynx_block_reserve(mq, VS_ANSWER_LEN, &out);
  if (rc == -11)
    return LYNX_GPU_AGAIN;
  if (rc) /* a slot too small for the answer: the service's spec */
    return lynx_block_drop(mq, req->tag) == -11 ? LYNX_GPU_AGAIN : 0;
  if (!vs_request_ok(req->len)) {
    if (lynx_block_io_thread())
      for (uint32_t i = 0; i < VS_ERROR_LEN; i++)
        out[i] = (uint8_t)VS_ERROR[i];
    lynx_block_commit(mq, req->tag, VS_ERROR_LEN, VS_ANSWER_LEN);
    *replied = 1;
    return 0;
  }
  if (threadIdx.x == 0)
    total = 0;
  __syncthreads();
  for (uint32_t off = 0; off < req->len; off += VS_CHUNK) {
    uint32_t n = req->len - off < VS_CHUNK ? req->len - off : VS_CHUNK;
    unsigned long long mine = 0;
    lynx_block_copy(chunk, req->data + off, n); /* ends with a barrier */
    for (uint32_t i = threadIdx.x; i < n / 4u; i += blockDim.x)
      mine += vs_elem(chunk, i);
    atomicAdd(&total, mine);
    __syncthreads(); /* the chunk is read before the next copy */
  }
  if (lynx_block_io_thread())
    vs_answer(out, req->len / 4u, (uint64_t)total);
  lynx_block_commit(mq, req->tag, VS_ANSWER_LEN, VS_ANSWER_LEN);
  *replied = 1;
  return 0;
}

LYNX_GPU_APP("vector-sum", "the sum of a vector of 32-bit integers", vector_sum)
