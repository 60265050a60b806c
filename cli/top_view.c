/*
 * top_view.c - lynxctl top's refresh loop: read a frame, give it rates
 * against the one before, sort it, show it; in batch mode as text on
 * stdout, else on the terminal with ncurses (top.h).
 *
 * The screen keeps the last frame it read while the coordinator cannot be
 * reached or refuses, says why on its last line, and tries again at every
 * refresh. It formats only the rows that fit, but reads and sorts every
 * accelerator (the header counts them all): O(n log n) a refresh.
 *
 * The delay runs from the end of one read to the start of the next: the
 * coordinator re-encodes a list at most once a second (docs/api.md,
 * "Freshness of the big lists"), and a read that starts a little under a
 * second after the last one would get the same encoding, heartbeat ages
 * and all, instead of a fresh one.
 */
#include <curses.h>
#include <errno.h>
#include <json-c/json.h>
#include <locale.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "top.h"
#include "util.h"

#define MSG_MAX 1024

/* src->get's callbacks: one per list */
static int each_nodes(void *ctx, struct json_object *answer) {
  struct lynx_top_frame *f = ctx;
  /* when the page came: its heartbeat ages count back from there */
  f->page_at_ns = lynx_now_ns();
  return lynx_top_add_nodes(f, answer);
}

static int each_mqueues(void *ctx, struct json_object *answer) {
  return lynx_top_add_mqueues(ctx, answer);
}

static int each_frontends(void *ctx, struct json_object *answer) {
  return lynx_top_add_frontends(ctx, answer);
}

/* One frame into f (initialised here). 0, or src's exit code with msg. */
static int read_frame(const struct lynx_top_src *src, struct lynx_top_frame *f,
                      char *msg, size_t n) {
  int rc;
  lynx_top_frame_init(f);
  f->at_ns = lynx_now_ns();
  rc = src->get(src->arg, "/v1/nodes", LYNX_TOP_PAGE_NODES, each_nodes, f, msg,
                n);
  if (rc)
    return rc;
  if (lynx_top_index(f)) {
    snprintf(msg, n, "top: out of memory for %zu accelerators", f->n);
    return 1;
  }
  rc = src->get(src->arg, "/v1/mqueues", 0, each_mqueues, f, msg, n);
  if (!rc)
    rc = src->get(src->arg, "/v1/frontends", 0, each_frontends, f, msg, n);
  return rc;
}

static void clock_now(char *out, size_t n) {
  time_t now = time(NULL);
  struct tm tm;
  localtime_r(&now, &tm);
  strftime(out, n, "%H:%M:%S", &tm);
}

/* Sleeps s seconds or until *stop. */
static void nap(double s, volatile sig_atomic_t *stop) {
  uint64_t end = lynx_now_ns() + (uint64_t)(s * 1e9);
  while (!*stop) {
    uint64_t now = lynx_now_ns();
    struct timespec ts;
    if (now >= end)
      return;
    /* in steps of at most 100 ms: a signal ends a nanosleep, but one
     * that came just before it would not */
    now = end - now > 100000000u ? 100000000u : end - now;
    ts.tv_sec = 0;
    ts.tv_nsec = (long)now;
    nanosleep(&ts, NULL);
  }
}

static int run_batch(const struct lynx_top_opts *o,
                     const struct lynx_top_src *src,
                     volatile sig_atomic_t *stop) {
  struct lynx_top_frame prev, cur;
  char msg[MSG_MAX], clock[32];
  int rc = 0;
  lynx_top_frame_init(&prev);
  for (uint32_t k = 0; !*stop && (!o->count || k < o->count); k++) {
    if (k)
      nap(o->delay_s, stop);
    if (*stop)
      break;
    rc = read_frame(src, &cur, msg, sizeof(msg));
    if (rc || *stop) {
      if (rc)
        fprintf(stderr, "lynxctl: %s\n", msg);
      lynx_top_frame_free(&cur);
      break;
    }
    lynx_top_rates(&cur, k ? &prev : NULL);
    lynx_top_sort(&cur, o->key);
    clock_now(clock, sizeof(clock));
    if (lynx_top_print(stdout, &cur, src->api, o->key, clock)) {
      fprintf(stderr, "lynxctl: top: cannot write to stdout: %s\n",
              strerror(errno));
      rc = 1;
    }
    lynx_top_frame_free(&prev);
    prev = cur;
    if (rc)
      break;
  }
  lynx_top_frame_free(&prev);
  return rc;
}

/* ---- the screen ---------------------------------------------------------- */

/* s cut to at most cols columns without splitting a UTF-8 character: a
 * character takes at most as many columns as it has bytes (a wide one, 2,
 * has 3 or 4), so bytes bound columns. Drawn with addnstr, a line longer
 * than the screen would wrap onto the next. */
static int fit(const char *s, int cols) {
  size_t len = strlen(s);
  if (cols <= 0)
    return 0;
  if (len <= (size_t)cols)
    return (int)len;
  len = (size_t)cols;
  while (len > 0 && ((unsigned char)s[len] & 0xC0) == 0x80)
    len--; /* s[len] continues a character: cut before it */
  return (int)len;
}

static void put_line(int y, const char *s, attr_t attr) {
  move(y, 0);
  clrtoeol();
  if (attr)
    attron(attr);
  addnstr(s, fit(s, COLS));
  if (attr)
    attroff(attr);
}

/* Draws f (NULL: none read yet) with status on the last line (an error in
 * bold; else the keys). */
static void draw(const struct lynx_top_frame *f, const struct lynx_top_src *src,
                 enum lynx_top_key key, const char *clock, const char *status,
                 int is_error) {
  struct lynx_top_layout lay;
  char line[1024];
  int y = 0;
  size_t shown = 0;
  erase();
  if (f) {
    lynx_top_layout(f, &lay);
    for (int i = 0; i < LYNX_TOP_HEADER_LINES && y < LINES - 1; i++, y++) {
      lynx_top_header(f, src->api, key, clock, i, line, sizeof(line));
      put_line(y, line, 0);
    }
    if (y < LINES - 1) {
      lynx_top_columns(&lay, line, sizeof(line));
      put_line(y++, line, A_REVERSE);
    }
    /* as many rows as fit above the status line */
    for (; shown < f->n && y < LINES - 1; shown++, y++) {
      lynx_top_row_text(&lay, f->view[shown], line, sizeof(line));
      put_line(y, line, 0);
    }
  } else {
    snprintf(line, sizeof(line), "lynxctl top: %s  %s", src->api, clock);
    put_line(0, line, 0);
  }
  if (!is_error && f && shown < f->n)
    snprintf(line, sizeof(line), "%s  (%zu of %zu shown)", status, shown, f->n);
  else
    snprintf(line, sizeof(line), "%s", status);
  put_line(LINES - 1, line, is_error ? A_BOLD : A_DIM);
  refresh();
}

static const char keys_text[] =
    "q quit  r rate  o outstanding  p p99  i id  space refresh";

/* What a key does to the sort; -1 when it is no sort key. */
static int key_sort(int ch) {
  switch (ch) {
  case 'r':
    return LYNX_TOP_BY_RATE;
  case 'o':
    return LYNX_TOP_BY_OUTSTANDING;
  case 'p':
    return LYNX_TOP_BY_P99;
  case 'i':
    return LYNX_TOP_BY_ID;
  default:
    return -1;
  }
}

static int run_screen(const struct lynx_top_opts *o,
                      const struct lynx_top_src *src,
                      volatile sig_atomic_t *stop) {
  struct lynx_top_frame cur; /* the frame on screen */
  enum lynx_top_key key = o->key;
  char msg[MSG_MAX], status[MSG_MAX + 64], clock[32];
  const char *term = getenv("TERM");
  int have = 0, is_error = 0, quit = 0;
  SCREEN *scr;

  setlocale(LC_ALL, ""); /* models and errors are UTF-8 text */
  /* newterm, not initscr: initscr exits the program when the terminal is
   * unknown */
  scr = newterm(NULL, stdout, stdin);
  if (!scr) {
    fprintf(stderr,
            "lynxctl: top: cannot set up the terminal (TERM=%s): use -b for "
            "text frames\n",
            term && term[0] ? term : "(unset)");
    return 1;
  }
  cbreak();
  noecho();
  keypad(stdscr, TRUE);
  curs_set(0);
  lynx_top_frame_init(&cur);
  snprintf(status, sizeof(status), "%s", keys_text);

  for (uint32_t k = 0; !*stop && !quit && (!o->count || k < o->count); k++) {
    uint64_t deadline;
    struct lynx_top_frame next;
    int rc = read_frame(src, &next, msg, sizeof(msg));
    if (*stop) {
      lynx_top_frame_free(&next);
      break;
    }
    if (rc) {
      /* the first line of the message: its hint is for a shell */
      char *nl = strchr(msg, '\n');
      if (nl)
        *nl = 0;
      lynx_top_frame_free(&next);
      /* what it does first: a narrow screen cuts the line's end */
      snprintf(status, sizeof(status), "trying again every %.1f s: %s",
               o->delay_s, msg);
      is_error = 1;
      if (!have)
        clock_now(clock, sizeof(clock)); /* else the last frame's time */
    } else {
      /* against the last frame read, however long ago (an outage) */
      lynx_top_rates(&next, have ? &cur : NULL);
      lynx_top_sort(&next, key);
      lynx_top_frame_free(&cur);
      cur = next;
      have = 1;
      is_error = 0;
      snprintf(status, sizeof(status), "%s", keys_text);
      clock_now(clock, sizeof(clock));
    }
    draw(have ? &cur : NULL, src, key, clock, status, is_error);
    if (o->count && k + 1 >= o->count)
      break;
    deadline = lynx_now_ns() + (uint64_t)(o->delay_s * 1e9);
    for (;;) { /* keys until the next refresh */
      uint64_t now = lynx_now_ns();
      int ch, s;
      if (*stop || now >= deadline)
        break;
      timeout((int)((deadline - now + 999999) / 1000000));
      ch = getch();
      if (ch == ERR)
        continue; /* the time is up, or a signal */
      if (ch == 'q' || ch == 'Q') {
        quit = 1;
        break;
      }
      if (ch == ' ')
        break;
      if ((s = key_sort(ch)) >= 0) {
        key = (enum lynx_top_key)s;
        if (have)
          lynx_top_sort(&cur, key);
      } else if (ch != KEY_RESIZE) {
        continue;
      }
      draw(have ? &cur : NULL, src, key, clock, status, is_error);
    }
  }
  endwin();
  delscreen(scr);
  lynx_top_frame_free(&cur);
  return 0;
}

int lynx_top_run(const struct lynx_top_opts *o, const struct lynx_top_src *src,
                 volatile sig_atomic_t *stop) {
  if (o->batch)
    return run_batch(o, src, stop);
  return run_screen(o, src, stop);
}
