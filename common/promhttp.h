/*
 * promhttp.h - a daemon's own metrics endpoint: GET /metrics (Prometheus
 * text written by the owner's callback, then the endpoint's own
 * connection series) and GET /healthz ("ok"), served by libmicrohttpd on
 * one thread in epoll mode. The frontend and the agent use it for
 * --metrics; the coordinator's /metrics is part of its JSON API.
 *
 * Connections (httpconn.h): at most LYNX_PROM_CONN_MAX open, a quarter of
 * them from one address; past either cap the oldest connection that has
 * not completed its request is shed for the new one, so a scraper or an
 * operator's curl is answered however many stuck or trickling connections
 * share its address. A request's headers are due within
 * LYNX_PROM_HEADER_TIMEOUT_MS of the connection's start or of the previous
 * answer.
 */
#ifndef LYNX_PROMHTTP_H
#define LYNX_PROMHTTP_H

#include <stdio.h>

#define LYNX_PROM_CONN_MAX 1024u
#define LYNX_PROM_HEADER_TIMEOUT_MS 10000u

/* Writes the metrics into f; runs on the endpoint's thread, so it reads
 * other threads' state only through atomics or their locks. */
typedef void (*lynx_prom_write_fn)(FILE *f, void *arg);

/* Serves on addr ("host:port"). prefix names the endpoint's own series
 * (e.g. "lynx_frontend_metrics": lynx_frontend_metrics_connections...).
 * *out is the handle for lynx_prom_stop. 0, or -errno with a message
 * naming the address on stderr. */
int lynx_prom_start(const char *addr, const char *prefix,
                    lynx_prom_write_fn write, void *arg, void **out);
void lynx_prom_stop(void *handle);

#endif
