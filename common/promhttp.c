/* promhttp.c - a daemon's /metrics endpoint; see promhttp.h. */
#include "promhttp.h"

#include <errno.h>
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "util.h"

struct prom {
  struct MHD_Daemon *d;
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
  (void)upload_size;
  (void)req_cls;
  if (strcmp(method, "GET") != 0) {
    static const char msg[] = "only GET\n";
    resp = MHD_create_response_from_buffer(sizeof(msg) - 1, (void *)msg,
                                           MHD_RESPMEM_PERSISTENT);
    status = MHD_HTTP_METHOD_NOT_ALLOWED;
  } else if (strcmp(url, "/metrics") == 0) {
    FILE *f = open_memstream(&buf, &len);
    if (!f)
      return MHD_NO;
    p->write(f, p->arg);
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

int lynx_prom_start(const char *addr, lynx_prom_write_fn write, void *arg,
                    void **out) {
  struct sockaddr_storage ss;
  struct prom *p;
  *out = NULL;
  if (lynx_parse_hostport(addr, &ss)) {
    fprintf(stderr, "--metrics: '%s' is not host:port\n", addr);
    return -EINVAL;
  }
  p = calloc(1, sizeof(*p));
  if (!p)
    return -ENOMEM;
  p->write = write;
  p->arg = arg;
  p->d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL,
      on_request, p, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
      MHD_OPTION_CONNECTION_LIMIT, 64u, MHD_OPTION_CONNECTION_TIMEOUT, 10u,
      MHD_OPTION_END);
  if (!p->d) {
    int e = errno ? errno : EADDRINUSE;
    fprintf(stderr, "--metrics %s: cannot serve metrics there: %s\n", addr,
            strerror(e));
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
  free(p);
}
