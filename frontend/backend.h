/*
 * backend.h - client mqueues' back-end connections (backend.c, paper
 * §4.3): requests an application writes into a client mqueue go to its
 * back end; the replies come back into the mqueue's RX ring.
 */
#ifndef LYNX_FE_BACKEND_H
#define LYNX_FE_BACKEND_H

#include <stdint.h>
#include <uv.h>

struct fe_mq;
struct fe_rmq;
struct fe_backend;
struct fe_backend_cfg;

/* What every back-end connection of one worker is given, fixed at the
 * worker's start and outliving its connections: the manager whose client
 * mqueues the replies go into, the loop the connections run on, the
 * worker's index (logs) and its backoff jitter seed. */
struct fe_backend_env {
  struct fe_rmq *rmq;
  uv_loop_t *loop;
  uint32_t worker;
  unsigned *retry_seed;
};

/* The worker's thread. Opens mq's back-end connection (sets mq->be;
 * connects in the background, retrying with backoff): 0 or -errno. */
int fe_backend_open(const struct fe_backend_env *env, struct fe_mq *mq,
                    const struct fe_backend_cfg *cfg);
/* Closes it; its memory goes once its handles closed. */
void fe_backend_close(struct fe_backend *be);
/* The application's request (tag) from the client mqueue's TX ring: sent
 * to the back end, or answered at once with LYNX_ST_BACKEND_DOWN. 0 when
 * consumed, -EAGAIN to retry next cycle. */
int fe_backend_request(struct fe_mq *mq, const uint8_t *data, uint32_t len,
                       uint32_t tag);
/* Hands replies that waited for RX room to the client mqueues of r's
 * connections. */
int fe_backend_progress(struct fe_rmq *r);

#endif
