/*
 * cmd_top.c - lynxctl top: its options, and the source it reads frames
 * from (struct lynx_top_src, top.h), which is lynxctl's HTTP client.
 *
 * The model (top.c) and the screen (top_view.c) know nothing of HTTP:
 * they ask top_get for a list and are given its answers one page at a
 * time; top_get walks the pages (docs/api.md, "Pages of the big lists")
 * and refuses a coordinator whose pages do not move on.
 */
#include <curl/curl.h>
#include <errno.h>
#include <json-c/json.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lynxctl.h"
#include "options.h"
#include "top.h"

/* lynx_top_src's get (top.h): the list at path, a page of `page` items at
 * a time (docs/api.md, "Pages of the big lists") when page > 0. */
static int top_get(void *arg, const char *path, unsigned page,
                   int (*each)(void *ctx, struct json_object *answer),
                   void *ctx, char *msg, size_t msglen) {
  struct ctl *t = arg;
  char url[1024], after[256] = "";
  for (;;) {
    struct json_object *j, *next;
    const char *nx;
    char *raw;
    int rc;
    if (!page) {
      snprintf(url, sizeof(url), "%s", path);
    } else if (!after[0]) {
      snprintf(url, sizeof(url), "%s?limit=%u", path, page);
    } else {
      char *e = curl_easy_escape(t->curl, after, 0);
      if (!e) {
        snprintf(msg, msglen, "top: out of memory");
        return EX_API;
      }
      snprintf(url, sizeof(url), "%s?limit=%u&after=%s", path, page, e);
      curl_free(e);
    }
    rc = ctl_api_msg(t, "GET", url, NULL, &j, &raw, msg, msglen);
    free(raw);
    if (rc)
      return rc;
    if (!j) {
      if (ctl_stop)
        return EX_OK; /* interrupted: the caller sees ctl_stop */
      snprintf(msg, msglen, "the coordinator's answer to GET %s is empty", url);
      return EX_API;
    }
    rc = each(ctx, j);
    if (rc) {
      if (rc == -ENOMEM)
        snprintf(msg, msglen, "top: out of memory reading GET %s", url);
      else
        snprintf(msg, msglen,
                 "the coordinator's answer to GET %s is not a list (no "
                 "\"items\" array)",
                 url);
      json_object_put(j);
      return EX_API;
    }
    if (!page || !json_object_object_get_ex(j, "next", &next) ||
        !json_object_is_type(next, json_type_string)) {
      json_object_put(j);
      return EX_OK;
    }
    /* a page must move on: a coordinator that answered the same "next"
     * again would keep us here for ever */
    nx = json_object_get_string(next);
    if (!nx[0] || strlen(nx) >= sizeof(after) || strcmp(nx, after) == 0) {
      snprintf(msg, msglen,
               "the coordinator's pages of %s do not move on (\"next\": "
               "\"%.64s\" after \"%.64s\")",
               path, nx, after);
      json_object_put(j);
      return EX_API;
    }
    snprintf(after, sizeof(after), "%s", nx);
    json_object_put(j);
  }
}

/* top's options (common/options.h): one-letter ones, as top(1) has */
struct top_cli {
  char *delay, *sort;
  uint32_t count;
  int batch;
};

#define TO(f) offsetof(struct top_cli, f)
static const struct lynx_opt top_tab[] = {
    {"d", LYNX_OPT_STR, TO(delay), "1", 0, 0, NULL, "seconds between frames"},
    {"n", LYNX_OPT_U32, TO(count), "0", 0, UINT32_MAX, NULL,
     "frames, then exit (0: until q)"},
    {"s", LYNX_OPT_STR, TO(sort), "rate", 0, 0, NULL,
     "rate, outstanding, p99 or id"},
    {"b", LYNX_OPT_FLAG, TO(batch), NULL, 0, 0, NULL, "text frames on stdout"},
    LYNX_OPT_END,
};
#undef TO

/* argv[0] is "top"; the rest its options. */
int ctl_cmd_top(struct ctl *t, int argc, char **argv) {
  struct top_cli c;
  struct lynx_top_opts o;
  struct lynx_top_src src = {t->api, top_get, t};
  struct lynx_opts_scan scan = {LYNX_OPTS_USAGE_ONLY, NULL, 0, 0, 0};
  char *end = NULL;
  int rc;

  memset(&c, 0, sizeof(c));
  memset(&o, 0, sizeof(o));
  if (ctl_scan_cmd(top_tab, &c, argc, argv, &scan, &rc))
    return rc;
  errno = 0;
  o.delay_s = strtod(c.delay, &end);
  /* (the negated test also refuses NaN) */
  if (errno || end == c.delay || *end || !(o.delay_s >= 0.1) ||
      o.delay_s > 3600)
    rc = ctl_usage_err("top -d: expected seconds from 0.1 to 3600 (1, 0.5), "
                       "got '%s'",
                       c.delay);
  else if (lynx_top_key_parse(c.sort, &o.key))
    rc = ctl_usage_err("top -s: expected rate, outstanding, p99 or id, "
                       "got '%s'",
                       c.sort);
  else if (t->json)
    rc = ctl_usage_err("top: --json is not for top (lynxctl --json "
                       "accelerators gives the list as JSON)");
  o.count = c.count;
  /* a pipe or a file gets text frames: no terminal to draw on */
  o.batch = c.batch || !isatty(STDOUT_FILENO);
  lynx_opts_free(top_tab, &c);
  if (rc)
    return rc;

  ctl_catch_stop();
  return lynx_top_run(&o, &src, &ctl_stop);
}
