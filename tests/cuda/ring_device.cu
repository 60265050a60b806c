// Compiles include/lynx/mqueue.h and accel/cuda/lynx_dev.cuh for the device.
// Built by the ring_header_nvcc test (tests/cuda/nvcc-check.sh) together with
// accel/cuda/apps.cu; it proves the headers are device-clean under
// -Werror all-warnings. Nothing here runs: this machine has no GPU.
#include "lynx_dev.cuh"
#include "mqueue.h"

// The ring header alone, one thread per block (the shape of the paper's
// §5.3 I/O thread, without the block library).
__global__ void lynx_ring_echo_kernel(uint8_t *region, struct lynx_geom g,
                                      volatile int *stop) {
  struct lynx_mq mq;
  if (threadIdx.x != 0)
    return;
  lynx_mq_bind(&mq, region, &g, blockIdx.x);
  while (!*stop) {
    struct lynx_msg m;
    uint8_t *out;
    if (lynx_mq_recv(&mq, &m) != 0)
      continue;
    while (lynx_mq_reserve(&mq, m.len, &out) != 0)
      ;
    for (uint32_t i = 0; i < m.len; i++)
      out[i] = m.data[i];
    lynx_mq_commit(&mq, m.tag, m.len, m.len, LYNX_ST_OK);
    lynx_mq_release(&mq);
  }
}

// Every function of the block library once: echo through
// reserve/copy/commit, drop of empty requests, send, work and idling, with
// the mqueue in the I/O thread's local memory (only it dereferences it).
__global__ void lynx_block_echo_kernel(uint8_t *region, struct lynx_geom g,
                                       const uint32_t *stop, uint32_t idle_ns,
                                       uint32_t *served_out) {
  struct lynx_mq mq;
  struct lynx_idle idle;
  uint32_t served = 0;
  if (lynx_block_io_thread())
    lynx_mq_bind(&mq, region, &g, blockIdx.x);
  lynx_idle_init(&idle, idle_ns);
  while (!lynx_block_flag(stop)) {
    struct lynx_msg m;
    uint8_t *buf;
    int rc = lynx_block_recv(&mq, &m);
    if (rc == 0) {
      lynx_block_work_us(1);
      if (m.len == 0) {
        rc = lynx_block_drop(&mq, m.tag);
      } else if (m.status != LYNX_ST_OK) {
        rc = lynx_block_send(&mq, m.tag, (const uint8_t *)"closed", 6);
      } else if ((rc = lynx_block_reserve(&mq, m.len, &buf)) == 0) {
        lynx_block_copy(buf, m.data, m.len);
        lynx_block_commit(&mq, m.tag, m.len, m.len);
      }
      lynx_block_release(&mq); // a full TX ring loses the answer: a test only
    }
    served = lynx_block_bcast_u32(served + (rc == 0)); // the I/O thread's
    lynx_block_idle(&idle, rc == 0);
  }
  if (lynx_block_io_thread())
    served_out[blockIdx.x] = served;
}

// host side of the same header under nvcc
int lynx_host_geom_check(void) {
  struct lynx_geom g;
  return lynx_geom_init(&g, 4, 256, 2048, 0);
}
