/* util.h - small helpers shared by the daemons: clocks, address parsing,
 * counters read by other threads. */
#ifndef LYNX_UTIL_H
#define LYNX_UTIL_H

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#ifndef container_of
#define container_of(ptr, type, member)                                        \
  ((type *)((char *)(ptr)-offsetof(type, member)))
#endif

#define LYNX_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* A growing buffer's realloc: buf (NULL at first) of *cap bytes made at
 * least need bytes, its size doubled from first (or *cap) and, with max
 * nonzero, at most max (the caller keeps need <= max). The new buffer,
 * *cap updated; NULL when out of memory (buf and *cap unchanged). Inline:
 * libraries that link nothing of lynx_common use it too (proto/). */
static inline void *lynx_grow(void *buf, size_t *cap, size_t need, size_t first,
                              size_t max) {
  size_t c = *cap ? *cap : first;
  void *p;
  while (c < need)
    c = c > SIZE_MAX / 2 ? need : c * 2;
  if (max && c > max)
    c = max;
  p = realloc(buf, c);
  if (p)
    *cap = c;
  return p;
}

static inline uint64_t lynx_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A counter written by one thread and read by others (metrics): a relaxed
 * load+store, no locked instruction on the data path. */
typedef uint64_t lynx_counter;
static inline void lynx_cnt_add(lynx_counter *c, uint64_t v) {
  __atomic_store_n(c, __atomic_load_n(c, __ATOMIC_RELAXED) + v,
                   __ATOMIC_RELAXED);
}
static inline uint64_t lynx_cnt_get(const lynx_counter *c) {
  return __atomic_load_n(c, __ATOMIC_RELAXED);
}

/* Exponential backoff with +-25% jitter (so many peers do not retry in
 * lockstep): doubles *cur from min up to max (0 starts at min) and returns
 * the wait to use now, in *cur's unit. seed: rand_r state of the caller's
 * thread. */
uint64_t lynx_backoff_next(uint64_t *cur, uint64_t min, uint64_t max,
                           unsigned *seed);

/* Parses "host:port", "[v6]:port" or ":port" into *ss (numeric hosts only, no
 * DNS on the data path's set-up). 0 or -EINVAL. */
int lynx_parse_hostport(const char *s, struct sockaddr_storage *ss);
/* A comma-separated list of HOST:PORT, each as lynx_parse_hostport takes
 * it (spaces around them allowed), at most max: out[0..*n), and each as
 * written into strs[i] when strs is not NULL. 0 or -EINVAL (a bad one,
 * none, or more than max). */
#define LYNX_ADDRS_MAX 8
#define LYNX_ADDR_STR_MAX 64
int lynx_parse_hostports(const char *s, struct sockaddr_storage *out,
                         char (*strs)[LYNX_ADDR_STR_MAX], unsigned max,
                         unsigned *n);

/* A peer's address as 16 bytes, IPv4 mapped into IPv6 (so an IPv4 peer
 * and its IPv4-mapped IPv6 form are one key): what per-address caps and
 * back-offs count by. 0, or -EAFNOSUPPORT for a family without an IP
 * address. */
int lynx_addr_key(const struct sockaddr *sa, uint8_t key[16]);
/* The key as text: dotted IPv4 for a mapped address, else IPv6. */
const char *lynx_addr_key_str(const uint8_t key[16], char *buf, size_t len);

/* The port of an AF_INET/AF_INET6 address (host order; 0 otherwise). */
unsigned lynx_sockaddr_port(const struct sockaddr_storage *ss);

/* Formats an address as "host:port" into buf. */
const char *lynx_fmt_addr(const struct sockaddr *sa, char *buf, size_t len);

/* Appends sep (when buf[0..l) is not empty) and the formatted text to buf
 * of len bytes, holding l bytes so far; returns the new length. A full
 * buffer stays truncated and NUL-terminated: later calls add nothing. */
size_t lynx_appendf(char *buf, size_t len, size_t l, const char *sep,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* strtoul with full-string and range checks. 0 or -EINVAL. */
int lynx_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out);

/* Reads a cluster token (--token-file): the first line of the file, at
 * most 511 bytes. *out is malloc'd (caller frees). 0, or -errno with a
 * message naming the file in err: it cannot be opened, is a directory
 * (-EISDIR), holds no token (-EINVAL) or a longer one (-E2BIG). A file that
 * its group or others may read is accepted with a warning on stderr: anyone
 * who can read it can join the cluster. */
int lynx_read_token(const char *path, char **out, char *err, size_t errlen);

/* Writes the sentence fmt makes into err (errlen bytes; nothing when err
 * is NULL) and returns rc: `return lynx_fail(err, errlen, -EINVAL, ...)`. */
int lynx_fail(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Raises RLIMIT_NOFILE's soft limit to need (at most the hard limit; never
 * lowers it) and returns the soft limit in force afterwards. */
unsigned long lynx_raise_nofile(unsigned long need);

#endif
