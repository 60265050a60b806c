/*
 * lynx-apibench - latency of GET requests against the coordinator's JSON API
 * over one keep-alive connection (libcurl), as an operator's tool or a
 * controller polling the API would see it.
 *
 *   lynx-apibench [--count N] [--warmup W] [--interval-ms I] URL...
 *
 * For each URL in turn: W untimed requests, then N timed ones, each a full
 * request/response on the same connection (no new TCP handshake), back to
 * back or I ms apart (a slow poller: it misses whatever the server caches
 * for less than I ms; keep I below the server's idle timeout). Every
 * answer must be 200 (after following redirects: a follower coordinator
 * sends runtime reads to the leader), or the tool fails. Per URL, one line
 * on stdout:
 *   apibench: url=U n=N p50_ms=.. p90_ms=.. p99_ms=.. max_ms=..
 *             ttfb_p50_ms=.. ttfb_p99_ms=.. bytes=B connects=C
 * total: request sent to last byte received (curl's total time);
 * ttfb: to the first byte of the answer, i.e. the server's work before it
 * starts sending (for the list endpoints: encoding under the registry lock);
 * bytes: body size of the last answer; connects: new connections curl made
 * for the URL's timed requests (0 when keep-alive held).
 * Percentiles are nearest-rank.
 *
 * Exit status: 0, 1 on a failed or non-200 request, 2 on usage errors.
 */
#include <curl/curl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tool_common.h"

#define USAGE                                                                  \
  "usage: lynx-apibench [--count N] [--warmup W] [--interval-ms I] URL...\n"

static size_t on_body(char *p, size_t sz, size_t n, void *arg) {
  (void)p;
  *(size_t *)arg += sz * n;
  return sz * n;
}

static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double pct(const double *sorted, long n, double p) {
  long k = (long)(p * (double)n + 0.999999);
  if (k < 1)
    k = 1;
  if (k > n)
    k = n;
  return sorted[k - 1];
}

static int one(CURL *h, const char *url, size_t *bytes, double *total_ms,
               double *ttfb_ms, long *connects) {
  curl_off_t tt = 0, st = 0;
  long code = 0, nc = 0;
  CURLcode rc;
  *bytes = 0;
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, bytes);
  rc = curl_easy_perform(h);
  if (rc != CURLE_OK) {
    fprintf(stderr, "lynx-apibench: GET %s: %s\n", url, curl_easy_strerror(rc));
    return -1;
  }
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
  if (code != 200) {
    fprintf(stderr, "lynx-apibench: GET %s: HTTP %ld\n", url, code);
    return -1;
  }
  curl_easy_getinfo(h, CURLINFO_TOTAL_TIME_T, &tt);
  curl_easy_getinfo(h, CURLINFO_STARTTRANSFER_TIME_T, &st);
  curl_easy_getinfo(h, CURLINFO_NUM_CONNECTS, &nc);
  *total_ms = (double)tt / 1000.0;
  *ttfb_ms = (double)st / 1000.0;
  *connects += nc;
  return 0;
}

struct cfg {
  uint32_t count, warmup, interval_ms;
};

#define O(f) offsetof(struct cfg, f)
static const struct lynx_opt opts[] = {
    {"count", LYNX_OPT_U32, O(count), "200", 1, 10000000, NULL,
     "requests per URL"},
    {"warmup", LYNX_OPT_U32, O(warmup), "10", 0, UINT32_MAX, NULL,
     "requests per URL before measuring"},
    {"interval-ms", LYNX_OPT_U32, O(interval_ms), "0", 0, 60000, NULL,
     "pause between requests"},
    LYNX_OPT_END,
};
#undef O

int main(int argc, char **argv) {
  struct cfg cfg;
  struct lynx_opts_scan scan = {LYNX_OPTS_POSITIONAL, NULL, 0, 0, 0};
  long count, warmup, interval_ms;
  double *tot, *ttfb;
  CURL *h;
  char **urls;
  int rc, status = 0;
  urls = calloc((size_t)argc, sizeof(*urls));
  if (!urls) {
    fprintf(stderr, "lynx-apibench: out of memory\n");
    return 1;
  }
  scan.rest = urls;
  rc = tool_opts(opts, &cfg, argc, argv, USAGE, &scan);
  if (rc < 0 && scan.n_rest == 0)
    rc = tool_usage(USAGE); /* no URL */
  if (rc >= 0) {
    free(urls);
    return rc;
  }
  count = cfg.count;
  warmup = cfg.warmup;
  interval_ms = cfg.interval_ms;
  if (curl_global_init(CURL_GLOBAL_DEFAULT)) {
    fprintf(stderr, "lynx-apibench: cannot initialise libcurl\n");
    return 1;
  }
  h = curl_easy_init();
  tot = calloc((size_t)count, sizeof(*tot));
  ttfb = calloc((size_t)count, sizeof(*ttfb));
  if (!h || !tot || !ttfb) {
    fprintf(stderr, "lynx-apibench: out of memory\n");
    return 1;
  }
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 10000L);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  /* a follower coordinator redirects runtime reads to the leader: an
   * operator's client follows, and so do we (the time includes the hop) */
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);

  for (int u = 0; u < scan.n_rest && status == 0; u++) {
    const char *url = urls[u];
    size_t bytes = 0;
    long connects = 0;
    double a, b;
    for (long i = 0; i < warmup; i++)
      if (one(h, url, &bytes, &a, &b, &connects)) {
        status = 1;
        break;
      }
    connects = 0;
    for (long i = 0; i < count && status == 0; i++) {
      if (interval_ms) {
        struct timespec ts = {interval_ms / 1000,
                              (interval_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
      }
      if (one(h, url, &bytes, &tot[i], &ttfb[i], &connects))
        status = 1;
    }
    if (status)
      break;
    qsort(tot, (size_t)count, sizeof(*tot), cmp_dbl);
    qsort(ttfb, (size_t)count, sizeof(*ttfb), cmp_dbl);
    printf("apibench: url=%s n=%ld p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f "
           "max_ms=%.3f ttfb_p50_ms=%.3f ttfb_p99_ms=%.3f bytes=%zu "
           "connects=%ld\n",
           url, count, pct(tot, count, 0.50), pct(tot, count, 0.90),
           pct(tot, count, 0.99), tot[count - 1], pct(ttfb, count, 0.50),
           pct(ttfb, count, 0.99), bytes, connects);
    fflush(stdout);
  }
  curl_easy_cleanup(h);
  curl_global_cleanup();
  free(tot);
  free(ttfb);
  free(urls);
  return status;
}
