/* A plug-in whose application takes a built-in's name ("echo"): refused,
 * names are unique on an agent. */
#include "lynx_app.h"

static int handle(struct lynx_mq *mq, const struct lynx_msg *req, int *replied,
                  const struct lynx_app_ctx *ctx) {
  (void)ctx;
  *replied = 0;
  return lynx_drop(mq, req->tag) == -EAGAIN ? -EAGAIN : 0;
}

static const struct lynx_app_def def = {LYNX_APP_DEF_HEAD, .name = "echo",
                                        .handle = handle};
LYNX_APP_EXPORT(def)
