/* A plug-in whose constructor aborts while it loads: its process dies, the
 * agent refuses it with how, and runs on. */
#include <stdlib.h>

#include "lynx_app.h"

__attribute__((constructor)) static void die_at_load(void) { abort(); }

static int handle(struct lynx_mq *mq, const struct lynx_msg *req, int *replied,
                  const struct lynx_app_ctx *ctx) {
  (void)ctx;
  *replied = 0;
  return lynx_drop(mq, req->tag) == -EAGAIN ? -EAGAIN : 0;
}

static const struct lynx_app_def def = {LYNX_APP_DEF_HEAD, .name = "crash-load",
                                        .handle = handle};
LYNX_APP_EXPORT(def)
