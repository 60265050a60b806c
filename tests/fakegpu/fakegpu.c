/*
 * fakegpu.c - lynx-agent-fakegpu: the agent built over the fake CUDA
 * runtime of unit_cuda_backend (tests/unit/fake_cuda.c) instead of the
 * real one, so that integration tests run GPU paths end to end on a host
 * without a GPU: discovery, a GPU application's module loaded through the
 * driver API, its persistent kernel (a thread serving the region with the
 * real ring code), and a fault that poisons the GPU's context
 * (integration.gpu_fault).
 *
 * The fake GPUs come from the environment: LYNX_FAKE_GPUS (how many,
 * default 1) of compute capability LYNX_FAKE_GPU_CC (default 90). A
 * module's kernel answers as the example vector-sum's handler does
 * (examples/vector-sum-gpu/vector_sum.h, its twin on the host), and
 * faults on a request that begins with "LYNX-TRAP" (fake_cuda.h
 * FAKE_TRAP). Never installed: a test binary.
 */
#include <stdlib.h>
#include <string.h>

#include "fake_cuda.h"
#include "vector_sum.h"

#define TRAP "LYNX-TRAP"

static int vector_sum_twin(const struct lynx_cuda_launch *l, const uint8_t *req,
                           uint32_t len, uint8_t *out, uint32_t cap) {
  (void)l;
  if (len >= sizeof(TRAP) - 1 && !memcmp(req, TRAP, sizeof(TRAP) - 1))
    return FAKE_TRAP;
  if (cap < VS_ANSWER_LEN)
    return -1;
  return (int)vs_reference(req, len, out);
}

__attribute__((constructor)) static void fakegpu_init(void) {
  const char *n = getenv("LYNX_FAKE_GPUS"), *cc = getenv("LYNX_FAKE_GPU_CC");
  int gpus = n ? atoi(n) : 1, c = cc ? atoi(cc) : 90;
  fake_cuda_gpus(gpus < 0 ? 0 : gpus > FAKE_GPUS ? FAKE_GPUS : gpus);
  fake_cuda_reset();
  for (int i = 0; i < FAKE_GPUS; i++) {
    fake.gpu[i].major = c / 10;
    fake.gpu[i].minor = c % 10;
  }
  fake.module_handler = vector_sum_twin;
}
