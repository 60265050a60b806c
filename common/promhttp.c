/* promhttp.c - a daemon's /metrics endpoint; see promhttp.h. */
#include "promhttp.h"

#include <errno.h>
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>

#include "httpconn.h"
#include "log.h"
#include "util.h"

struct prom {
  struct MHD_Daemon *d;
  struct lynx_hc *hc;
  const char *prefix;
  lynx_prom_write_fn write;
  void *arg;
};

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn,
                                  const char *url, const char *method,
                                  const char *version, const char *upload,
                                  size_t *upload_size, void **req_cls) {
  struct prom *p = cls;
  struct MHD_Response *resp;
  enum MHD_Result ret;
  unsigned status = MHD_HTTP_OK;
  char *buf = NULL;
  size_t len = 0;
  (void)version;
  (void)upload;
  if (!*req_cls) {
    /* the headers are in: nothing here takes a body, so no deadline
     * applies until the answer is out (a body sent anyway is skipped) */
    static int seen;
    *req_cls = &seen;
    lynx_hc_phase(p->hc, conn, LYNX_HC_BUSY);
    return MHD_YES;
  }
  if (*upload_size) {
    *upload_size = 0;
    return MHD_YES;
  }
  if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
    static const char msg[] = "only GET\n";
    resp = MHD_create_response_from_buffer(sizeof(msg) - 1, (void *)msg,
                                           MHD_RESPMEM_PERSISTENT);
    status = MHD_HTTP_METHOD_NOT_ALLOWED;
  } else if (strcmp(url, "/metrics") == 0) {
    struct lynx_hc_stats st;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
      return MHD_NO;
    p->write(f, p->arg);
    lynx_hc_stats(p->hc, &st);
    lynx_hc_metrics(f, p->prefix, NULL, &st);
    fclose(f);
    resp = MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
    if (resp)
      MHD_add_response_header(resp, "Content-Type",
                              "text/plain; version=0.0.4");
  } else if (strcmp(url, "/healthz") == 0) {
    static const char msg[] = "ok\n";
    resp = MHD_create_response_from_buffer(sizeof(msg) - 1, (void *)msg,
                                           MHD_RESPMEM_PERSISTENT);
  } else {
    static const char msg[] = "not found: try /metrics or /healthz\n";
    resp = MHD_create_response_from_buffer(sizeof(msg) - 1, (void *)msg,
                                           MHD_RESPMEM_PERSISTENT);
    status = MHD_HTTP_NOT_FOUND;
  }
  if (!resp) {
    free(buf);
    return MHD_NO;
  }
  ret = MHD_queue_response(conn, status, resp);
  MHD_destroy_response(resp);
  return ret;
}

/* The request ended: the next one's headers are due. */
static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                         enum MHD_RequestTerminationCode toe) {
  struct prom *p = cls;
  (void)toe;
  *req_cls = NULL;
  lynx_hc_phase(p->hc, conn, LYNX_HC_HEADERS);
}

/* libmicrohttpd's messages, at debug level for what clients cause. */
static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
  char msg[256];
  (void)cls;
  if (lynx_hc_mhd_msg(msg, sizeof(msg), fmt, ap))
    LYNX_DBG("metrics", "libmicrohttpd: %s", msg);
  else
    LYNX_LOG_RL(LYNX_LOG_WARN, "metrics", "libmicrohttpd: %s", msg);
}

int lynx_prom_start(const char *addr, const char *prefix,
                    lynx_prom_write_fn write, void *arg, void **out) {
  struct sockaddr_storage ss;
  struct prom *p;
  struct lynx_hc_cfg hcfg = {
      .conn_max = LYNX_PROM_CONN_MAX,
      .header_timeout_ms = LYNX_PROM_HEADER_TIMEOUT_MS,
      .body_timeout_ms = LYNX_PROM_HEADER_TIMEOUT_MS,
      .comp = "metrics",
  };
  unsigned flags;
  int rc;
  *out = NULL;
  if (lynx_parse_hostport(addr, &ss)) {
    fprintf(stderr, "--metrics: '%s' is not host:port\n", addr);
    return -EINVAL;
  }
  flags = lynx_hc_mhd_flags(ss.ss_family);
  p = calloc(1, sizeof(*p));
  if (!p)
    return -ENOMEM;
  p->prefix = prefix;
  p->write = write;
  p->arg = arg;
  rc = lynx_hc_new(&hcfg, &p->hc);
  if (rc) {
    fprintf(stderr, "--metrics %s: %s\n", addr, strerror(-rc));
    free(p);
    return rc;
  }
  /* descriptors for the cap and its room (the frontend raises the limit
   * to the hard one anyway) */
  lynx_raise_nofile(lynx_hc_mhd_limit(p->hc) + 256u);
  errno = 0;
  p->d = MHD_start_daemon(
      flags, 0, lynx_hc_on_accept, p->hc, on_request, p,
      MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, p, MHD_OPTION_SOCK_ADDR,
      (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT,
      lynx_hc_mhd_limit(p->hc), MHD_OPTION_CONNECTION_TIMEOUT, 60u,
      MHD_OPTION_NOTIFY_CONNECTION, lynx_hc_on_connection, p->hc,
      MHD_OPTION_NOTIFY_COMPLETED, on_completed, p, MHD_OPTION_END);
  if (!p->d) {
    int e = errno ? errno : EADDRINUSE;
    fprintf(stderr, "--metrics %s: cannot serve metrics there: %s\n", addr,
            strerror(e));
    lynx_hc_free(p->hc);
    free(p);
    return -e;
  }
  *out = p;
  return 0;
}

void lynx_prom_stop(void *handle) {
  struct prom *p = handle;
  if (!p)
    return;
  MHD_stop_daemon(p->d);
  lynx_hc_free(p->hc);
  free(p);
}
