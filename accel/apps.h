/*
 * apps.h - example applications, chosen by name.
 *
 * An application handles one request at a time through lynx_io.h. The CPU
 * backend calls it from the accelerator's persistent polling loop; the same
 * handlers are what a CUDA persistent kernel runs per request (issue 6).
 */
#ifndef LYNX_APPS_H
#define LYNX_APPS_H

#include "lynx_io.h"

#define LYNX_SOCKPERF_HDR 14
#define LYNX_SOCKPERF_CLIENT 0x1u
#define LYNX_SOCKPERF_PONG_REQ 0x2u

struct lynx_app {
  const char *name;
  const char *help;
  /* Answer (or drop) req through mq. 0 when done with it (it is released by
   * the caller), -EAGAIN when the TX ring is full: the caller keeps req and
   * calls again later. Sets *replied to 1 when a response was published. */
  int (*handle)(struct lynx_mq *mq, const struct lynx_msg *req, int *replied);
};

/* The application called name, or NULL. */
const struct lynx_app *lynx_app_find(const char *name);
/* "echo, sockperf-echo": for error messages. */
const char *lynx_app_names(void);

#endif
