// Compiles common/mqueue.h for the device: the persistent-kernel shape of an
// accelerator's I/O loop (one thread per block does I/O, as in the paper
// §5.3). Built by the ring_header_nvcc test; it proves the header is
// device-clean. Running it needs a GPU (issue 6).
#include "mqueue.h"

__global__ void lynx_echo_kernel(uint8_t *region, struct lynx_geom g,
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

// host side of the same header under nvcc
int lynx_host_geom_check(void) {
  struct lynx_geom g;
  return lynx_geom_init(&g, 4, 256, 2048);
}
