/*
 * lynxctl.h - what lynxctl's files share: the client's state, its HTTP
 * calls, the table printer, and each command family's entry point.
 *
 * lynxctl.c holds main, the global options and the command table; each
 * family of commands is one file behind one entry in that table
 * (cmd_node.c, cmd_service.c, cmd_service_create.c, cmd_frontend.c,
 * cmd_watch.c, cmd_top.c). They reach the coordinator only through api.c
 * (libcurl: the --api addresses tried in turn, the errors said with a
 * hint) and print through output.c (aligned tables, or the API's JSON as
 * it came). Everything here is for lynxctl alone, prefixed ctl_; the rest
 * of each file is static.
 */
#ifndef LYNX_CTL_H
#define LYNX_CTL_H

#include <curl/curl.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct json_object;
struct lynx_opt;
struct lynx_opts_scan;

/* exit codes */
#define EX_OK 0
#define EX_API 1
#define EX_USAGE 2
#define EX_UNREACHABLE 3

/* the API lynxctl calls without --api or $LYNX_API (the usage text says it) */
#define DEFAULT_API "http://127.0.0.1:7780"

#define CALL_TIMEOUT_MS 15000L

#define API_MAX 8    /* --api addresses */
#define API_LEN 512  /* one address */
#define ERR_MAX 1024 /* what went wrong in one call, on one line */
#define MSG_MAX 4096

/* How an address failed, for the hint that goes with it. */
enum fail_hint {
  HINT_NONE,      /* nothing answers there (connection refused, timeout) */
  HINT_TLS_CERT,  /* an https:// handshake failed: the certificate, mostly */
  HINT_TRY_HTTPS, /* http:// got no answer: the API may serve HTTPS */
  HINT_TRY_HTTP,  /* https:// got plain text: the API may serve HTTP */
};

/* One address a call tried and what it said, when it did not do. */
struct attempt {
  char api[API_LEN];
  char what[CURL_ERROR_SIZE + 160];
  enum fail_hint hint;
  int answered; /* it answered (503 no_leader), it was not unreachable */
};

struct ctl {
  char api[API_LEN]; /* the address in use: the one that answered last */
  char apis[API_MAX][API_LEN];           /* --api, in order */
  char api_all[API_MAX * (API_LEN + 2)]; /* "A, B": for messages */
  int n_apis, cur;                       /* cur: apis[cur] is api */
  /* the last call's addresses that did not do, in the order tried (all of
   * them when the call failed) */
  struct attempt tried[API_MAX];
  int n_tried;
  char *token;
  const char *cacert; /* CA file for an https API, or NULL: the system's */
  int json;
  int quiet; /* do not report an unreachable coordinator (watch retries) */
  CURL *curl;
};

struct buf {
  char *p;
  size_t len;
};

/* ---- usage.c: usage ------------------------------------------------------ */

/* The usage text (--help). */
extern const char ctl_usage_text[];
/* "lynxctl: " and the message on stderr, with the --help hint: EX_USAGE. */
int ctl_usage_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A command's options into opts (tab's). 1 when the command ends here,
 * with *exit_code: after an error (said, with a hint: EX_USAGE) or --help
 * (EX_OK), opts freed; 0 to go on (*exit_code EX_OK). */
int ctl_scan_cmd(const struct lynx_opt *tab, void *opts, int argc, char **argv,
                 struct lynx_opts_scan *scan, int *exit_code);

/* ---- api.c: the HTTP client --------------------------------------------- */

/* Set by SIGINT and SIGTERM once ctl_catch_stop has run (watch and top
 * call it): a call in flight is aborted, and their loops end. */
extern volatile sig_atomic_t ctl_stop;

/* SIGINT and SIGTERM set ctl_stop from now on. */
void ctl_catch_stop(void);

/* --api (or $LYNX_API, named by what) into t->apis: URL[,URL...], each
 * with http:// when no scheme is given and no trailing /; blanks around
 * an address are dropped. 0, or EX_USAGE (said). */
int ctl_set_apis(struct ctl *t, const char *v, const char *what);

/* The addresses for a message about all of them: "A, B", or the one. */
const char *ctl_api_names(const struct ctl *t);

/*
 * One exchange with the coordinator: with several addresses, each in turn
 * from the one that answered last, until one answers. 0 with *status and
 * the body in *resp (malloc'd or NULL, the caller's to free; t->api the
 * address that answered); -EHOSTUNREACH when none can be reached (err,
 * errlen bytes, says why on one line, t->tried for each); -EINTR when
 * interrupted.
 */
int ctl_http_call(struct ctl *t, const char *method, const char *path,
                  const char *body, long timeout_ms, long *status,
                  struct buf *resp, char *err, size_t errlen);

/*
 * A call whose answer must be 2xx JSON, printing nothing. EX_OK with *out
 * (a parsed object, or NULL when the body is empty or the call was
 * interrupted) and *raw, the body as it came (malloc'd, or NULL); otherwise
 * the exit code with msg saying what went wrong (without "lynxctl: "), and
 * for a refusal (not 2xx) the refusal's body in *raw.
 */
int ctl_api_msg(struct ctl *t, const char *method, const char *path,
                const char *body, struct json_object **out, char **raw,
                char *msg, size_t msglen);

/*
 * ctl_api_msg that prints what went wrong (an unreachable coordinator not
 * while t->quiet), with --json a refusal's body on stdout too; raw may be
 * NULL when the body is not wanted.
 */
int ctl_api(struct ctl *t, const char *method, const char *path,
            const char *body, struct json_object **out, char **raw);

/* "/v1/nodes/" + escaped id + suffix into path (len bytes): 0 or
 * -ENOMEM. */
int ctl_path_with(struct ctl *t, char *path, size_t len, const char *prefix,
                  const char *seg, const char *suffix);

/* ---- output.c: tables --------------------------------------------------- */

/* One cell's text from the value v (NULL when the item has no such key),
 * into out (n bytes). */
typedef void (*fmt_fn)(struct json_object *v, char *out, size_t n);

/* A table's column: its heading, the items' key it shows, how. A table is
 * an array of them ending with {NULL, NULL, NULL}. */
struct col {
  const char *head;
  const char *key;
  fmt_fn fmt;
};

/* The formatters the families share: the value as text ("-" for null or
 * none), the same with "" as "-" too, labels as "k=v,k2=v2", milliseconds
 * as an age ("1.5s ago"), a boolean as yes or no. */
void ctl_f_str(struct json_object *v, char *out, size_t n);
void ctl_f_str_dash(struct json_object *v, char *out, size_t n);
void ctl_f_labels(struct json_object *v, char *out, size_t n);
void ctl_f_ms_ago(struct json_object *v, char *out, size_t n);
void ctl_f_bool(struct json_object *v, char *out, size_t n);

/* Prints items (a JSON array of objects) as an aligned table: 0 or
 * -ENOMEM. */
int ctl_print_table(FILE *f, struct json_object *items, const struct col *cols);

/* GET path and print its "items" with cols (--json: the answer as it
 * came). An exit code. */
int ctl_list(struct ctl *t, const char *path, const struct col *cols);

/* DELETE / POST on one object; prints `done` (with the object's state when
 * it has one) or the raw answer with --json. An exit code. */
int ctl_object(struct ctl *t, const char *method, const char *prefix,
               const char *id, const char *suffix, const char *what,
               const char *done);

/* ---- the command families ----------------------------------------------- */

/* Each takes the command's words, argv[0] the command itself, argc within
 * the bounds of its entry in lynxctl.c's table; it returns an exit code. */
/* cmd_node.c */
int ctl_cmd_nodes(struct ctl *t, int argc, char **argv);
int ctl_cmd_accelerators(struct ctl *t, int argc, char **argv);
int ctl_cmd_node(struct ctl *t, int argc, char **argv);
/* cmd_service.c */
int ctl_cmd_services(struct ctl *t, int argc, char **argv);
int ctl_cmd_mqueues(struct ctl *t, int argc, char **argv);
/* cmd_frontend.c */
int ctl_cmd_frontends(struct ctl *t, int argc, char **argv);
int ctl_cmd_frontend(struct ctl *t, int argc, char **argv);
/* cmd_watch.c */
int ctl_cmd_watch(struct ctl *t, int argc, char **argv);
/* cmd_top.c */
int ctl_cmd_top(struct ctl *t, int argc, char **argv);

/* What the families share among themselves. */
extern const struct col ctl_node_cols[]; /* cmd_node.c: nodes, watch */
extern const struct col ctl_svc_cols[];  /* cmd_service.c: services, create */

/* service create (cmd_service_create.c): argv[0] is "create"; the rest its
 * options. An exit code. */
int ctl_service_create(struct ctl *t, int argc, char **argv);
/* service show NAME (cmd_service.c): the service, its instances and back
 * ends. An exit code. */
int ctl_service_show(struct ctl *t, const char *name);

/*
 * api.c (the long poll): waits until the registry version differs from version
 * (it grew, or the coordinator restarted with a lower one), or until the
 * monotonic clock (lynx_now_ns) reaches until_ns (0: no end); rides out
 * coordinator outages (*lost: one is being ridden out, said once). EX_OK
 * (also when interrupted: ctl_stop is set) or EX_API.
 */
int ctl_watch_wait(struct ctl *t, uint64_t version, uint64_t until_ns,
                   int *lost);

#endif
