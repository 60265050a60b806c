/*
 * promhttp.h - a daemon's own metrics endpoint: GET /metrics (Prometheus
 * text written by the owner's callback) and GET /healthz ("ok"), served by
 * libmicrohttpd on its own thread. The frontend and the agent use it for
 * --metrics; the coordinator's /metrics is part of its JSON API.
 */
#ifndef LYNX_PROMHTTP_H
#define LYNX_PROMHTTP_H

#include <stdio.h>

/* Writes the metrics into f; runs on the endpoint's thread, so it reads
 * other threads' state only through atomics or their locks. */
typedef void (*lynx_prom_write_fn)(FILE *f, void *arg);

/* Serves on addr ("host:port"). *out is the handle for lynx_prom_stop.
 * 0, or -errno with a message naming the address on stderr. */
int lynx_prom_start(const char *addr, lynx_prom_write_fn write, void *arg,
                    void **out);
void lynx_prom_stop(void *handle);

#endif
