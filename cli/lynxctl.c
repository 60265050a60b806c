/*
 * lynxctl - the operator's command line for the coordinator's JSON API
 * (docs/api.md). libcurl for HTTP, json-c for JSON.
 *
 *   lynxctl [--api URL[,URL...]] [--token-file F] [--json] COMMAND
 *
 * Human-readable aligned tables by default; --json prints the API's answer
 * as it came. With several --api addresses (several coordinators, one of
 * them leading) each call tries them in turn, from the one that answered
 * last, until one answers. Exit codes: 0 ok, 1 the API refused (its message
 * is printed) or another runtime failure (a token file that cannot be
 * read), 2 usage error, 3 the coordinator cannot be reached.
 *
 * This file is the program: the global options, the command table and
 * main; the usage text and usage errors are usage.c's. The HTTP client is
 * api.c, the tables output.c, and each family of commands one file (lynxctl.h).
 */
#include <curl/curl.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lynxctl.h"
#include "options.h"
#include "util.h"

/* service create ... | service show NAME | service delete NAME: the
 * sub-commands, each its file's (cmd_service_create.c, cmd_service.c) */
static int cmd_service(struct ctl *t, int argc, char **argv) {
  const char *sub = argv[1];

  if (strcmp(sub, "create") == 0)
    return ctl_service_create(t, argc - 1, argv + 1);
  if (strcmp(sub, "show") == 0 && argc == 3)
    return ctl_service_show(t, argv[2]);
  if (strcmp(sub, "delete") == 0 && argc == 3)
    return ctl_object(t, "DELETE", "/v1/services/", argv[2], "", "service",
                      "deleted");
  return ctl_usage_err("service: expected 'create ...', 'show NAME' or "
                       "'delete NAME'");
}

/* ---- main --------------------------------------------------------------- */

/* The global options, taken wherever they stand (before "--"); the
 * command and its own options are left in order for run(). */
struct global_opts {
  char *api, *token_file, *cacert;
  int json;
};

#define GO(f) offsetof(struct global_opts, f)
enum { G_API, G_TOKEN_FILE, G_CACERT, G_JSON };
static const struct lynx_opt global_tab[] = {
    [G_API] = {"api", LYNX_OPT_STR, GO(api), NULL, 0, 0, NULL,
               "coordinator API: URL[,URL...]"},
    [G_TOKEN_FILE] = {"token-file", LYNX_OPT_STR, GO(token_file), NULL, 0, 0,
                      NULL, "send the token in this file"},
    [G_CACERT] = {"cacert", LYNX_OPT_STR, GO(cacert), NULL, 0, 0, NULL,
                  "the CA that signed the API's certificate (https)"},
    [G_JSON] = {"json", LYNX_OPT_FLAG, GO(json), NULL, 0, 0, NULL,
                "print the API's JSON instead of tables"},
    LYNX_OPT_END,
};
#undef GO

/* The commands: a word, the words it takes, itself included (not within
 * those bounds: not this command), and its family's entry point. */
static const struct {
  const char *name;
  int min_args, max_args;
  int (*run)(struct ctl *t, int argc, char **argv);
} commands[] = {
    {"nodes", 1, 1, ctl_cmd_nodes},
    {"accelerators", 1, 1, ctl_cmd_accelerators},
    {"accels", 1, 1, ctl_cmd_accelerators},
    {"mqueues", 1, 1, ctl_cmd_mqueues},
    {"services", 1, 1, ctl_cmd_services},
    {"frontends", 1, 1, ctl_cmd_frontends},
    {"watch", 1, 1, ctl_cmd_watch},
    {"top", 1, INT_MAX, ctl_cmd_top},
    {"service", 2, INT_MAX, cmd_service},
    {"node", 1, INT_MAX, ctl_cmd_node},
    {"frontend", 1, INT_MAX, ctl_cmd_frontend},
};

static int run(struct ctl *t, int argc, char **argv) {
  const char *cmd = argv[0];

  for (size_t i = 0; i < LYNX_ARRAY_SIZE(commands); i++)
    if (strcmp(cmd, commands[i].name) == 0 && argc >= commands[i].min_args &&
        argc <= commands[i].max_args)
      return commands[i].run(t, argc, argv);
  return ctl_usage_err("unknown command or wrong arguments: '%s'", cmd);
}

int main(int argc, char **argv) {
  struct ctl t;
  struct global_opts g;
  struct lynx_opts_scan scan = {LYNX_OPTS_POSITIONAL | LYNX_OPTS_PASS_UNKNOWN |
                                    LYNX_OPTS_USAGE_ONLY,
                                NULL, 0, 0, 0};
  const char *token_file = getenv("LYNX_TOKEN_FILE"), *env_api;
  const char *cacert = getenv("LYNX_CACERT");
  char **args;
  int n, rc;

  memset(&t, 0, sizeof(t));
  memset(&g, 0, sizeof(g));
  env_api = getenv("LYNX_API");
  args = calloc((size_t)argc + 1, sizeof(*args));
  if (!args)
    return EX_API;
  scan.rest = args;
  rc = lynx_opts_scan(global_tab, &g, argc, argv, ctl_usage_text, &scan);
  if (rc) {
    fputs("(lynxctl --help for usage)\n", stderr);
  } else if (!scan.help && g.api && !g.api[0]) {
    ctl_usage_err("--api needs a URL");
    rc = -EINVAL;
  }
  if (rc || scan.help) {
    lynx_opts_free(global_tab, &g);
    free(args);
    return rc ? EX_USAGE : EX_OK;
  }
  n = scan.n_rest;
  t.json = g.json;
  if (g.api)
    rc = ctl_set_apis(&t, g.api, "--api");
  else if (env_api && env_api[0])
    rc = ctl_set_apis(&t, env_api, "$LYNX_API");
  else
    rc = ctl_set_apis(&t, DEFAULT_API, "the default API");
  if (rc) {
    lynx_opts_free(global_tab, &g);
    free(args);
    return EX_USAGE;
  }
  /* --token-file, even an empty one, overrides $LYNX_TOKEN_FILE */
  if (scan.given & (1ull << G_TOKEN_FILE))
    token_file = g.token_file;
  if (scan.given & (1ull << G_CACERT))
    cacert = g.cacert;
  if (cacert && cacert[0]) {
    FILE *f = fopen(cacert, "r");
    if (!f) {
      fprintf(stderr, "lynxctl: --cacert %s: %s\n", cacert, strerror(errno));
      lynx_opts_free(global_tab, &g);
      free(args);
      return EX_API; /* a file it cannot read: a runtime failure */
    }
    fclose(f);
    t.cacert = cacert;
  }
  if (n == 0) {
    fputs(ctl_usage_text, stderr);
    lynx_opts_free(global_tab, &g);
    free(args);
    return EX_USAGE;
  }
  if (token_file && token_file[0]) {
    char err[320];
    rc = lynx_read_token(token_file, &t.token, err, sizeof(err));
    if (rc) {
      fprintf(stderr, "lynxctl: %s\n", err);
      lynx_opts_free(global_tab, &g);
      free(args);
      return EX_API; /* a runtime failure, as in every program */
    }
  }
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK ||
      !(t.curl = curl_easy_init())) {
    fprintf(stderr, "lynxctl: cannot initialise libcurl\n");
    free(t.token);
    lynx_opts_free(global_tab, &g);
    free(args);
    return EX_API;
  }
  rc = run(&t, n, args);
  fflush(stdout);
  curl_easy_cleanup(t.curl);
  curl_global_cleanup();
  free(t.token);
  lynx_opts_free(global_tab, &g);
  free(args);
  return rc;
}
