/*
 * fuzz.h - what every harness in tests/fuzz/ shares: the libFuzzer entry
 * points, a reader that takes structure (lengths, choices, chunk sizes)
 * from the front of an input, and quiet logging.
 *
 * A harness defines LLVMFuzzerTestOneInput and keeps nothing from one
 * input to the next: whatever it builds (registries, readers, sockets,
 * threads) is made and freed within the call, so an input that crashes
 * crashes alone, the way its reproducer runs it. (The tcp harnesses keep
 * one number: the port their listener used, to listen there again.) Built with
 * LYNX_FUZZ=ON it links libFuzzer; otherwise driver.c's main runs files through
 * it once each (the regression run of the corpus in ctest). Docs:
 * docs/fuzzing.md.
 */
#ifndef LYNX_FUZZ_H
#define LYNX_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The daemons log every refusal; a fuzzer makes millions. Silent unless
 * LYNX_FUZZ_LOG names a level (error, warn, info, debug) to debug a
 * reproducer with. */
static inline void fz_quiet(void) {
  const char *s = getenv("LYNX_FUZZ_LOG");
  int lvl = s ? lynx_log_parse_level(s) : -1;
  lynx_log_level = lvl < 0 ? -1 : lvl;
}

/* A harness's input read front to back; past its end every read gives 0
 * (or no bytes), so any input is a valid one. */
struct fz {
  const uint8_t *p;
  size_t n;
};

static inline uint8_t fz_u8(struct fz *f) {
  uint8_t v = 0;
  if (f->n) {
    v = *f->p++;
    f->n--;
  }
  return v;
}

static inline uint16_t fz_u16(struct fz *f) {
  uint16_t v = fz_u8(f);
  return (uint16_t)(v << 8 | fz_u8(f));
}

static inline uint32_t fz_u32(struct fz *f) {
  uint32_t v = fz_u16(f);
  return v << 16 | fz_u16(f);
}

static inline uint64_t fz_u64(struct fz *f) {
  uint64_t v = fz_u32(f);
  return v << 32 | fz_u32(f);
}

/* Up to n bytes (fewer at the end): *len says how many. */
static inline const uint8_t *fz_bytes(struct fz *f, size_t n, size_t *len) {
  const uint8_t *p = f->p;
  if (n > f->n)
    n = f->n;
  f->p += n;
  f->n -= n;
  *len = n;
  return p;
}

/* What is left after a harness took its structure. */
static inline const uint8_t *fz_rest(struct fz *f, size_t *len) {
  return fz_bytes(f, f->n, len);
}

/* A property every input must keep, checked where assert() would vanish
 * under NDEBUG: a violation aborts, which libFuzzer reports as a crash. */
#define FZ_CHECK(cond)                                                         \
  do {                                                                         \
    if (!(cond))                                                               \
      fz_fail(__FILE__, __LINE__, #cond);                                      \
  } while (0)

void fz_fail(const char *file, int line, const char *what)
    __attribute__((noreturn));

#endif
