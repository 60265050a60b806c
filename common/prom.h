/*
 * prom.h - the one Prometheus text-exposition writer (format 0.0.4).
 *
 * Every /metrics body (the coordinator's JSON API, the frontend's and the
 * agent's --metrics endpoints, the connection guards' series) is written
 * through these calls, so label values are escaped the same way
 * everywhere: backslash, double quote and newline become \\, \" and \n.
 * HELP texts escape backslash and newline. Metric and label names are the
 * caller's constants and are written as given.
 *
 * The writer keeps no state: the caller writes a family's HELP/TYPE lines
 * once (lynx_prom_family) and then its samples, possibly into separate
 * streams that are concatenated later (the frontend groups its per-mqueue
 * families that way).
 */
#ifndef LYNX_PROM_H
#define LYNX_PROM_H

#include <stdint.h>
#include <stdio.h>

/* One label of a sample; label lists end with {NULL, NULL}. */
struct lynx_prom_label {
  const char *name;
  const char *value;
};

/* "# HELP name help\n# TYPE name type\n"; type is "counter", "gauge"... */
void lynx_prom_family(FILE *f, const char *name, const char *type,
                      const char *help);

/* "name{l1="v1",...} value\n" ("name value\n" when labels is NULL or
 * empty); label values escaped. The u64 form prints a decimal integer, the
 * double form "%.*f" with the given number of decimals. */
void lynx_prom_u64(FILE *f, const char *name,
                   const struct lynx_prom_label *labels, uint64_t v);
void lynx_prom_double(FILE *f, const char *name,
                      const struct lynx_prom_label *labels, double v,
                      int decimals);

/* A histogram of durations (lathist.h) in seconds: name_bucket with
 * le at every power of two of nanoseconds from 128 ns (cumulative) and
 * +Inf, name_sum, name_count; labels as above plus le. The family line
 * (type "histogram") is the caller's. */
struct lynx_lat_hist;
void lynx_prom_histogram(FILE *f, const char *name,
                         const struct lynx_prom_label *labels,
                         const struct lynx_lat_hist *h);

/* Writes v with the exposition format's label-value escapes. */
void lynx_prom_escape(FILE *f, const char *v);

#endif
