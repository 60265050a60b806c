/* util.c - see util.h. */
#include "util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

int lynx_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out) {
  char *end;
  unsigned long long v;
  if (!s || !*s || *s == '-')
    return -EINVAL;
  errno = 0;
  v = strtoull(s, &end, 10);
  if (errno || *end || v < min || v > max)
    return -EINVAL;
  *out = v;
  return 0;
}

int lynx_parse_hostport(const char *s, struct sockaddr_storage *ss) {
  char host[INET6_ADDRSTRLEN + 1];
  const char *colon, *hs = s;
  size_t hl;
  uint64_t port;
  memset(ss, 0, sizeof(*ss));
  if (!s)
    return -EINVAL;
  if (*s == '[') {
    const char *rb = strchr(s, ']');
    if (!rb || rb[1] != ':')
      return -EINVAL;
    hs = s + 1;
    hl = (size_t)(rb - hs);
    colon = rb + 1;
  } else {
    colon = strrchr(s, ':');
    if (!colon)
      return -EINVAL;
    hl = (size_t)(colon - s);
  }
  if (hl >= sizeof(host) || lynx_parse_u64(colon + 1, 0, 65535, &port))
    return -EINVAL;
  memcpy(host, hs, hl);
  host[hl] = 0;
  if (hl == 0)
    strcpy(host, "0.0.0.0");
  if (strcmp(host, "localhost") == 0)
    strcpy(host, "127.0.0.1");
  struct sockaddr_in *v4 = (struct sockaddr_in *)ss;
  struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)ss;
  if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons((uint16_t)port);
    return 0;
  }
  if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons((uint16_t)port);
    return 0;
  }
  return -EINVAL;
}

int lynx_parse_hostports(const char *s, struct sockaddr_storage *out,
                         char (*strs)[LYNX_ADDR_STR_MAX], unsigned max,
                         unsigned *n) {
  *n = 0;
  if (!s)
    return -EINVAL;
  for (;;) {
    const char *c = strchr(s, ',');
    size_t len = c ? (size_t)(c - s) : strlen(s);
    char one[LYNX_ADDR_STR_MAX];
    while (len && *s == ' ')
      s++, len--;
    while (len && s[len - 1] == ' ')
      len--;
    if (!len || len >= sizeof(one) || *n == max)
      return -EINVAL;
    memcpy(one, s, len);
    one[len] = '\0';
    if (lynx_parse_hostport(one, &out[*n]))
      return -EINVAL;
    if (strs)
      memcpy(strs[*n], one, len + 1);
    (*n)++;
    if (!c)
      return 0;
    s = c + 1;
  }
}

int lynx_addr_key(const struct sockaddr *sa, uint8_t key[16]) {
  if (sa && sa->sa_family == AF_INET6) {
    memcpy(key, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
    return 0;
  }
  if (sa && sa->sa_family == AF_INET) {
    memset(key, 0, 10);
    key[10] = key[11] = 0xff;
    memcpy(key + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    return 0;
  }
  return -EAFNOSUPPORT;
}

const char *lynx_addr_key_str(const uint8_t key[16], char *buf, size_t len) {
  const struct in6_addr *a = (const struct in6_addr *)key;
  if (!(IN6_IS_ADDR_V4MAPPED(a)
            ? inet_ntop(AF_INET, key + 12, buf, (socklen_t)len)
            : inet_ntop(AF_INET6, key, buf, (socklen_t)len)))
    snprintf(buf, len, "?");
  return buf;
}

unsigned lynx_sockaddr_port(const struct sockaddr_storage *ss) {
  if (ss->ss_family == AF_INET)
    return ntohs(((const struct sockaddr_in *)ss)->sin_port);
  if (ss->ss_family == AF_INET6)
    return ntohs(((const struct sockaddr_in6 *)ss)->sin6_port);
  return 0;
}

const char *lynx_fmt_addr(const struct sockaddr *sa, char *buf, size_t len) {
  char h[INET6_ADDRSTRLEN];
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *v4 = (const struct sockaddr_in *)sa;
    inet_ntop(AF_INET, &v4->sin_addr, h, sizeof(h));
    snprintf(buf, len, "%s:%u", h, ntohs(v4->sin_port));
  } else if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *v6 = (const struct sockaddr_in6 *)sa;
    inet_ntop(AF_INET6, &v6->sin6_addr, h, sizeof(h));
    snprintf(buf, len, "[%s]:%u", h, ntohs(v6->sin6_port));
  } else {
    snprintf(buf, len, "(family %d)", sa->sa_family);
  }
  return buf;
}

int lynx_read_token(const char *path, char **out, char *err, size_t errlen) {
  char buf[514];
  struct stat st;
  size_t n;
  int fd = open(path, O_RDONLY | O_CLOEXEC), rc = 0;
  *out = NULL;
  if (fd < 0) {
    rc = -errno;
    snprintf(err, errlen, "--token-file %s: %s", path, strerror(-rc));
    return rc;
  }
  if (fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
    rc = S_ISDIR(st.st_mode) ? -EISDIR : -errno;
    snprintf(err, errlen, "--token-file %s: %s", path,
             rc == -EISDIR ? "is a directory, not a file holding the token"
                           : strerror(-rc));
    close(fd);
    return rc;
  }
  {
    ssize_t r = read(fd, buf, sizeof(buf) - 1);
    if (r < 0) {
      rc = -errno;
      snprintf(err, errlen, "--token-file %s: %s", path, strerror(-rc));
      close(fd);
      return rc;
    }
    n = (size_t)r;
  }
  close(fd);
  buf[n] = 0;
  buf[strcspn(buf, "\r\n")] = 0;
  if (!buf[0]) {
    snprintf(err, errlen,
             "--token-file %s: the file is empty (the token is "
             "its first line)",
             path);
    return -EINVAL;
  }
  if (strlen(buf) > 511) {
    snprintf(err, errlen,
             "--token-file %s: the token is longer than 511 "
             "bytes",
             path);
    return -E2BIG;
  }
  if (st.st_mode & 0077)
    fprintf(stderr,
            "warning: --token-file %s can be read by %s (mode %04o): "
            "whoever can read it can join the cluster; chmod 600 %s\n",
            path, (st.st_mode & 0007) ? "every user" : "its group",
            (unsigned)(st.st_mode & 07777), path);
  *out = strdup(buf);
  if (!*out) {
    snprintf(err, errlen, "--token-file %s: out of memory", path);
    return -ENOMEM;
  }
  return 0;
}

uint64_t lynx_backoff_next(uint64_t *cur, uint64_t min, uint64_t max,
                           unsigned *seed) {
  uint64_t b = *cur ? *cur * 2 : min;
  if (b > max)
    b = max;
  *cur = b;
  return b - b / 4 + (uint64_t)rand_r(seed) % (b / 2 + 1);
}

size_t lynx_appendf(char *buf, size_t len, size_t l, const char *sep,
                    const char *fmt, ...) {
  va_list ap;
  int w;
  if (!buf || l + 1 >= len)
    return l;
  if (l && sep) {
    w = snprintf(buf + l, len - l, "%s", sep);
    l += w > 0 ? (size_t)w : 0;
    if (l + 1 >= len)
      return len - 1;
  }
  va_start(ap, fmt);
  w = vsnprintf(buf + l, len - l, fmt, ap);
  va_end(ap);
  l += w > 0 ? (size_t)w : 0;
  return l < len ? l : len - 1;
}

int lynx_fail(char *err, size_t errlen, int rc, const char *fmt, ...) {
  va_list ap;
  if (err && errlen) {
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return rc;
}

unsigned long lynx_raise_nofile(unsigned long need) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl))
    return 1024; /* cannot happen; the usual soft limit */
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
    struct rlimit up = rl;
    up.rlim_cur = need;
    if (rl.rlim_max != RLIM_INFINITY && up.rlim_cur > rl.rlim_max)
      up.rlim_cur = rl.rlim_max;
    if (up.rlim_cur > rl.rlim_cur && setrlimit(RLIMIT_NOFILE, &up) == 0)
      rl = up;
  }
  return rl.rlim_cur == RLIM_INFINITY ? (unsigned long)-1
                                      : (unsigned long)rl.rlim_cur;
}
