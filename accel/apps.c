/* apps.c - echo and sockperf-echo. */
#include "apps.h"

#include <errno.h>
#include <string.h>

static int echo_handle(struct lynx_mq *mq, const struct lynx_msg *req,
                       int *replied) {
  int rc = lynx_send(mq, req->tag, req->data, req->len);
  *replied = rc == 0;
  return rc == -EAGAIN ? -EAGAIN : 0;
}

/*
 * sockperf's 14-byte header: u64 sequence, u16 flags, u32 length, network
 * order. Like sockperf's own server: answer only pong requests, and clear
 * the client flag in the answer. Anything else is dropped (the frontend frees
 * its tag at once).
 */
static int sockperf_handle(struct lynx_mq *mq, const struct lynx_msg *req,
                           int *replied) {
  uint8_t *buf;
  uint16_t flags;
  int rc;
  *replied = 0;
  if (req->len < LYNX_SOCKPERF_HDR)
    goto drop;
  flags = (uint16_t)(req->data[8] << 8 | req->data[9]);
  if (!(flags & LYNX_SOCKPERF_PONG_REQ))
    goto drop;
  rc = lynx_reserve(mq, req->len, &buf);
  if (rc)
    return rc == -EAGAIN ? -EAGAIN : 0;
  memcpy(buf, req->data, req->len);
  flags &= (uint16_t)~LYNX_SOCKPERF_CLIENT;
  buf[8] = (uint8_t)(flags >> 8);
  buf[9] = (uint8_t)flags;
  lynx_commit(mq, req->tag, req->len, req->len);
  *replied = 1;
  return 0;
drop:
  return lynx_drop(mq, req->tag) == -EAGAIN ? -EAGAIN : 0;
}

static const struct lynx_app apps[] = {
    {"echo", "answer every request with its own bytes", echo_handle},
    {"sockperf-echo",
     "answer sockperf pong requests as sockperf's server does", sockperf_handle},
};

const struct lynx_app *lynx_app_find(const char *name) {
  for (size_t i = 0; i < sizeof(apps) / sizeof(apps[0]); i++)
    if (strcmp(apps[i].name, name) == 0)
      return &apps[i];
  return NULL;
}

const char *lynx_app_names(void) { return "echo, sockperf-echo"; }
