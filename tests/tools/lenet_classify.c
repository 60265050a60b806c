/*
 * lynx-lenet-classify - asks a lenet service (docs/lenet.md) for the class
 * of one image, and prints it.
 *
 *   lynx-lenet-classify --target HOST:PORT (--index K | --image FILE)
 *                       [--data DIR] [--timeout-ms T]
 *
 * --index K sends Fashion-MNIST test image K (of --data) and prints its
 * label beside the answer, and checks the answer against the training
 * script's reference (--ref): the same class, and for the images whose
 * logits it keeps, the same logits bit for bit; --image FILE sends a 28x28
 * 8-bit grayscale image of one's own: 784 raw bytes (row-major, as in the MNIST
 * files), or a binary PGM (P5) of 28x28 with maxval 255. One UDP request with a
 * 4-byte cookie; the answer must carry it.
 *
 * Output:
 *   class 9 (ankle boot), label 9 (ankle boot), 412 us
 *   logits: 0: -4.125 ... 9: 7.562
 * Exit status: 0 answered (and, with --index, as the reference says); 1
 * no answer within T ms (default 2000), an answer that does not decode, or
 * one the reference disagrees with; 2 usage errors or an unreadable image
 * or data file.
 */
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lenet_data.h"
#include "tool_common.h"

#ifndef LENET_REF_DEFAULT
#define LENET_REF_DEFAULT "models/lenet-fashion.ref"
#endif

static const char *const class_names[LENET_CLASSES] = {
    "T-shirt/top", "trouser", "pullover", "dress", "coat",
    "sandal",      "shirt",   "sneaker",  "bag",   "ankle boot"};

struct cfg {
  char *target, *image, *data, *ref;
  uint32_t index, timeout_ms;
  int has_index;
};

#define O(f) offsetof(struct cfg, f)
static const struct lynx_opt opts[] = {
    {"target", LYNX_OPT_STR, O(target), NULL, 0, 0, NULL,
     "the lenet service, IPv4 HOST:PORT"},
    {"index", LYNX_OPT_U32, O(index), "4294967295", 0, 4294967295u, NULL,
     "test image K of the Fashion-MNIST test set"},
    {"image", LYNX_OPT_STR, O(image), NULL, 0, 0, NULL,
     "an image file: 784 raw bytes, or a 28x28 binary PGM"},
    {"data", LYNX_OPT_STR, O(data), LENET_DATA_DIR, 0, 0, NULL,
     "directory of the Fashion-MNIST test set (t10k-*-ubyte[.gz])"},
    {"ref", LYNX_OPT_STR, O(ref), LENET_REF_DEFAULT, 0, 0, NULL,
     "with --index: the reference file of the service's weights"},
    {"timeout-ms", LYNX_OPT_U32, O(timeout_ms), "2000", 1, 600000, NULL,
     "how long to wait for the answer"},
    LYNX_OPT_END,
};
#undef O

#define USAGE                                                                  \
  "usage: lynx-lenet-classify --target HOST:PORT (--index K | --image FILE)\n" \
  "                           [--data DIR] [--ref FILE] [--timeout-ms T]\n"    \
  "Asks a lenet service for the class of one image.\n"

/* Reads a 28x28 image from path into px: 784 raw bytes, or a binary PGM
 * (P5) of that size with maxval 255. 0, or -1 with why. */
static int read_image(const char *path, uint8_t px[LENET_PIXELS], char *why,
                      size_t whylen) {
  uint8_t buf[LENET_PIXELS + 64];
  size_t n;
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(why, whylen, "%s: %s", path, strerror(errno));
    return -1;
  }
  n = fread(buf, 1, sizeof(buf), f);
  fclose(f);
  if (n == LENET_PIXELS) {
    memcpy(px, buf, LENET_PIXELS);
    return 0;
  }
  if (n > 2 && buf[0] == 'P' && buf[1] == '5') {
    unsigned w = 0, h = 0, max = 0;
    int off = 0;
    char head[64];
    memcpy(head, buf, sizeof(head) - 1);
    head[sizeof(head) - 1] = 0;
    /* "P5 <w> <h> <max>" and one whitespace byte, then the pixels (no
     * comments: a tool's own output has none) */
    if (sscanf(head, "P5 %u %u %u%n", &w, &h, &max, &off) == 3 && off > 0 &&
        w == LENET_SIDE && h == LENET_SIDE && max == 255 &&
        n == (size_t)off + 1 + LENET_PIXELS) {
      memcpy(px, buf + off + 1, LENET_PIXELS);
      return 0;
    }
    snprintf(why, whylen,
             "%s: a PGM, but not a 28x28 one with maxval 255 "
             "and no comments",
             path);
    return -1;
  }
  snprintf(why, whylen,
           "%s: %zu%s bytes: want 784 raw pixels or a 28x28 "
           "binary PGM",
           path, n, n == sizeof(buf) ? " or more" : "");
  return -1;
}

int main(int argc, char **argv) {
  struct cfg cfg;
  struct sockaddr_in sa;
  struct lenet_testset ts;
  struct lenet_ref ref;
  uint8_t req[LENET_PIXELS + 4], resp[LENET_RESP_MAX + 64];
  const uint8_t *cookie;
  uint32_t cookie_len, tag;
  float logits[LENET_CLASSES];
  char why[512];
  int rc, fd = -1, cls, label = -1;
  uint64_t t0;
  ssize_t got = -1;

  memset(&cfg, 0, sizeof(cfg));
  memset(&ts, 0, sizeof(ts));
  memset(&ref, 0, sizeof(ref));
  rc = tool_opts(opts, &cfg, argc, argv, USAGE, NULL);
  if (rc >= 0)
    return rc;
  cfg.has_index = cfg.index != UINT32_MAX;
  if (tool_ipv4_target(cfg.target, &sa) || cfg.has_index == !!cfg.image) {
    fprintf(stderr, "lynx-lenet-classify: %s\n",
            tool_ipv4_target(cfg.target, &sa)
                ? "--target must be IPV4:PORT"
                : "give one of --index K and --image FILE");
    rc = tool_usage(USAGE);
    goto out;
  }
  rc = LYNX_EXIT_USAGE;
  if (cfg.image) {
    if (read_image(cfg.image, req, why, sizeof(why))) {
      fprintf(stderr, "lynx-lenet-classify: %s\n", why);
      goto out;
    }
  } else {
    if (lenet_testset_load(cfg.data, &ts, why, sizeof(why)) ||
        lenet_ref_load(cfg.ref, &ref, why, sizeof(why))) {
      fprintf(stderr, "lynx-lenet-classify: %s\n", why);
      goto out;
    }
    if (ref.images != ts.count) {
      fprintf(stderr,
              "lynx-lenet-classify: %s has %u classes for %u test "
              "images\n",
              cfg.ref, ref.images, ts.count);
      goto out;
    }
    if (cfg.index >= ts.count) {
      fprintf(stderr,
              "lynx-lenet-classify: --index %u: the test set has "
              "%u images\n",
              cfg.index, ts.count);
      goto out;
    }
    memcpy(req, ts.images + (size_t)cfg.index * LENET_PIXELS, LENET_PIXELS);
    label = ts.labels[cfg.index];
  }
  tag = (uint32_t)lynx_now_ns() ^ (uint32_t)getpid();
  memcpy(req + LENET_PIXELS, &tag, 4);
  fd = tool_udp_connect(&sa, SOCK_CLOEXEC);
  if (fd < 0) {
    fprintf(stderr, "lynx-lenet-classify: socket: %s\n", strerror(errno));
    goto out;
  }
  rc = LYNX_EXIT_RUNTIME;
  t0 = lynx_now_ns();
  if (send(fd, req, sizeof(req), 0) != (ssize_t)sizeof(req)) {
    fprintf(stderr, "lynx-lenet-classify: send to %s: %s\n", cfg.target,
            strerror(errno));
    goto out;
  }
  for (;;) { /* the answer with our cookie (an old one is skipped) */
    struct pollfd p = {fd, POLLIN, 0};
    uint64_t spent = (lynx_now_ns() - t0) / 1000000u;
    if (spent >= cfg.timeout_ms ||
        poll(&p, 1, (int)(cfg.timeout_ms - spent)) <= 0) {
      fprintf(stderr,
              "lynx-lenet-classify: no answer from %s within %u ms "
              "(is a lenet service on that port? docs/lenet.md)\n",
              cfg.target, cfg.timeout_ms);
      goto out;
    }
    got = recv(fd, resp, sizeof(resp), 0);
    if (got < 0) {
      fprintf(stderr, "lynx-lenet-classify: %s: %s\n", cfg.target,
              strerror(errno));
      goto out;
    }
    if (lenet_resp_decode(resp, (uint32_t)got, &cls, logits, &cookie,
                          &cookie_len)) {
      fprintf(stderr,
              "lynx-lenet-classify: an answer of %zd bytes from %s "
              "does not decode as a lenet answer (is the service on that "
              "port a lenet one?)\n",
              got, cfg.target);
      goto out;
    }
    if (cookie_len == 4 && !memcmp(cookie, &tag, 4))
      break;
  }
  printf("class %d (%s)", cls, class_names[cls]);
  if (label >= 0)
    printf(", label %d (%s)", label, class_names[label]);
  printf(", %llu us\nlogits:",
         (unsigned long long)((lynx_now_ns() - t0) / 1000u));
  for (int i = 0; i < LENET_CLASSES; i++)
    printf(" %d: %.3f", i, (double)logits[i]);
  printf("\n");
  rc = 0;
  if (label >= 0) {
    float want[LENET_CLASSES];
    if (cls != ref.classes[cfg.index]) {
      fprintf(stderr,
              "lynx-lenet-classify: the reference classifies test "
              "image %u as %u, the service as %d\n",
              cfg.index, ref.classes[cfg.index], cls);
      rc = LYNX_EXIT_RUNTIME;
    } else if (cfg.index < ref.logit_images) {
      lenet_ref_logits(&ref, cfg.index, want);
      if (memcmp(want, logits, sizeof(want))) {
        fprintf(stderr,
                "lynx-lenet-classify: the logits of test image %u "
                "differ from the reference's\n",
                cfg.index);
        rc = LYNX_EXIT_RUNTIME;
      }
    }
  }
out:
  if (fd >= 0)
    close(fd);
  lenet_testset_free(&ts);
  lenet_ref_free(&ref);
  lynx_opts_free(opts, &cfg);
  return rc;
}
