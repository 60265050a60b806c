/*
 * cmd_watch.c - lynxctl watch: a line and the node table at every change
 * of the registry, until interrupted.
 *
 * A change is seen with the API's long poll (ctl_watch_wait, api.c:
 * /v1/watch?since=VERSION, which answers as soon as the registry's version
 * moves on, or after WATCH_POLL_MS with the same version: it is asked
 * again). An outage of the coordinator is ridden out, said once when it
 * starts and once when it ends, and asked again every second; with
 * several --api addresses the next call goes to whichever answers.
 */
#include <errno.h>
#include <json-c/json.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "lynxctl.h"
#include "util.h"

int ctl_cmd_watch(struct ctl *t, int argc, char **argv) {
  struct json_object *nodes = NULL, *v, *items;
  char *raw = NULL;
  uint64_t version;
  int rc, lost = 0;

  (void)argc;
  (void)argv;
  ctl_catch_stop();

  rc = ctl_api(t, "GET", "/v1/nodes", NULL, &nodes, &raw);
  if (rc || ctl_stop) {
    json_object_put(nodes);
    free(raw);
    return rc;
  }
  t->quiet = 1; /* from now on outages are retried, not fatal */
  for (;;) {
    time_t now = time(NULL);
    struct tm tm;
    char ts[32];
    version = nodes && json_object_object_get_ex(nodes, "version", &v)
                  ? json_object_get_uint64(v)
                  : 0;
    localtime_r(&now, &tm);
    strftime(ts, sizeof(ts), "%H:%M:%S", &tm);
    if (t->json) {
      if (raw)
        fputs(raw, stdout);
    } else {
      items = NULL;
      if (nodes)
        json_object_object_get_ex(nodes, "items", &items);
      printf("--- %s version %llu: %zu node(s)\n", ts,
             (unsigned long long)version,
             items ? json_object_array_length(items) : (size_t)0);
      ctl_print_table(stdout, items, ctl_node_cols);
    }
    fflush(stdout);
    json_object_put(nodes);
    nodes = NULL;
    free(raw);
    raw = NULL;

    for (;;) { /* the next version, then its node table */
      rc = ctl_watch_wait(t, version, 0, &lost);
      if (rc || ctl_stop)
        return rc;
      rc = ctl_api(t, "GET", "/v1/nodes", NULL, &nodes, &raw);
      if (rc == EX_OK && !ctl_stop)
        break;
      json_object_put(nodes);
      nodes = NULL;
      free(raw);
      raw = NULL;
      if (rc != EX_UNREACHABLE || ctl_stop)
        return rc;
      if (!lost)
        fprintf(stderr,
                "lynxctl: lost the coordinator at %s; retrying "
                "every second\n",
                ctl_api_names(t));
      lost = 1; /* the watch call says when it is back */
    }
  }
}
