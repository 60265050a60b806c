/* httpconn.c - caps that shed, and deadlines, for a libmicrohttpd server;
 * see httpconn.h. */
#include "httpconn.h"

#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "log.h"
#include "prom.h"
#include "util.h"

#define REAPER_IDLE_MS 1000 /* the reaper's longest sleep */

/* One connection, from STARTED to CLOSED (its socket context). Fields
 * under hc->lock. The list is in the order the connections entered their
 * current phase, oldest first, so that the first sheddable one met is the
 * one to shed. */
struct hc_conn {
  int fd;
  int has_key;     /* an IP peer: counted against per_client */
  uint8_t key[16]; /* lynx_addr_key */
  enum lynx_hc_phase phase;
  uint64_t deadline_ns; /* HEADERS / BODY (CLOCK_MONOTONIC) */
  int gone;             /* shed or reaped: no longer counted */
  int shed;             /* shed (a WAIT one is answered, then closed) */
  struct hc_conn *prev, *next;
};

struct lynx_hc {
  struct lynx_hc_cfg cfg; /* defaults applied */
  pthread_mutex_t lock;
  pthread_cond_t reaper_wake; /* CLOCK_MONOTONIC waits */
  pthread_t reaper;
  int reaper_running, reaper_stop;
  struct hc_conn *head, *tail;
  unsigned live;       /* tracked and not gone */
  uint64_t reap_at_ns; /* when the reaper wakes next */
  uint64_t shed[LYNX_HC_CAPS][LYNX_HC_KINDS], refused[LYNX_HC_CAPS];
  uint64_t timeouts_header, timeouts_body;
};

/* " (" opt suffix ")" for a log line, or nothing when the caps are not
 * options: four %s. */
#define OPT_NAMED(hc, suffix)                                                  \
  (hc)->cfg.opt[0] ? " (" : "", (hc)->cfg.opt, (hc)->cfg.opt[0] ? suffix : "", \
      (hc)->cfg.opt[0] ? ")" : ""

static const char *const cap_names[LYNX_HC_CAPS] = {"per_client", "total"};
static const char *const kind_names[LYNX_HC_KINDS] = {"incomplete", "waiting"};

static void list_unlink(struct lynx_hc *hc, struct hc_conn *a) {
  if (a->prev)
    a->prev->next = a->next;
  else
    hc->head = a->next;
  if (a->next)
    a->next->prev = a->prev;
  else
    hc->tail = a->prev;
  a->prev = a->next = NULL;
}

static void list_append(struct lynx_hc *hc, struct hc_conn *a) {
  a->prev = hc->tail;
  a->next = NULL;
  if (hc->tail)
    hc->tail->next = a;
  else
    hc->head = a;
  hc->tail = a;
}

/* Sets a's deadline timeout_ms from now (lock held) and wakes the reaper
 * when it comes before the reaper's next wake-up. Nanoseconds, so that no
 * rounding lets a deadline pass early. */
static void set_deadline(struct lynx_hc *hc, struct hc_conn *a,
                         uint64_t timeout_ms) {
  a->deadline_ns = lynx_now_ns() + timeout_ms * 1000000u;
  if (a->deadline_ns < hc->reap_at_ns) {
    hc->reap_at_ns = a->deadline_ns;
    pthread_cond_signal(&hc->reaper_wake);
  }
}

static struct hc_conn *conn_of(struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci ? ci->socket_context : NULL;
}

static const char *key_str(const struct hc_conn *a, char *buf, size_t len) {
  if (!a->has_key) {
    snprintf(buf, len, "?");
    return buf;
  }
  return lynx_addr_key_str(a->key, buf, len);
}

/* The connection to shed at a cap (lock held): the oldest incomplete one,
 * else the oldest waiting one, among those of key (NULL: anyone's). */
static struct hc_conn *pick_victim(struct lynx_hc *hc, const uint8_t *key) {
  struct hc_conn *waiting = NULL;
  for (struct hc_conn *a = hc->head; a; a = a->next) {
    if (a->gone || (key && (!a->has_key || memcmp(a->key, key, 16))))
      continue;
    if (a->phase == LYNX_HC_HEADERS || a->phase == LYNX_HC_BODY)
      return a;
    if (a->phase == LYNX_HC_WAIT && !waiting)
      waiting = a;
  }
  return waiting;
}

static void *reaper_main(void *arg) {
  struct lynx_hc *hc = arg;
  char ip[64];
  pthread_mutex_lock(&hc->lock);
  while (!hc->reaper_stop) {
    uint64_t now = lynx_now_ns(), next = now + REAPER_IDLE_MS * 1000000ull;
    struct timespec ts;
    for (struct hc_conn *a = hc->head; a; a = a->next) {
      int header;
      if (a->gone || (a->phase != LYNX_HC_HEADERS && a->phase != LYNX_HC_BODY))
        continue;
      if (a->deadline_ns > now) {
        if (a->deadline_ns < next)
          next = a->deadline_ns;
        continue;
      }
      /* a is tracked, so its CLOSED notification has not run and its fd
       * is still its own (httpconn.h) */
      shutdown(a->fd, SHUT_RDWR);
      a->gone = 1;
      hc->live--;
      header = a->phase == LYNX_HC_HEADERS;
      if (header)
        hc->timeouts_header++;
      else
        hc->timeouts_body++;
      LYNX_LOG_RL(
          LYNX_LOG_WARN, hc->cfg.comp,
          "closed a connection from %s: its request's %s took "
          "longer than %llu ms%s%s%s%s",
          key_str(a, ip, sizeof(ip)), header ? "headers" : "body",
          (unsigned long long)(header ? hc->cfg.header_timeout_ms
                                      : hc->cfg.body_timeout_ms),
          OPT_NAMED(hc, header ? "-header-timeout-ms" : "-body-timeout-ms"));
    }
    hc->reap_at_ns = next;
    ts.tv_sec = (time_t)(next / 1000000000u);
    ts.tv_nsec = (long)(next % 1000000000u);
    pthread_cond_clockwait(&hc->reaper_wake, &hc->lock, CLOCK_MONOTONIC, &ts);
  }
  pthread_mutex_unlock(&hc->lock);
  return NULL;
}

int lynx_hc_new(const struct lynx_hc_cfg *cfg, struct lynx_hc **out) {
  struct lynx_hc *hc = calloc(1, sizeof(*hc));
  int rc;
  *out = NULL;
  if (!hc)
    return -ENOMEM;
  hc->cfg = *cfg;
  if (!hc->cfg.conn_max)
    hc->cfg.conn_max = LYNX_HC_CONN_MAX_DEFAULT;
  if (!hc->cfg.per_client)
    hc->cfg.per_client = hc->cfg.conn_max > 4 ? hc->cfg.conn_max / 4 : 1;
  if (!hc->cfg.header_timeout_ms)
    hc->cfg.header_timeout_ms = LYNX_HC_HEADER_TIMEOUT_MS_DEFAULT;
  if (!hc->cfg.body_timeout_ms)
    hc->cfg.body_timeout_ms = LYNX_HC_BODY_TIMEOUT_MS_DEFAULT;
  if (!hc->cfg.comp)
    hc->cfg.comp = "http";
  if (!hc->cfg.opt)
    hc->cfg.opt = "";
  hc->reap_at_ns = UINT64_MAX;
  pthread_mutex_init(&hc->lock, NULL);
  pthread_cond_init(&hc->reaper_wake, NULL);
  rc = -pthread_create(&hc->reaper, NULL, reaper_main, hc);
  if (rc) {
    pthread_cond_destroy(&hc->reaper_wake);
    pthread_mutex_destroy(&hc->lock);
    free(hc);
    return rc;
  }
  hc->reaper_running = 1;
  *out = hc;
  return 0;
}

void lynx_hc_free(struct lynx_hc *hc) {
  if (!hc)
    return;
  pthread_mutex_lock(&hc->lock);
  hc->reaper_stop = 1;
  pthread_cond_signal(&hc->reaper_wake);
  pthread_mutex_unlock(&hc->lock);
  if (hc->reaper_running)
    pthread_join(hc->reaper, NULL);
  /* CLOSED has run for every connection once the daemon stopped; what is
   * left was never told of one */
  while (hc->head) {
    struct hc_conn *a = hc->head;
    list_unlink(hc, a);
    free(a);
  }
  pthread_cond_destroy(&hc->reaper_wake);
  pthread_mutex_destroy(&hc->lock);
  free(hc);
}

unsigned lynx_hc_limit_for(unsigned conn_max) {
  /* each admission over a cap leaves one shed connection for
   * libmicrohttpd to close; it closes them on its next pass, so a quarter
   * more (at least 16) is room enough: past it new connections wait in
   * the listen backlog for a pass */
  unsigned room = conn_max / 4;
  return conn_max + (room < 16 ? 16 : room);
}

unsigned lynx_hc_mhd_limit(const struct lynx_hc *hc) {
  return lynx_hc_limit_for(hc->cfg.conn_max);
}

unsigned lynx_hc_mhd_flags(int family) {
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
  if (family == AF_INET6)
    flags |= MHD_USE_IPv6;
  if (MHD_is_feature_supported(MHD_FEATURE_EPOLL) == MHD_YES)
    flags |= MHD_USE_EPOLL;
  else if (MHD_is_feature_supported(MHD_FEATURE_POLL) == MHD_YES)
    flags |= MHD_USE_POLL;
  return flags;
}

/* The accept policy (the server's thread, just before STARTED: the counts
 * are exact, as this thread is also the one that adds connections). */
enum MHD_Result lynx_hc_on_accept(void *cls, const struct sockaddr *addr,
                                  socklen_t addrlen) {
  struct lynx_hc *hc = cls;
  uint8_t key[16];
  int has_key;
  unsigned n_client = 0;
  enum lynx_hc_cap cap;
  enum lynx_hc_kind kind;
  struct hc_conn *victim;
  char ip[64], vip[64];

  has_key = addr && addrlen >= (socklen_t)sizeof(struct sockaddr_in) &&
            (addr->sa_family != AF_INET6 ||
             addrlen >= (socklen_t)sizeof(struct sockaddr_in6)) &&
            lynx_addr_key(addr, key) == 0;
  pthread_mutex_lock(&hc->lock);
  if (has_key)
    for (const struct hc_conn *a = hc->head; a; a = a->next)
      if (!a->gone && a->has_key && !memcmp(a->key, key, 16))
        n_client++;
  if (has_key && n_client >= hc->cfg.per_client)
    cap = LYNX_HC_PER_CLIENT;
  else if (hc->live >= hc->cfg.conn_max)
    cap = LYNX_HC_TOTAL;
  else {
    pthread_mutex_unlock(&hc->lock);
    return MHD_YES;
  }
  victim = pick_victim(hc, cap == LYNX_HC_PER_CLIENT ? key : NULL);
  if (!victim) {
    hc->refused[cap]++;
    pthread_mutex_unlock(&hc->lock);
    LYNX_LOG_RL(LYNX_LOG_WARN, hc->cfg.comp,
                "refused a connection from %s: %s, and every one of them "
                "is being answered%s%s%s%s",
                has_key ? lynx_addr_key_str(key, ip, sizeof(ip)) : "?",
                cap == LYNX_HC_PER_CLIENT ? "its address holds the "
                                            "per-client cap"
                                          : "the server holds its cap",
                OPT_NAMED(hc, cap == LYNX_HC_PER_CLIENT ? "-conn-per-client"
                                                        : "-conn-max"));
    return MHD_NO;
  }
  victim->gone = 1;
  victim->shed = 1;
  hc->live--;
  kind = victim->phase == LYNX_HC_WAIT ? LYNX_HC_WAITING : LYNX_HC_INCOMPLETE;
  hc->shed[cap][kind]++;
  if (kind == LYNX_HC_INCOMPLETE)
    shutdown(victim->fd, SHUT_RDWR); /* tracked: the fd is its own */
  key_str(victim, vip, sizeof(vip));
  pthread_mutex_unlock(&hc->lock);
  if (kind == LYNX_HC_WAITING && hc->cfg.wake)
    hc->cfg.wake(hc->cfg.arg);
  LYNX_LOG_RL(LYNX_LOG_WARN, hc->cfg.comp,
              "%s: shed the oldest %s connection, from %s, for a new one "
              "from %s",
              cap == LYNX_HC_PER_CLIENT ? "an address at its per-client cap"
                                        : "at the connection cap",
              kind == LYNX_HC_WAITING ? "waiting" : "incomplete", vip,
              has_key ? lynx_addr_key_str(key, ip, sizeof(ip)) : "?");
  return MHD_YES;
}

void lynx_hc_on_connection(void *cls, struct MHD_Connection *conn,
                           void **socket_context,
                           enum MHD_ConnectionNotificationCode code) {
  struct lynx_hc *hc = cls;
  struct hc_conn *a;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *fd =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *ad =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!fd) /* cannot happen in 0.9.75; nothing to enforce a deadline on */
      return;
    a = calloc(1, sizeof(*a));
    if (!a) {
      /* an untracked connection would escape every cap and deadline: end
       * it (its fd is valid during this notification) */
      LYNX_LOG_RL(LYNX_LOG_WARN, hc->cfg.comp,
                  "out of memory tracking a connection: closed");
      shutdown(fd->connect_fd, SHUT_RDWR);
      return;
    }
    a->fd = fd->connect_fd;
    a->has_key =
        ad && ad->client_addr && lynx_addr_key(ad->client_addr, a->key) == 0;
    a->phase = LYNX_HC_HEADERS;
    pthread_mutex_lock(&hc->lock);
    list_append(hc, a);
    hc->live++;
    set_deadline(hc, a, hc->cfg.header_timeout_ms);
    pthread_mutex_unlock(&hc->lock);
    *socket_context = a;
    return;
  }
  a = *socket_context;
  if (!a)
    return;
  pthread_mutex_lock(&hc->lock);
  list_unlink(hc, a);
  if (!a->gone)
    hc->live--;
  pthread_mutex_unlock(&hc->lock);
  free(a);
  *socket_context = NULL;
}

void lynx_hc_phase(struct lynx_hc *hc, struct MHD_Connection *conn,
                   enum lynx_hc_phase ph) {
  struct hc_conn *a = conn_of(conn);
  if (!a)
    return;
  pthread_mutex_lock(&hc->lock);
  /* a connection shed while it waited is closed once its answer is out,
   * not kept for another request (it no longer counts against a cap) */
  if (a->gone && a->phase != ph &&
      (ph == LYNX_HC_HEADERS || ph == LYNX_HC_BODY))
    shutdown(a->fd, SHUT_RDWR); /* tracked: the fd is its own */
  if (a->phase != ph) {
    a->phase = ph;
    /* to the end of the list: it is now the newest in its phase */
    list_unlink(hc, a);
    list_append(hc, a);
    if (ph == LYNX_HC_HEADERS || ph == LYNX_HC_BODY)
      set_deadline(hc, a,
                   ph == LYNX_HC_HEADERS ? hc->cfg.header_timeout_ms
                                         : hc->cfg.body_timeout_ms);
  }
  pthread_mutex_unlock(&hc->lock);
}

int lynx_hc_was_shed(struct lynx_hc *hc, struct MHD_Connection *conn) {
  struct hc_conn *a = conn_of(conn);
  int shed;
  if (!a)
    return 0;
  pthread_mutex_lock(&hc->lock);
  shed = a->shed;
  pthread_mutex_unlock(&hc->lock);
  return shed;
}

void lynx_hc_stats(struct lynx_hc *hc, struct lynx_hc_stats *s) {
  pthread_mutex_lock(&hc->lock);
  s->open = hc->live;
  s->conn_max = hc->cfg.conn_max;
  s->per_client = hc->cfg.per_client;
  s->header_timeout_ms = hc->cfg.header_timeout_ms;
  s->body_timeout_ms = hc->cfg.body_timeout_ms;
  memcpy(s->shed, hc->shed, sizeof(s->shed));
  memcpy(s->refused, hc->refused, sizeof(s->refused));
  s->timeouts_header = hc->timeouts_header;
  s->timeouts_body = hc->timeouts_body;
  pthread_mutex_unlock(&hc->lock);
}

int lynx_hc_mhd_msg(char *buf, size_t len, const char *fmt, va_list ap) {
  static const char *const routine[] = {
      "closed by remote side with incomplete request",
      "disconnected when reading request",
      "due to the error: detected connection closure",
  };
  size_t n;
  vsnprintf(buf, len, fmt, ap);
  n = strlen(buf);
  while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
    buf[--n] = 0;
  for (size_t i = 0; i < sizeof(routine) / sizeof(routine[0]); i++)
    if (strstr(buf, routine[i]))
      return 1;
  return 0;
}

void lynx_hc_metrics(FILE *f, const char *prefix, const char *opt,
                     const struct lynx_hc_stats *s) {
  char name[128], help[320];
  int named = opt && opt[0];
  snprintf(name, sizeof(name), "%s_connections", prefix);
  lynx_prom_family(f, name, "gauge",
                   "Open connections (this scrape's included), shed and "
                   "timed-out ones not counted.");
  lynx_prom_u64(f, name, NULL, s->open);
  snprintf(name, sizeof(name), "%s_connections_max", prefix);
  snprintf(help, sizeof(help),
           "Connections held open at most%s%s%s; past it the oldest "
           "incomplete one is shed for a new one.",
           named ? " (" : "", named ? opt : "", named ? "-conn-max)" : "");
  lynx_prom_family(f, name, "gauge", help);
  lynx_prom_u64(f, name, NULL, s->conn_max);
  snprintf(name, sizeof(name), "%s_connections_per_client_max", prefix);
  snprintf(help, sizeof(help),
           "Connections one client address holds open at most%s%s%s; past "
           "it the address's oldest incomplete one is shed for a new one.",
           named ? " (" : "", named ? opt : "",
           named ? "-conn-per-client)" : "");
  lynx_prom_family(f, name, "gauge", help);
  lynx_prom_u64(f, name, NULL, s->per_client);
  snprintf(name, sizeof(name), "%s_connections_shed_total", prefix);
  lynx_prom_family(f, name, "counter",
                   "Connections closed to admit a new one at a cap (reason): "
                   "one that had not completed its request (kind="
                   "\"incomplete\"), or a long poll answered early "
                   "(kind=\"waiting\").");
  for (int c = 0; c < LYNX_HC_CAPS; c++)
    for (int k = 0; k < LYNX_HC_KINDS; k++)
      lynx_prom_u64(f, name,
                    (const struct lynx_prom_label[]){{"reason", cap_names[c]},
                                                     {"kind", kind_names[k]},
                                                     {NULL, NULL}},
                    s->shed[c][k]);
  snprintf(name, sizeof(name), "%s_connections_refused_total", prefix);
  lynx_prom_family(f, name, "counter",
                   "Connections closed at once at a cap (reason) because "
                   "every connection there was being answered.");
  for (int c = 0; c < LYNX_HC_CAPS; c++)
    lynx_prom_u64(f, name,
                  (const struct lynx_prom_label[]){{"reason", cap_names[c]},
                                                   {NULL, NULL}},
                  s->refused[c]);
  snprintf(name, sizeof(name), "%s_connections_timed_out_total", prefix);
  if (named)
    snprintf(help, sizeof(help),
             "Connections closed because a request's headers (from the "
             "connection's start or the previous answer) or body took "
             "longer than %s-header-timeout-ms / %s-body-timeout-ms.",
             opt, opt);
  else
    snprintf(help, sizeof(help),
             "Connections closed because a request's headers (from the "
             "connection's start or the previous answer) took longer than "
             "%llu ms, or its body longer than %llu ms.",
             (unsigned long long)s->header_timeout_ms,
             (unsigned long long)s->body_timeout_ms);
  lynx_prom_family(f, name, "counter", help);
  lynx_prom_u64(
      f, name,
      (const struct lynx_prom_label[]){{"phase", "header"}, {NULL, NULL}},
      s->timeouts_header);
  lynx_prom_u64(
      f, name,
      (const struct lynx_prom_label[]){{"phase", "body"}, {NULL, NULL}},
      s->timeouts_body);
}
