/* notify.c - sd_notify readiness and status; see notify.h. */
#include "notify.h"

#include <stdarg.h>
#include <stdio.h>
#include <systemd/sd-daemon.h>

static int g_ready; /* READY=1 sent */

static void send_state(const char *state, const char *fmt, va_list ap) {
  char status[256], msg[320];
  vsnprintf(status, sizeof(status), fmt, ap);
  snprintf(msg, sizeof(msg), "%s%sSTATUS=%s", state ? state : "",
           state ? "\n" : "", status);
  /* 0: no $NOTIFY_SOCKET; < 0: the manager went away. Neither stops a
   * daemon, and the environment stays for a later call */
  (void)sd_notify(0, msg);
}

void lynx_notify_ready(const char *fmt, ...) {
  va_list ap;
  int first = !__atomic_exchange_n(&g_ready, 1, __ATOMIC_ACQ_REL);
  va_start(ap, fmt);
  send_state(first ? "READY=1" : NULL, fmt, ap);
  va_end(ap);
}

void lynx_notify_stopping(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  send_state("STOPPING=1", fmt, ap);
  va_end(ap);
}
