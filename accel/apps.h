/*
 * apps.h - example applications, chosen by name.
 *
 * An application handles one request at a time through lynx_io.h. The CPU
 * backend calls it from the accelerator's persistent polling loop. An
 * application with a CUDA kernel (cuda_app) runs the same per-request logic
 * (app_logic.h) in a persistent kernel on a GPU (accel/cuda/apps.cu).
 */
#ifndef LYNX_APPS_H
#define LYNX_APPS_H

#include <pthread.h>

#include "app_logic.h"
#include "cuda/lynx_cuda.h"
#include "lynx_io.h"

/* A client mqueue (paper §4.3): what the application writes to it goes to
 * one back end, whose replies come back into it. */
struct lynx_client {
  struct lynx_mq mq;
  char name[32];        /* the back end's name in the service spec */
  pthread_mutex_t lock; /* one call at a time (accelerator threads share it) */
  uint32_t next_tag;
};

/* What an application reaches besides its server mqueue. */
struct lynx_app_ctx {
  struct lynx_client *clients;
  uint32_t n_clients;
  uint64_t call_timeout_ns; /* a back end that does not answer in time */
  const volatile int *stop; /* set when the accelerator is stopping: an
                               app that waits long checks it */
  /* what the app's prepare gave (lenet: its struct lenet_model), shared
   * read-only by every instance; NULL for an app without one */
  const void *data;
};

struct lenet_model;
struct lynx_app;

/* What applications load from files the agent's options name, once per
 * agent on the first instance that needs it, then shared read-only by all
 * instances until lynx_app_res_free at exit. Touched by the agent's loop
 * thread only. */
struct lynx_app_res {
  const char *lenet_model;   /* --lenet-model: the weights file's path */
  struct lenet_model *lenet; /* loaded (NULL: not yet, or it failed) */
};

/* What the app needs before an instance of it can start: 0 and *data for
 * its ctx (NULL when it needs nothing), or -errno with the reason in why
 * (the instance does not start). A failure is not remembered: the next
 * instance tries again, so a fixed file needs no agent restart. */
int lynx_app_prepare(const struct lynx_app *app, struct lynx_app_res *res,
                     const void **data, char *why, size_t whylen);
void lynx_app_res_free(struct lynx_app_res *res);

/* The client mqueue of the back end called name, or NULL. */
struct lynx_client *lynx_app_client(const struct lynx_app_ctx *ctx,
                                    const char *name);

/* Sends req to the client's back end and waits for its reply: 0 with
 * *reply_len bytes (at most cap) copied to reply, -EHOSTDOWN when the
 * frontend reports the back end unreachable, -EMSGSIZE when the reply did
 * not fit (a slot, or cap), -ETIMEDOUT after timeout_ns. */
int lynx_call(struct lynx_client *c, const void *req, uint32_t len,
              uint8_t *reply, uint32_t cap, uint32_t *reply_len,
              uint64_t timeout_ns);

struct lynx_app {
  const char *name;
  const char *help;
  /* Answer (or drop) req through mq. 0 when done with it (it is released by
   * the caller), -EAGAIN when the TX ring is full: the caller keeps req and
   * calls again later. Sets *replied to 1 when a response was published. */
  int (*handle)(struct lynx_mq *mq, const struct lynx_msg *req, int *replied,
                const struct lynx_app_ctx *ctx);
  /* back ends it needs by name (NULL: none) */
  const char *needs_backend;
  /* the same application as a CUDA kernel (enum lynx_cuda_app), or
   * LYNX_CUDA_APP_NONE: CPU accelerators only */
  uint32_t cuda_app;
  /* loads what it needs from res (lynx_app_prepare); NULL: nothing */
  int (*prepare)(struct lynx_app_res *res, const void **data, char *why,
                 size_t whylen);
};

/* The application called name, or NULL. */
const struct lynx_app *lynx_app_find(const char *name);
/* The i-th application of the table, NULL past its end. */
const struct lynx_app *lynx_app_at(size_t i);
/* "echo, sockperf-echo, ...": for error messages. */
const char *lynx_app_names(void);
/* The applications that have a CUDA kernel, the same way. */
const char *lynx_app_cuda_names(void);

#endif
