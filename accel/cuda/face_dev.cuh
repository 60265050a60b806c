/*
 * face_dev.cuh - face verification's comparison by one threadblock: the
 * device code both Lynx's face-verify kernel (apps.cu) and the host-centric
 * baseline (bench/gpu_baseline_kernel.cu) run, so the two are compared on
 * the architecture alone.
 *
 * With face.h's pieces: each thread takes pixels (face_hist_index of both
 * images into the shared descriptors: the probe's counts in the low 16 bits
 * of each word, the stored image's in the high ones; at most 64 per bin, so
 * neither spills into the other) and bins (face_chi2_term into its own
 * sum, then one atomic add): integer counts and integer terms, so the
 * order is immaterial and the distance is the CPU's face_verify's, bit for
 * bit. Thread 0 writes the 8-byte answer to out.
 *
 * Calling rule: all threads of the block, uniform control flow; probe and
 * stored in shared memory (or any memory the block's threads read
 * coherently), hist (FACE_HIST_BINS words) and sum in shared memory.
 */
#ifndef LYNX_FACE_DEV_CUH
#define LYNX_FACE_DEV_CUH

#if !defined(__CUDACC__)
#error "face_dev.cuh is CUDA device code: compile it with nvcc"
#endif

#include <stdint.h>

#include "face.h"

static __device__ void face_block_verify(const uint8_t *probe,
                                         const uint8_t *stored, uint32_t *h,
                                         unsigned long long *sum,
                                         uint8_t *out) {
  unsigned long long part = 0;
  for (uint32_t i = threadIdx.x; i < FACE_HIST_BINS; i += blockDim.x)
    h[i] = 0;
  if (threadIdx.x == 0)
    *sum = 0;
  __syncthreads();
  for (uint32_t p = threadIdx.x; p < FACE_PIXELS; p += blockDim.x) {
    atomicAdd(&h[face_hist_index(probe, (int)p)], 1u);
    atomicAdd(&h[face_hist_index(stored, (int)p)], 1u << 16);
  }
  __syncthreads();
  for (uint32_t i = threadIdx.x; i < FACE_HIST_BINS; i += blockDim.x)
    part += face_chi2_term(h[i] & 0xffffu, h[i] >> 16);
  atomicAdd(sum, part);
  __syncthreads();
  if (threadIdx.x == 0) {
    float d = face_chi2_dist(*sum);
    face_resp_encode(out, face_is_match(d), d);
  }
}

#endif
