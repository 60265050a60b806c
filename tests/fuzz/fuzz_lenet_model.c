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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct fz f = {data, size};
  uint8_t flags = fz_u8(&f), *file = NULL, img[LENET_PIXELS];
  struct lenet_model *m = malloc(sizeof(*m));
  float logits[LENET_CLASSES];
  char why[256] = "";
  size_t n, len;
  const uint8_t *rest = fz_rest(&f, &n);
  int rc;
  fz_quiet();
  if (!m)
    return 0;
  if (flags & 1) {
    len = n;
    file = malloc(len ? len : 1); /* a heap copy of its exact size */
    if (file)
      memcpy(file, rest, len);
  } else {
    size_t hdr = n < LENET_FILE_HDR ? n : LENET_FILE_HDR;
    len = LENET_FILE_SIZE;
    file = calloc(1, len);
    if (file) {
      memcpy(file, rest, hdr);
      for (size_t i = LENET_FILE_HDR; n > hdr && i < len; i++)
        file[i] = rest[hdr + (i - LENET_FILE_HDR) % (n - hdr)];
      if (flags & 2) {
        uint32_t crc = htole32(lenet_crc32(file + LENET_FILE_HDR,
                                           4u * LENET_PARAMS));
        memcpy(file + 24, &crc, 4);
      }
    }
  }
  if (!file)
    goto out;
  rc = lenet_model_parse(file, len, m, why, sizeof(why));
  if (rc) {
    FZ_CHECK(rc == -EINVAL && why[0]);
    goto out;
  }
  for (size_t i = 0; i < LENET_PIXELS; i++)
    img[i] = size ? data[i % size] : 0;
  rc = lenet_infer(m, img, logits);
  FZ_CHECK(rc >= 0 && rc < LENET_CLASSES);
out:
  free(file);
  free(m);
  return 0;
}
