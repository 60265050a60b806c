/*
 * lynx_app.h - the application plug-in ABI of Lynx-C (docs/writing-apps.md).
 *
 * An application is what answers a service's requests on an accelerator.
 * A CPU application is a shared object with one exported entry,
 * lynx_app_entry, that returns its definition (struct lynx_app_def): its
 * name, the back end it calls, what it does when an instance starts (its
 * configuration checked, its state built), the per-request handler, and
 * its teardown. The agent loads it (--app-load, --app-dir), refuses it
 * with the reason when it does not fit, and runs it as it runs the
 * built-in applications, which are defined the same way.
 *
 *   #include <lynx/lynx_app.h>
 *   static int handle(struct lynx_mq *mq, const struct lynx_msg *req,
 *                     int *replied, const struct lynx_app_ctx *ctx) {...}
 *   static const struct lynx_app_def def = {
 *       LYNX_APP_DEF_HEAD, .name = "my-app", .handle = handle};
 *   LYNX_APP_EXPORT(def)
 *
 * Built with `cc -shared -fPIC $(pkg-config --cflags --libs lynx)`.
 *
 * Versioning: LYNX_APP_ABI_VERSION changes when a structure here, the
 * region layout (mqueue.h: LYNX_LAYOUT_VERSION) or a rule of the API
 * changes incompatibly; an agent loads only definitions of its own
 * version. Fields are only ever added at the end of a structure, and a
 * structure carries its size, so an agent reads no field a plug-in's
 * definition lacks; a definition's first three fields (abi_version, size,
 * name) are the same in every version, so an agent can name the
 * application it refuses.
 */
#ifndef LYNX_APP_H
#define LYNX_APP_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "lynx_io.h"
#include "mqueue.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LYNX_APP_ABI_VERSION 1u
/* The symbol an agent looks up in a plug-in. */
#define LYNX_APP_ENTRY_NAME "lynx_app_entry"
/* An application's name: 1 to LYNX_APP_NAME_MAX - 1 characters of
 * [a-z0-9._-], starting with a letter or digit (a service's "app"). */
#define LYNX_APP_NAME_MAX 32
/* The largest app configuration a service carries (bytes of JSON). */
#define LYNX_APP_CONFIG_MAX 4096

/* Log levels of lynx_app_log, as the agent's --log-level names them. */
enum lynx_app_log_level {
  LYNX_APP_LOG_ERR = 0,
  LYNX_APP_LOG_WARN = 1,
  LYNX_APP_LOG_INFO = 2,
  LYNX_APP_LOG_DEBUG = 3,
};

struct lynx_app_ctx;

/* What the agent offers an application: reached through its ctx (the
 * inline functions below), never linked, so a plug-in needs no library. */
struct lynx_app_host {
  uint32_t size; /* sizeof(struct lynx_app_host) as the agent built it */
  /* Sends req (len bytes) to the service's back end called backend and
   * waits for its reply: 0 with *reply_len bytes (at most cap) in reply;
   * -ENOENT: the service has no such back end; -EHOSTDOWN: the frontend
   * reports it unreachable; -EMSGSIZE: the reply did not fit (a slot, or
   * cap); -ETIMEDOUT: no reply within ctx->call_timeout_ns. One call at a
   * time per back end: the instance's threads take turns. */
  int (*call)(const struct lynx_app_ctx *ctx, const char *backend,
              const void *req, uint32_t len, uint8_t *reply, uint32_t cap,
              uint32_t *reply_len);
  /* A line in the agent's log, rate limited, naming the application. */
  void (*log)(const struct lynx_app_ctx *ctx, int level, const char *msg);
};

/* What every call of handle gets: one per instance, shared by its
 * threads, read-only. */
struct lynx_app_ctx {
  uint32_t size;            /* sizeof(struct lynx_app_ctx) as the agent
                               built it: fields past it are absent */
  void *state;              /* what start set (NULL: it has no start) */
  const volatile int *stop; /* nonzero once the instance is stopping: a
                               handler that waits long checks it */
  uint64_t call_timeout_ns; /* how long lynx_app_call waits */
  const struct lynx_app_host *host;
  void *host_priv; /* the agent's */
  const char *app; /* the application's name */
};

/* What an instance starts with. */
struct lynx_app_start {
  uint32_t size;       /* sizeof(struct lynx_app_start) as the agent built it */
  const char *service; /* the service's name */
  /* The service's app configuration: a JSON object's text of config_len
   * bytes (NUL-terminated), "{}" when the service gives none and the agent
   * has no default for the application. The application checks it here:
   * a configuration it refuses is the service's reason. */
  const char *config;
  uint32_t config_len;
  uint32_t n_mqueues;    /* server mqueues of the instance */
  uint32_t slot_payload; /* bytes a slot carries (larger messages go to the
                            large-message area, up to msg_max) */
  uint32_t msg_max;      /* the largest request or answer */
  uint32_t n_backends;   /* the service's back ends, by name */
  const char *const *backends;
};

struct lynx_app_def {
  uint32_t abi_version; /* LYNX_APP_ABI_VERSION of the SDK it was built with */
  uint32_t size;        /* sizeof(struct lynx_app_def) there */
  const char *name;     /* see LYNX_APP_NAME_MAX */
  const char *help;     /* one line for the agent's --list-apps (NULL: none) */
  /* a back end the service must give by this name (NULL: none): a service
   * without it is refused at creation */
  const char *needs_backend;
  /* When an instance starts, before any request (NULL: nothing to do):
   * 0 with *state for its ctx, or -errno with the reason in why (whylen
   * bytes), and the instance does not start. May run on any thread, for
   * several instances at once. */
  int (*start)(const struct lynx_app_start *st, void **state, char *why,
               size_t whylen);
  /* Answers (or drops) req through mq: 0 when done with it (the agent
   * releases its slot), -EAGAIN when the TX ring is full: req is kept and
   * handed again later, so a handler that has already replied must not
   * return -EAGAIN. Sets *replied to 1 when it published an answer. The
   * instance's threads call it at once for different mqueues. */
  int (*handle)(struct lynx_mq *mq, const struct lynx_msg *req, int *replied,
                const struct lynx_app_ctx *ctx);
  /* After the instance's last request (NULL: nothing): frees state. */
  void (*stop)(void *state);
  /* sizeof(struct lynx_mq) as built: the inline I/O functions work on it,
   * so an agent refuses a plug-in whose headers lay it out otherwise */
  uint32_t mq_size;
};

/* The fields of a definition that say which SDK it was built with. */
#define LYNX_APP_DEF_HEAD                                                      \
  .abi_version = LYNX_APP_ABI_VERSION, .size = sizeof(struct lynx_app_def),    \
  .mq_size = sizeof(struct lynx_mq)

typedef const struct lynx_app_def *(*lynx_app_entry_fn)(void);

/* Exports def (a struct lynx_app_def with static storage) as the plug-in's
 * entry. Once per shared object. */
#define LYNX_APP_EXPORT(def)                                                   \
  __attribute__((visibility("default"))) const struct lynx_app_def *           \
  lynx_app_entry(void);                                                        \
  const struct lynx_app_def *lynx_app_entry(void) { return &(def); }

/* See struct lynx_app_host's call. */
static inline int lynx_app_call(const struct lynx_app_ctx *ctx,
                                const char *backend, const void *req,
                                uint32_t len, uint8_t *reply, uint32_t cap,
                                uint32_t *reply_len) {
  return ctx->host->call(ctx, backend, req, len, reply, cap, reply_len);
}

static inline void lynx_app_log(const struct lynx_app_ctx *ctx, int level,
                                const char *msg) {
  ctx->host->log(ctx, level, msg);
}

#ifdef __cplusplus
}
#endif

#endif
