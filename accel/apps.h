/*
 * apps.h - the applications the agent runs, chosen by name: the built-in
 * ones (apps.c) and plug-ins (app_registry.c), all through the plug-in
 * ABI (include/lynx/lynx_app.h; docs/writing-apps.md).
 *
 * An application handles one request at a time through lynx_io.h. The CPU
 * backend calls it from the accelerator's persistent polling loop. A
 * built-in application with a CUDA kernel (cuda_app) runs the same
 * per-request logic (app_logic.h) in a persistent kernel on a GPU
 * (accel/cuda/apps.cu).
 */
#ifndef LYNX_APPS_H
#define LYNX_APPS_H

#include <pthread.h>

#include "app_logic.h"
#include "cuda/lynx_cuda.h"
#include "lynx_app.h"
#include "lynx_io.h"

/* A client mqueue (paper §4.3): what the application writes to it goes to
 * one back end, whose replies come back into it. */
struct lynx_client {
  struct lynx_mq mq;
  char name[32];        /* the back end's name in the service spec */
  pthread_mutex_t lock; /* one call at a time (accelerator threads share it) */
  uint32_t next_tag;
};

struct lynx_accel_ops; /* accel.h */

/* Sends req to the client's back end and waits for its reply: 0 with
 * *reply_len bytes (at most cap) copied to reply, -EHOSTDOWN when the
 * frontend reports the back end unreachable, -EMSGSIZE when the reply did
 * not fit (a slot, or cap), -ETIMEDOUT after timeout_ns. */
int lynx_call(struct lynx_client *c, const void *req, uint32_t len,
              uint8_t *reply, uint32_t cap, uint32_t *reply_len,
              uint64_t timeout_ns);

/*
 * An application the agent can run: one of the built-in definitions
 * (apps.c) or one a plug-in exports (app_registry.c loads it). Both are a
 * struct lynx_app_def (lynx_app.h) reached the same way; the registry adds
 * where it came from and, for a built-in, its CUDA kernel.
 */
struct lynx_app {
  const char *name, *help;
  const char *needs_backend; /* NULL: none */
  const struct lynx_app_def *def;
  /* the same application as a kernel of the agent's own (enum
   * lynx_cuda_app), or LYNX_CUDA_APP_NONE: CPU accelerators only */
  uint32_t cuda_app;
  const char *origin; /* "built in", or the plug-in's path */
  void *dl;           /* dlopen's handle (NULL: built in) */
  /* the configuration an instance starts with when its service gives
   * none (lynx_app_set_default; NULL: "{}") */
  char *default_config;
  /* A plug-in served by a process of its own (agent/apphost.c): def is
   * NULL here, the process has it; runner is the ops table that starts
   * and stops its instances on CPU accelerators in that process, host
   * that process's handle. NULL, NULL: it runs in this process. */
  const struct lynx_accel_ops *runner;
  void *host;
  /* A GPU application (a CUDA module built with lynx_kernel.cuh): the
   * module's bytes as read from its file (image_len of them; NULL: not
   * one), the code it carries ("sm_80, sm_90"), and the backend's handle
   * once a backend took it (lynx_app_adopt; NULL: none yet). */
  const uint8_t *image;
  size_t image_len;
  char image_code[64];
  int image_named; /* its name was given at load (NAME=PATH) */
  void *module;
};

/* A built-in application's definition and kernel (apps.c). */
struct lynx_builtin_app {
  const struct lynx_app_def *def;
  uint32_t cuda_app;
};
extern const struct lynx_builtin_app lynx_builtin_apps[];
extern const size_t lynx_builtin_apps_n;

/* The host side of a CPU instance's ctx: the back ends are its client
 * mqueues, found by name. ctx comes first (host_priv points here). */
struct lynx_app_env {
  struct lynx_app_ctx ctx;
  struct lynx_client *clients;
  uint32_t n_clients;
};
void lynx_app_env_init(struct lynx_app_env *e, const struct lynx_app *app,
                       struct lynx_client *clients, uint32_t n_clients,
                       void *state, const volatile int *stop,
                       uint64_t call_timeout_ns);

static inline int lynx_app_handle(const struct lynx_app *app,
                                  struct lynx_mq *mq,
                                  const struct lynx_msg *req, int *replied,
                                  const struct lynx_app_ctx *ctx) {
  return app->def->handle(mq, req, replied, ctx);
}

/* The app's start for an instance (config NULL: the app's default): 0 and
 * *state, or -errno with the reason in why, prefixed with the app's name.
 * An app another process serves (runner) starts there: 0, *state NULL. */
int lynx_app_start(const struct lynx_app *app, const char *service,
                   const char *config, uint32_t n_mqueues,
                   uint32_t slot_payload, uint32_t msg_max,
                   const char *const *backends, uint32_t n_backends,
                   void **state, char *why, size_t whylen);
/* Its stop, once the instance takes no more requests. */
void lynx_app_stop(const struct lynx_app *app, void *state);

/* ---- the registry (app_registry.c) ------------------------------------- */

/* The application called name, or NULL. */
const struct lynx_app *lynx_app_find(const char *name);
/* The i-th application (built-ins first, then the loaded ones in the
 * order they were loaded), NULL past the end. */
const struct lynx_app *lynx_app_at(size_t i);
/* "echo, sockperf-echo, ...": for error messages (a static buffer: the
 * agent's loop thread only). */
const char *lynx_app_names(void);
/* The applications that have a CUDA kernel, the same way. */
const char *lynx_app_cuda_names(void);

/* 1 when name is a valid application name (LYNX_APP_NAME_MAX). */
int lynx_app_name_ok(const char *name);

/*
 * Loads the plug-in at path (a shared object exporting lynx_app_entry) and
 * adds its application; name, when not NULL, is the name the operator
 * gave, which the definition must carry. 0, or -errno with the reason in
 * why, and the refusal is kept (lynx_app_refused_at) under name, or the
 * file's name without "lib" and ".so". Before any instance runs: the
 * registry is not locked.
 */
int lynx_app_load(const char *name, const char *path, char *why, size_t whylen);
/* Every *.so and *.fatbin in dir, in name order, each through load (NULL:
 * lynx_app_load), which keeps its refusal. The number loaded, or -errno
 * when dir cannot be read (the reason in why). */
typedef int (*lynx_app_loader)(void *arg, const char *name, const char *path,
                               char *why, size_t whylen);
int lynx_app_load_dir(const char *dir, lynx_app_loader load, void *arg,
                      char *why, size_t whylen);
/* The checks of a plug-in's file made before it is loaded (an ELF shared
 * object for this machine): 0, or -errno with the reason in why. */
int lynx_app_check_file(const char *path, char *why, size_t whylen);
/* An application a process of its own serves (its definition's name,
 * help and back end as that process read them), started through runner
 * with host: 0, or -errno with the reason in why (the refusal kept). */
int lynx_app_add_hosted(const char *name, const char *help,
                        const char *needs_backend, const char *origin,
                        const struct lynx_accel_ops *runner, void *host,
                        char *why, size_t whylen);
/* Keeps a refusal of the plug-in called name (as lynx_app_load does). */
void lynx_app_refuse(const char *name, const char *reason);
/* The file's name without "lib" and ".so": what a plug-in's refusal is
 * kept under when nothing better is known. */
void lynx_app_file_stem(const char *path, char *out, size_t len);
/* The i-th refused plug-in: its name and the reason; 0 past the end. */
int lynx_app_refused_at(size_t i, const char **name, const char **reason);
/* Why the plug-in called name was refused (its first refusal), or NULL. */
const char *lynx_app_refusal(const char *name);
/* The configuration name's instances start with when their service gives
 * none (a JSON object's text). 0, -ENOENT (no such app), -EINVAL (not an
 * object, or larger than LYNX_APP_CONFIG_MAX; why says). */
int lynx_app_set_default(const char *name, const char *config, char *why,
                         size_t whylen);
/* 1 when path's file begins like a CUDA fatbin (its magic). */
int lynx_app_is_fatbin(const char *path);
/* Reads the CUDA module at path (a fatbin of lynx_kernel.cuh's kernel)
 * and adds it as a GPU application that no backend has taken yet, called
 * name (NULL: the file's stem until its module names it): 0, or -errno
 * with the reason in why (the refusal kept). */
int lynx_app_load_module(const char *name, const char *path, char *why,
                         size_t whylen);
/* 1 when GPU application app's module has code for compute capability cc
 * (major * 10 + minor): a cubin for it, or PTX of one at most its own. */
int lynx_app_image_runs_on(const struct lynx_app *app, unsigned cc);
/* The i-th GPU application no backend has taken yet (NULL past the end). */
struct lynx_app *lynx_app_module_at(size_t i);
/* A backend took app's module (handle module), which calls itself name
 * (the name given at load, if any, must be it), with help and the back end
 * it calls ("" or NULL: none): 0, or -errno with the reason in why (the
 * caller drops it). */
int lynx_app_adopt(struct lynx_app *app, void *module, const char *name,
                   const char *help, const char *needs_backend, char *why,
                   size_t whylen);
/* Takes app out of the registry, refused for reason (before any instance
 * runs). */
void lynx_app_drop(struct lynx_app *app, const char *reason);
/* At exit, after every instance stopped: unloads the plug-ins. */
void lynx_apps_unload(void);

#endif
