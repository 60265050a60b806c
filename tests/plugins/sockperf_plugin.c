/*
 * sockperf-plugin: the built-in sockperf-echo's handler (accel/apps.c,
 * lynx_sockperf_answer in app_logic.h), served as a plug-in:
 * bench/plugin.sh compares the two, so the cost of a plug-in's process of
 * its own is measured, not assumed. Answers pong requests as sockperf's
 * server does (the client flag cleared), drops the rest.
 */
#include "app_logic.h"
#include "lynx_app.h"

static int handle(struct lynx_mq *mq, const struct lynx_msg *req, int *replied,
                  const struct lynx_app_ctx *ctx) {
  (void)ctx;
  return lynx_sockperf_answer(mq, req, replied);
}

static const struct lynx_app_def def = {
    LYNX_APP_DEF_HEAD, .name = "sockperf-plugin",
    .help = "sockperf-echo as a plug-in (bench/plugin.sh)", .handle = handle};
LYNX_APP_EXPORT(def)
