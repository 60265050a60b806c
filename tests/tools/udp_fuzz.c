/*
 * lynx-udp-fuzz - sends a reproducible stream of random datagrams to a UDP
 * service (a lynx-frontend serving the sockperf-echo app) and checks every
 * reply it gets.
 *
 * Datagram i (fixed seed, so every run sends the same bytes):
 *   - size: about half at most --slot bytes (what fits an mqueue slot), a
 *     few below the 14-byte sockperf header, boundary sizes (13, 14, slot,
 *     slot+1, cap, cap+1, 65507), the rest up to 65507: large messages
 *     (longer than --slot, at most --cap) where the cap is above the slot,
 *     oversize ones (longer than --cap) where it is below 65507;
 *   - content: random, and for most datagrams a sockperf-like header (u64
 *     seq, u16 flags at byte 8, u32 len at byte 10, network order) whose seq
 *     is unique to the datagram; part of those carry the pong-request flag
 *     (0x2), part of them also the client flag (0x1).
 *
 * The sockperf-echo app answers exactly the datagrams of 14..cap bytes whose
 * flags have 0x2 set, with the same bytes except the client flag (0x1)
 * cleared. Every reply is matched to its request by the seq field (unique
 * among the datagrams that expect a reply) and must be byte-identical to it
 * but for that bit; a reply nobody expects, a duplicate or a mismatch is an
 * error.
 *
 * Pacing: datagrams go out in bursts (--burst, default 32, and at most 1 MiB
 * per burst); after a burst the tool waits until the burst's expected replies
 * are in (bounded by --burst-wait-ms), and gives the service --gap-us to read
 * what it sent otherwise. So neither the frontend's rings (256 slots x 8
 * mqueues by default) nor the socket buffers overflow.
 *
 * Output: one line
 *   udp_fuzz: sent=N oversize=O expected_replies=E received_replies=R
 *             empty=Z mismatched=M unexpected=U duplicates=D send_errors=S ...
 * (oversize: longer than --cap; large: longer than --slot, at most --cap;
 * empty: 0-byte datagrams, part of sent)
 * Exit status: 0 when mismatched, unexpected, duplicates and send_errors are
 * all 0 (missing replies are for the caller to judge: it compares
 * received_replies with expected_replies), 1 otherwise, 2 on usage errors.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tool_common.h"

#define UDP_MAX 65507u
#define HDR 14u
#define F_CLIENT 0x1u
#define F_PONG 0x2u
#define BURST_BYTES_MAX (1u << 20)
#define SEQ_TAG 0x4C594E5800000000ull /* "LYNX" in the high half */
#define REPORT_MAX 10                 /* detailed error lines */

struct dgram {
  uint8_t *data; /* kept only for datagrams that expect a reply */
  uint32_t len;
  int expect; /* the app must answer it */
  int got;    /* replies received */
};

/* The command line (opts below). */
struct cfg {
  char *host;
  uint32_t port, count, seed, cap, slot, max_size, burst, burst_wait_ms, gap_us,
      drain_ms;
  int verbose, ordered;
  char *sizes;       /* --sizes: "a,b,..." as given */
  uint32_t size[16]; /* parsed: datagram i has size[i % n_sizes] */
  uint32_t n_sizes;
};

static uint64_t rng_state;
static uint64_t rnd(void) { return tool_splitmix(&rng_state); }
static uint32_t rnd_below(uint32_t n) { return n ? (uint32_t)(rnd() % n) : 0; }
static uint32_t rnd_range(uint32_t lo, uint32_t hi) { /* inclusive */
  return lo + rnd_below(hi - lo + 1);
}

/* ---- seq -> datagram index (open addressing, expected datagrams only) */

static uint64_t *ht_key;
static uint32_t *ht_val; /* index + 1; 0 = empty */
static uint32_t ht_mask;

static uint32_t ht_hash(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  return (uint32_t)k;
}
static int ht_init(uint32_t n) {
  uint32_t sz = 16;
  while (sz < 2 * n)
    sz <<= 1;
  ht_key = calloc(sz, sizeof(*ht_key));
  ht_val = calloc(sz, sizeof(*ht_val));
  ht_mask = sz - 1;
  return ht_key && ht_val ? 0 : -1;
}
static long ht_find(uint64_t k) {
  for (uint32_t h = ht_hash(k) & ht_mask;; h = (h + 1) & ht_mask) {
    if (!ht_val[h])
      return -1;
    if (ht_key[h] == k)
      return (long)ht_val[h] - 1;
  }
}
static void ht_put(uint64_t k, uint32_t idx) {
  uint32_t h = ht_hash(k) & ht_mask;
  while (ht_val[h])
    h = (h + 1) & ht_mask;
  ht_key[h] = k;
  ht_val[h] = idx + 1;
}

/* ---- generation ------------------------------------------------------ */

static uint32_t pick_size(const struct cfg *c, uint32_t i) {
  uint32_t r, cap = c->cap < c->max_size ? c->cap : c->max_size;
  uint32_t slot = c->slot < cap ? c->slot : cap;
  if (c->n_sizes)
    return c->size[i % c->n_sizes];
  r = rnd_below(100);
  if (r < 8) /* shorter than the sockperf header, 0 included */
    return rnd_range(0, HDR - 1 < c->max_size ? HDR - 1 : c->max_size);
  if (r < 13) { /* boundaries */
    const uint32_t b[] = {0,        HDR - 1, HDR, slot - 1, slot,
                          slot + 1, cap - 1, cap, cap + 1,  c->max_size};
    uint32_t s = b[rnd_below(sizeof(b) / sizeof(b[0]))];
    return s > c->max_size ? c->max_size : s;
  }
  if (r < 35) /* small, typical request sizes */
    return rnd_range(HDR < slot ? HDR : slot, slot < 256 ? slot : 256);
  if (r < 55) /* anything that fits a slot */
    return rnd_range(HDR < slot ? HDR : slot, slot);
  if (cap > slot && (r < 78 || cap >= c->max_size)) /* large */
    return rnd_range(slot + 1, cap);
  if (cap >= c->max_size) /* everything fits */
    return rnd_range(0, c->max_size);
  return rnd_range(cap + 1, c->max_size); /* oversize */
}

/* Fills datagram i; returns its bytes in buf and whether it expects a reply. */
static uint32_t make_dgram(const struct cfg *c, uint32_t i, uint8_t *buf,
                           int *expect) {
  uint32_t len = pick_size(c, i), r = c->n_sizes ? 0 : rnd_below(100);
  uint64_t seq = SEQ_TAG | i;
  for (uint32_t k = 0; k < len; k += 8) {
    uint64_t v = rnd();
    memcpy(buf + k, &v, len - k < 8 ? len - k : 8);
  }
  if (r < 85) {
    /* sockperf-like header: unique seq, flags, length */
    uint8_t hdr[HDR];
    uint16_t flags = (uint16_t)(rnd() & 0xfff0u); /* unknown high bits */
    uint32_t rr = c->n_sizes ? 0 : rnd_below(100);
    if (rr < 70)
      flags |= F_PONG;
    if (rr < 50 || rr >= 85)
      flags |= F_CLIENT;
    if (!c->n_sizes && rnd_below(4) == 0)
      flags |= 0x4u; /* sockperf's warm-up bit, sometimes */
    tool_sockperf_hdr(hdr, seq, flags, len);
    /* a datagram shorter than the header carries its first bytes only */
    memcpy(buf, hdr, len < HDR ? len : HDR);
  }
  /* else: random bytes throughout; they may still look like a pong request */
  *expect = len >= HDR && len <= c->cap && (buf[9] & F_PONG);
  if (*expect) {
    /* the reply is matched by bytes 0..7: keep them unique */
    while (ht_find(tool_get_be64(buf)) >= 0)
      buf[0] ^= 0x80, buf[7] += 1;
  }
  return len;
}

/* ---- replies --------------------------------------------------------- */

struct stats {
  uint32_t sent, empty, oversize, large, expected, received, mismatched,
      unexpected, duplicates, send_errors, out_of_order;
  long last; /* --ordered: the datagram of the latest reply */
  uint64_t bytes_sent, bytes_received;
};

static void report(struct stats *st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void report(struct stats *st, const char *fmt, ...) {
  static int n;
  va_list ap;
  (void)st;
  if (n++ >= REPORT_MAX) {
    if (n == REPORT_MAX + 1)
      fprintf(stderr, "udp_fuzz: (further errors not shown)\n");
    return;
  }
  va_start(ap, fmt);
  fputs("udp_fuzz: ERROR: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static int ordered; /* --ordered: replies out of send order are errors */

static void check_reply(struct dgram *d, const uint8_t *buf, ssize_t n,
                        struct stats *st) {
  long idx;
  struct dgram *q;
  st->bytes_received += (uint64_t)(n > 0 ? n : 0);
  if (n < 8) {
    st->unexpected++;
    report(st, "reply of %zd bytes cannot carry a seq", n);
    return;
  }
  idx = ht_find(tool_get_be64(buf));
  if (idx < 0) {
    st->unexpected++;
    report(st,
           "reply of %zd bytes with seq 0x%016llx matches no request that "
           "expects one",
           n, (unsigned long long)tool_get_be64(buf));
    return;
  }
  q = &d[idx];
  if (q->got++) {
    st->duplicates++;
    report(st, "duplicate reply to datagram %ld", idx);
    return;
  }
  st->received++;
  if (st->last >= 0 && idx < st->last) {
    st->out_of_order++;
    if (ordered)
      report(st, "reply to datagram %ld after the reply to datagram %ld", idx,
             st->last);
  }
  st->last = idx;
  if ((uint32_t)n != q->len) {
    st->mismatched++;
    report(st, "reply to datagram %ld has %zd bytes, request had %u", idx, n,
           q->len);
    return;
  }
  for (uint32_t k = 0; k < q->len; k++) {
    uint8_t want = k == 9 ? (uint8_t)(q->data[k] & ~F_CLIENT) : q->data[k];
    if (buf[k] != want) {
      st->mismatched++;
      report(st,
             "reply to datagram %ld (%u bytes) differs at byte %u: 0x%02x, "
             "want 0x%02x",
             idx, q->len, k, buf[k], want);
      return;
    }
  }
  free(q->data); /* verified: the bytes are not needed any more */
  q->data = NULL;
}

/* Reads replies until `want` replies have been received in all or the
 * deadline passes; with linger, keeps reading until the deadline anyway (to
 * catch strays and duplicates). */
static void drain(int fd, struct dgram *d, uint8_t *rbuf, struct stats *st,
                  uint32_t want, uint64_t deadline, int linger) {
  for (;;) {
    struct pollfd p = {fd, POLLIN, 0};
    uint64_t now = tool_now_ms();
    int rc;
    ssize_t n;
    if (now >= deadline || (!linger && st->received >= want))
      return;
    rc = poll(&p, 1, (int)(deadline - now));
    if (rc <= 0)
      continue;
    /* ends at EAGAIN; ECONNREFUSED (an ICMP error) is dropped the same */
    while ((n = recv(fd, rbuf, UDP_MAX + 1, MSG_DONTWAIT)) >= 0)
      check_reply(d, rbuf, n, st);
  }
}

#define USAGE                                                                  \
  "usage: lynx-udp-fuzz [options]\n"                                           \
  "Sends reproducible random datagrams to a sockperf-echo service and "        \
  "checks the replies.\n\n"                                                    \
  "  --host ADDR          IPv4 address [127.0.0.1]\n"                          \
  "  --port N             UDP port (required)\n"                               \
  "  --count N            datagrams to send [10000]\n"                         \
  "  --seed N             random seed [1]\n"                                   \
  "  --cap N              largest payload the service takes [2032]\n"          \
  "  --slot N             largest payload one mqueue slot holds [2032]\n"      \
  "  --max-size N         largest datagram [65507]\n"                          \
  "  --burst N            datagrams per burst [32]\n"                          \
  "  --burst-wait-ms N    wait at most this for a burst's replies [200]\n"     \
  "  --gap-us N           pause after each burst [300]\n"                      \
  "  --drain-ms N         wait this long for the last replies [2000]\n"        \
  "  --verbose            progress on stderr\n"                                \
  "  --ordered            a reply out of send order is an error (one flow)\n"  \
  "  --sizes A,B,...      every datagram a pong request of these sizes in "    \
  "turn\n"

#define O(f) offsetof(struct cfg, f)
static const struct lynx_opt opts[] = {
    {"host", LYNX_OPT_STR, O(host), "127.0.0.1", 0, 0, NULL, ""},
    {"port", LYNX_OPT_U32, O(port), NULL, 1, 65535, NULL, ""},
    {"count", LYNX_OPT_U32, O(count), "10000", 0, 10000000, NULL, ""},
    {"seed", LYNX_OPT_U32, O(seed), "1", 0, UINT32_MAX, NULL, ""},
    {"cap", LYNX_OPT_U32, O(cap), "2032", HDR, UDP_MAX, NULL, ""},
    {"slot", LYNX_OPT_U32, O(slot), "2032", HDR, UDP_MAX, NULL, ""},
    {"max-size", LYNX_OPT_U32, O(max_size), "65507", HDR, UDP_MAX, NULL, ""},
    {"burst", LYNX_OPT_U32, O(burst), "32", 1, 4096, NULL, ""},
    {"burst-wait-ms", LYNX_OPT_U32, O(burst_wait_ms), "200", 0, 60000, NULL,
     ""},
    {"gap-us", LYNX_OPT_U32, O(gap_us), "300", 0, 10000000, NULL, ""},
    {"drain-ms", LYNX_OPT_U32, O(drain_ms), "2000", 0, 600000, NULL, ""},
    {"verbose", LYNX_OPT_FLAG, O(verbose), NULL, 0, 0, NULL, ""},
    {"ordered", LYNX_OPT_FLAG, O(ordered), NULL, 0, 0, NULL, ""},
    {"sizes", LYNX_OPT_STR, O(sizes), NULL, 0, 0, NULL, ""},
    LYNX_OPT_END,
};
#undef O

int main(int argc, char **argv) {
  static struct cfg c; /* its strings live as long as the process */
  struct stats st;
  struct dgram *d;
  uint8_t *sbuf, *rbuf;
  int fd, rc, sz = 4 << 20;
  uint64_t t0;

  if ((rc = tool_opts(opts, &c, argc, argv, USAGE, NULL)) >= 0 ||
      (rc = tool_udp_open("lynx-udp-fuzz", USAGE, c.host, c.port, SOCK_CLOEXEC,
                          "--host %s is not an IPv4 address\n", 1, &fd)) >= 0)
    return rc;
  for (char *p = c.sizes; p && *p;) {
    char *end;
    unsigned long v = strtoul(p, &end, 10);
    if (end == p || v < HDR || v > UDP_MAX || c.n_sizes == 16 ||
        (*end && *end != ',')) {
      fprintf(stderr,
              "--sizes: up to 16 comma-separated sizes of %u to %u "
              "bytes\n%s",
              HDR, UDP_MAX, USAGE);
      return 2;
    }
    c.size[c.n_sizes++] = (uint32_t)v;
    p = *end ? end + 1 : end;
  }
  ordered = c.ordered;
  /* deep buffers (FORCE works as root, the plain one up to rmem_max) */
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &sz, sizeof(sz)) != 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &sz, sizeof(sz)) != 0)
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));

  d = calloc(c.count ? c.count : 1, sizeof(*d));
  sbuf = malloc(UDP_MAX + 8);
  rbuf = malloc(UDP_MAX + 8);
  if (!d || !sbuf || !rbuf || ht_init(c.count)) {
    fprintf(stderr, "lynx-udp-fuzz: out of memory\n");
    return 1;
  }
  memset(&st, 0, sizeof(st));
  st.last = -1;
  rng_state = c.seed;
  t0 = tool_now_ms();

  for (uint32_t i = 0; i < c.count;) {
    /* the pacing target: this burst's replies on top of those received so
     * far (a reply that never comes delays one burst, not all that follow) */
    uint32_t in_burst = 0, burst_bytes = 0, want = st.received;
    while (i < c.count && in_burst < c.burst && burst_bytes < BURST_BYTES_MAX) {
      int expect;
      uint32_t len = make_dgram(&c, i, sbuf, &expect);
      ssize_t n;
      d[i].len = len;
      d[i].expect = expect;
      if (expect) {
        d[i].data = malloc(len);
        if (!d[i].data) {
          fprintf(stderr, "lynx-udp-fuzz: out of memory\n");
          return 1;
        }
        memcpy(d[i].data, sbuf, len);
        ht_put(tool_get_be64(sbuf), i);
      }
      do
        n = send(fd, sbuf, len, 0);
      while (n < 0 && (errno == EINTR || errno == ECONNREFUSED));
      if (n != (ssize_t)len) {
        st.send_errors++;
        report(&st, "send of datagram %u (%u bytes) failed: %s", i, len,
               n < 0 ? strerror(errno) : "short send");
      } else {
        st.sent++;
        st.bytes_sent += len;
        if (len == 0)
          st.empty++;
        if (len > c.cap)
          st.oversize++;
        else if (len > c.slot)
          st.large++;
        if (expect) {
          st.expected++;
          want++;
        }
      }
      i++;
      in_burst++;
      burst_bytes += len;
    }
    /* the burst's replies (and any late ones), then a breather */
    drain(fd, d, rbuf, &st, want, tool_now_ms() + c.burst_wait_ms, 0);
    if (c.gap_us)
      usleep(c.gap_us);
    if (c.verbose && (i % 1024) < c.burst)
      fprintf(stderr, "udp_fuzz: %u/%u sent, %u/%u replies\n", i, c.count,
              st.received, st.expected);
  }
  /* all expected replies, then linger a little for strays and duplicates */
  drain(fd, d, rbuf, &st, st.expected, tool_now_ms() + c.drain_ms, 0);
  drain(fd, d, rbuf, &st, st.expected,
        tool_now_ms() + (c.drain_ms < 300 ? c.drain_ms : 300), 1);

  for (uint32_t i = 0, shown = 0; i < c.count && shown < REPORT_MAX; i++)
    if (d[i].expect && !d[i].got) {
      fprintf(stderr,
              "udp_fuzz: no reply to datagram %u (%u bytes, flags "
              "0x%02x%02x)\n",
              i, d[i].len, d[i].data[8], d[i].data[9]);
      shown++;
    }
  printf(
      "udp_fuzz: sent=%u oversize=%u large=%u out_of_order=%u "
      "expected_replies=%u "
      "received_replies=%u empty=%u mismatched=%u unexpected=%u duplicates=%u "
      "send_errors=%u bytes_sent=%llu bytes_received=%llu seed=%llu "
      "cap=%u elapsed_ms=%llu\n",
      st.sent, st.oversize, st.large, st.out_of_order, st.expected, st.received,
      st.empty, st.mismatched, st.unexpected, st.duplicates, st.send_errors,
      (unsigned long long)st.bytes_sent, (unsigned long long)st.bytes_received,
      (unsigned long long)c.seed, c.cap,
      (unsigned long long)(tool_now_ms() - t0));
  fflush(stdout);
  for (uint32_t i = 0; i < c.count; i++)
    free(d[i].data);
  free(d);
  free(sbuf);
  free(rbuf);
  free(ht_key);
  free(ht_val);
  close(fd);
  return st.mismatched || st.unexpected || st.duplicates || st.send_errors ||
                 (ordered && st.out_of_order)
             ? 1
             : 0;
}
