/* A plug-in built against a future ABI: the agent refuses it (its
 * version is not the agent's). */
#include "lynx_app.h"

static int handle(struct lynx_mq *mq, const struct lynx_msg *req, int *replied,
                  const struct lynx_app_ctx *ctx) {
  (void)ctx;
  *replied = lynx_send(mq, req->tag, req->data, req->len) == 0;
  return 0;
}

static const struct lynx_app_def def = {.abi_version = LYNX_APP_ABI_VERSION + 1,
                                        .size = sizeof(struct lynx_app_def),
                                        .name = "future-abi",
                                        .handle = handle};
LYNX_APP_EXPORT(def)
