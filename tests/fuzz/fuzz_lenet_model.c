/*
 * fuzz_lenet_model.c - the lenet application's weights file
 * (accel/lenet.c lenet_model_parse, what lenet_model_load runs on the
 * file --lenet-model names), and an inference with what it took
 * (lenet_infer on a 28x28 image).
 *
 * The file is 246,952 bytes and checksummed, which no mutation of a raw
 * file gets past. Input: a byte of flags: bit 0 raw (the rest is the file
 * as it is); else the next 128 bytes are the header, the rest repeated
 * over the parameters to the file's full size, and with bit 1 the
 * header's CRC-32 is made right, so that the checks after it (every
 * parameter finite) and the inference see fuzzed weights. The image is
 * the input's first 784 bytes, repeated.
 *
 * Checked besides memory errors: a refusal says why; a model taken gives
 * a class in 0..9.
 */
#include <endian.h>
#include <errno.h>

#include "fuzz.h"
#include "lenet_model.h"

/* A file of the full size and the model parsed from it: static, written
 * whole for every input (fresh pages for every input made page faults
 * most of a run's time). */
static uint8_t whole[LENET_FILE_SIZE];
static struct lenet_model model;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct fz f = {data, size};
  uint8_t flags = fz_u8(&f), *raw = NULL, img[LENET_PIXELS];
  const uint8_t *file = whole;
  float logits[LENET_CLASSES];
  char why[256] = "";
  size_t n, len = LENET_FILE_SIZE;
  const uint8_t *rest = fz_rest(&f, &n);
  int rc;
  fz_quiet();
  if (flags & 1) {
    len = n;
    raw = malloc(len ? len : 1); /* a heap copy of its exact size */
    if (!raw)
      return 0;
    memcpy(raw, rest, len);
    file = raw;
  } else {
    size_t hdr = n < LENET_FILE_HDR ? n : LENET_FILE_HDR;
    memset(whole, 0, sizeof(whole));
    memcpy(whole, rest, hdr);
    for (size_t i = LENET_FILE_HDR, k; n > hdr && i < len; i += k) {
      k = n - hdr < len - i ? n - hdr : len - i;
      memcpy(whole + i, rest + hdr, k); /* the rest, repeated */
    }
    if (flags & 2) {
      uint32_t crc =
          htole32(lenet_crc32(whole + LENET_FILE_HDR, 4u * LENET_PARAMS));
      memcpy(whole + 24, &crc, 4);
    }
  }
  memset(&model, 0, sizeof(model));
  rc = lenet_model_parse(file, len, &model, why, sizeof(why));
  if (rc) {
    FZ_CHECK(rc == -EINVAL && why[0]);
  } else {
    for (size_t i = 0; i < LENET_PIXELS; i++)
      img[i] = size ? data[i % size] : 0;
    rc = lenet_infer(&model, img, logits);
    FZ_CHECK(rc >= 0 && rc < LENET_CLASSES);
  }
  free(raw);
  return 0;
}
