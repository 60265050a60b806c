/*
 * top.h - lynxctl top: the accelerators by load, refreshed every second
 * (docs/api.md, "lynxctl top").
 *
 * Two halves. The model (top.c, tests/unit/test_top.c) is pure: a frame is
 * what one refresh read from the API, filled from its JSON answers, given
 * rates against the previous frame, sorted, and written as text lines. The
 * view (top_view.c) is the refresh loop: it reads through lynxctl's HTTP
 * client (struct lynx_top_src: nothing of HTTP is done here), and writes
 * each frame to stdout (batch) or draws it with ncurses.
 *
 * The accelerators come from /v1/nodes, walked a page at a time: each node
 * carries its accelerators as /v1/accelerators shows them, so one paged
 * list gives the node states (nodes without accelerators too) and the
 * accelerators, instead of two lists of nearly the same size (5 MB at
 * 10,000 accelerators). /v1/mqueues (not paged by the API) gives the
 * outstanding requests, /v1/frontends the frontends.
 *
 * Work per refresh is O(n log n) in the accelerators: the rows are sorted
 * by id once (rates merge two frames in id order; an mqueue finds its
 * accelerator by binary search) and once by the key shown; a screen formats
 * only the rows it shows.
 */
#ifndef LYNX_TOP_H
#define LYNX_TOP_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct json_object;

/* Text kept of a node id, kind or model: the API's ids are at most 63
 * bytes (proto/wire.h, LYNX_ID_MAX); longer text is cut. */
#define LYNX_TOP_TEXT_MAX 64
/* health.last_error: at most 127 bytes (docs/api.md) */
#define LYNX_TOP_ERR_MAX 128
/* lines of the header above the column names */
#define LYNX_TOP_HEADER_LINES 4

/* Readers of the API's JSON (lynxctl's tables use them too): the unsigned
 * integer at key, 0 when o is NULL or key is absent or not an integer; 1
 * when key is the boolean true, else 0. */
uint64_t lynx_top_u64(struct json_object *o, const char *key);
int lynx_top_bool(struct json_object *o, const char *key);
/* ?limit= of a /v1/nodes page: at 4 accelerators a node about 1 MB */
#define LYNX_TOP_PAGE_NODES 500u

/* A node's state, as the API names it (LYNX_TOP_OTHER: a name it added). */
enum lynx_top_nstate {
  LYNX_TOP_READY,
  LYNX_TOP_DRAINING,
  LYNX_TOP_DRAINED,
  LYNX_TOP_DOWN,
  LYNX_TOP_OTHER,
  LYNX_TOP_NSTATES
};

/* Sort keys (-s): the first three descending, a value not known (no rate
 * yet, no request in the latency window) after every known one; ties, and
 * id itself, ascending by id (node id, then index as a number). */
enum lynx_top_key {
  LYNX_TOP_BY_RATE,        /* requests/s since the previous frame */
  LYNX_TOP_BY_OUTSTANDING, /* requests outstanding on its mqueues */
  LYNX_TOP_BY_P99,         /* service p99 */
  LYNX_TOP_BY_ID,
};

/* An accelerator's "health" object. */
struct lynx_top_health {
  int dispatchable, lost, failed;
  uint32_t stalled_mqueues;
  uint64_t stall_ms;
  char last_error[LYNX_TOP_ERR_MAX];
};

/* One accelerator of a frame. */
struct lynx_top_row {
  char node[LYNX_TOP_TEXT_MAX];
  uint32_t idx;
  enum lynx_top_nstate state; /* its node's */
  uint64_t epoch;             /* its node's: a new one restarts the counters */
  char kind[LYNX_TOP_TEXT_MAX], model[LYNX_TOP_TEXT_MAX];
  uint64_t requests;
  uint64_t beat_age_ms; /* its node's last_heartbeat_ms */
  uint64_t sampled_ns;  /* when its counters came: the page's read time less
                           beat_age_ms */
  double rate;          /* requests/s since the previous frame; < 0 unknown */
  uint64_t outstanding; /* summed over its mqueues */
  uint64_t window_requests, queue_p99_ns, service_p99_ns;
  struct lynx_top_health health;
};

/* What one refresh read. Zeroed (lynx_top_frame_init), filled by the
 * lynx_top_add_* calls in the order they are declared, then
 * lynx_top_rates and lynx_top_sort; freed with lynx_top_frame_free. */
struct lynx_top_frame {
  struct lynx_top_row *rows; /* n of cap; in id order after lynx_top_index */
  size_t n, cap;
  const struct lynx_top_row **view; /* the n rows in the order shown */
  uint64_t at_ns;                   /* monotonic time its first read began */
  uint64_t page_at_ns; /* the /v1/nodes page being added arrived (0: at_ns) */
  uint64_t version;    /* registry version of the first page */
  int have_version;
  uint32_t nodes[LYNX_TOP_NSTATES];
  uint32_t dispatchable; /* healthy accelerators of ready nodes */
  uint32_t stalled;      /* with a stalled mqueue */
  uint32_t broken;       /* lost or failed */
  uint32_t frontends, frontends_active; /* connected; of those active */
  double rate_sum;                      /* of the known rates */
  size_t rates_known;                   /* 0: the header's total is "-" */
};

void lynx_top_frame_init(struct lynx_top_frame *f);
void lynx_top_frame_free(struct lynx_top_frame *f);

/* Adds the nodes of one /v1/nodes answer (a page or the whole list) and
 * their accelerators, read at f->page_at_ns. 0; -EINVAL when the answer
 * has no "items" array (items it cannot read are skipped); -ENOMEM. */
int lynx_top_add_nodes(struct lynx_top_frame *f, struct json_object *answer);
/* Puts the rows in id order (and makes room for the view) once every
 * node is in. 0 or -ENOMEM. */
int lynx_top_index(struct lynx_top_frame *f);
/* Adds each mqueue's outstanding requests of a /v1/mqueues answer to its
 * accelerator's row (after lynx_top_index; an mqueue of an accelerator
 * not in the frame is left out). 0 or -EINVAL as lynx_top_add_nodes. */
int lynx_top_add_mqueues(struct lynx_top_frame *f, struct json_object *answer);
/* Counts the frontends of a /v1/frontends answer. 0 or -EINVAL. */
int lynx_top_add_frontends(struct lynx_top_frame *f,
                           struct json_object *answer);
/* Each row's rate: the growth of its requests counter since the same
 * accelerator's in prev (NULL: none yet) over the time between the two
 * heartbeats that carried them (sampled_ns): not between the two reads,
 * which would count one heartbeat period too many or too few whenever a
 * read falls just before or after a heartbeat (a rate of 0 or twice the
 * truth for a frame). When its node sent no heartbeat between the two
 * frames, the previous frame's rate stays (unknown for a down node).
 * Unknown (< 0) where prev lacks it, its node's epoch changed or the
 * counter went back. Also the header's sum. */
void lynx_top_rates(struct lynx_top_frame *f,
                    const struct lynx_top_frame *prev);
/* Orders f->view by key (after lynx_top_index). */
void lynx_top_sort(struct lynx_top_frame *f, enum lynx_top_key key);

/* "rate", "outstanding", "p99", "id" <-> key. Parse: 0 or -EINVAL. */
int lynx_top_key_parse(const char *s, enum lynx_top_key *key);
const char *lynx_top_key_name(enum lynx_top_key key);

/* ---- text (no terminal control: the same lines in batch and on screen) */

/* A duration in ns as "850ns", "12.3us", "4.56ms", "1.23s". */
void lynx_top_fmt_dur(uint64_t ns, char *out, size_t n);
/* Requests/s as "0.0" .. "999.9", "1.0k" .. "999.9k", "1.00M" ...; "-"
 * when negative (unknown). */
void lynx_top_fmt_rate(double rate, char *out, size_t n);
/* Reads an accelerator's "health" object (absent fields: 0, "").  */
void lynx_top_health_parse(struct json_object *o, struct lynx_top_health *h);
/* "ok", or what keeps it out of dispatch: "lost", "failed: <last error>",
 * "stalled N mq S.Ss", joined with ", " ("out" when it says none). */
void lynx_top_health_fmt(const struct lynx_top_health *h, char *out, size_t n);
/* A row's HEALTH: its health, and "node draining|drained|down" when its
 * node is not ready ("ok" only when neither holds). */
void lynx_top_row_health(const struct lynx_top_row *r, char *out, size_t n);

/* Column widths of a frame: the text columns as wide as their longest
 * cell over every row (so that they do not move as the sort changes). */
struct lynx_top_layout {
  int id, state, kind, model;
};
void lynx_top_layout(const struct lynx_top_frame *f,
                     struct lynx_top_layout *lay);
/* Header line i (0 .. LYNX_TOP_HEADER_LINES - 1); clock is the wall-clock
 * time to show ("13:10:56"). */
void lynx_top_header(const struct lynx_top_frame *f, const char *api,
                     enum lynx_top_key key, const char *clock, int i, char *out,
                     size_t n);
/* The column names; a row. No trailing blanks. */
void lynx_top_columns(const struct lynx_top_layout *lay, char *out, size_t n);
void lynx_top_row_text(const struct lynx_top_layout *lay,
                       const struct lynx_top_row *r, char *out, size_t n);
/* A whole frame as batch mode writes it: the header, the column names,
 * every row in view order, then a blank line. 0 or -EIO. */
int lynx_top_print(FILE *out, const struct lynx_top_frame *f, const char *api,
                   enum lynx_top_key key, const char *clock);

/* ---- the refresh loop (top_view.c) ------------------------------------ */

/* How the loop reads the API: lynxctl's HTTP client. */
struct lynx_top_src {
  const char *api; /* the coordinator's URL, for the header */
  /* GET path and hand each answer to each(ctx, answer) (answer put by the
   * caller after each returns): a page of `page` items at a time (?limit=,
   * &after= its "next") when page > 0, else the one answer. 0, or
   * lynxctl's exit code (3 unreachable, 1 otherwise: each's nonzero return
   * included) with msg saying what went wrong (a line, or two: the second
   * a hint); nothing is printed. 0 with no answer handed on when *stop was
   * set meanwhile. */
  int (*get)(void *arg, const char *path, unsigned page,
             int (*each)(void *ctx, struct json_object *answer), void *ctx,
             char *msg, size_t msglen);
  void *arg;
};

struct lynx_top_opts {
  double delay_s;        /* between the end of a read and the next (-d) */
  uint32_t count;        /* frames, then exit 0 (-n; 0: until q or Ctrl-C) */
  enum lynx_top_key key; /* -s */
  int batch;             /* -b: text frames to stdout, no curses */
};

/* Runs the view until count frames, q, or *stop (SIGINT, SIGTERM; then
 * exit 0). Batch: a read that fails ends it with the src's exit code (its
 * message on stderr); the screen says so on its last line instead and
 * tries again at the next refresh. 1 when the terminal cannot be set up. */
int lynx_top_run(const struct lynx_top_opts *o, const struct lynx_top_src *src,
                 volatile sig_atomic_t *stop);

#endif
