/*
 * vector_sum.h - the request and answer of the vector-sum GPU example, for
 * its kernel (vector_sum.cu) and for host code that checks its answers.
 *
 * A request is a vector of little-endian 32-bit unsigned integers (at
 * least one, its length a multiple of 4). The answer is 16 bytes, little
 * endian: the element count (u32), 0 (u32), and the sum of the elements
 * (u64, modulo 2^64). Any other request is answered "ERROR".
 */
#ifndef VECTOR_SUM_H
#define VECTOR_SUM_H

#include <stdint.h>

#ifdef __CUDACC__
#define VS_HD __host__ __device__ static inline
#else
#define VS_HD static inline
#endif

#define VS_ANSWER_LEN 16u
#define VS_ERROR "ERROR"
#define VS_ERROR_LEN 5u

/* 1 when a request of len bytes is a vector. */
VS_HD int vs_request_ok(uint32_t len) { return len >= 4 && len % 4 == 0; }

/* The answer for a vector of count elements summing to sum, into out
 * (VS_ANSWER_LEN bytes). */
VS_HD void vs_answer(uint8_t *out, uint32_t count, uint64_t sum) {
  for (int i = 0; i < 4; i++) {
    out[i] = (uint8_t)(count >> (8 * i));
    out[4 + i] = 0;
  }
  for (int i = 0; i < 8; i++)
    out[8 + i] = (uint8_t)(sum >> (8 * i));
}

/* The element i of a request's bytes. */
VS_HD uint32_t vs_elem(const uint8_t *d, uint32_t i) {
  return (uint32_t)d[4 * i] | (uint32_t)d[4 * i + 1] << 8 |
         (uint32_t)d[4 * i + 2] << 16 | (uint32_t)d[4 * i + 3] << 24;
}

/* The answer to a request of len bytes, computed by one thread (what host
 * code checks the kernel against): its length, the bytes in out (at least
 * VS_ANSWER_LEN of room). */
VS_HD uint32_t vs_reference(const uint8_t *req, uint32_t len, uint8_t *out) {
  uint64_t sum = 0;
  if (!vs_request_ok(len)) {
    for (uint32_t i = 0; i < VS_ERROR_LEN; i++)
      out[i] = (uint8_t)VS_ERROR[i];
    return VS_ERROR_LEN;
  }
  for (uint32_t i = 0; i < len / 4u; i++)
    sum += vs_elem(req, i);
  vs_answer(out, len / 4u, sum);
  return VS_ANSWER_LEN;
}

#endif
