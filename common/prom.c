/* prom.c - Prometheus text-exposition writer; see prom.h. */
#include "prom.h"
#include "lathist.h"

#include <string.h>

void lynx_prom_escape(FILE *f, const char *v) {
  for (; *v; v++) {
    if (*v == '\\' || *v == '"') {
      fputc('\\', f);
      fputc(*v, f);
    } else if (*v == '\n') {
      fputs("\\n", f);
    } else {
      fputc(*v, f);
    }
  }
}

/* HELP text: the format escapes backslash and newline only (a quote is
 * literal there). */
static void escape_help(FILE *f, const char *v) {
  for (; *v; v++) {
    if (*v == '\\')
      fputs("\\\\", f);
    else if (*v == '\n')
      fputs("\\n", f);
    else
      fputc(*v, f);
  }
}

void lynx_prom_family(FILE *f, const char *name, const char *type,
                      const char *help) {
  fprintf(f, "# HELP %s ", name);
  escape_help(f, help);
  fprintf(f, "\n# TYPE %s %s\n", name, type);
}

/* "name" or "name{...}", up to the space before the value. */
static void series(FILE *f, const char *name,
                   const struct lynx_prom_label *labels) {
  fputs(name, f);
  if (!labels || !labels->name)
    return;
  fputc('{', f);
  for (const struct lynx_prom_label *l = labels; l->name; l++) {
    fprintf(f, "%s%s=\"", l == labels ? "" : ",", l->name);
    lynx_prom_escape(f, l->value ? l->value : "");
    fputc('"', f);
  }
  fputc('}', f);
}

void lynx_prom_u64(FILE *f, const char *name,
                   const struct lynx_prom_label *labels, uint64_t v) {
  series(f, name, labels);
  fprintf(f, " %llu\n", (unsigned long long)v);
}

void lynx_prom_double(FILE *f, const char *name,
                      const struct lynx_prom_label *labels, double v,
                      int decimals) {
  series(f, name, labels);
  fprintf(f, " %.*f\n", decimals, v);
}

/* Labels plus le="...", for a histogram's bucket series. */
#define PROM_LABELS_MAX 15

/* ns as seconds in decimal, exactly and without trailing zeros: 128 ns is
 * "0.000000128", 2^32 ns "4.294967296". */
static void ns_seconds(char *out, size_t n, uint64_t ns) {
  size_t l;
  snprintf(out, n, "%llu.%09llu", (unsigned long long)(ns / 1000000000u),
           (unsigned long long)(ns % 1000000000u));
  l = strlen(out);
  while (l > 0 && out[l - 1] == '0')
    out[--l] = 0;
  if (l > 0 && out[l - 1] == '.')
    out[--l] = 0;
}

void lynx_prom_histogram(FILE *f, const char *name,
                         const struct lynx_prom_label *labels,
                         const struct lynx_lat_hist *h) {
  struct lynx_prom_label l[PROM_LABELS_MAX + 2];
  char bname[128], le[32];
  uint32_t n = 0;
  uint64_t cum = 0;
  for (; labels && labels[n].name && n < PROM_LABELS_MAX; n++)
    l[n] = labels[n];
  l[n].name = "le";
  l[n].value = le;
  l[n + 1].name = l[n + 1].value = NULL;
  snprintf(bname, sizeof(bname), "%s_bucket", name);
  /* one series per power of two (every LYNX_LAT_SUB buckets) */
  for (uint32_t i = 0; i < LYNX_LAT_BUCKETS; i++) {
    uint64_t hi = lynx_lat_bucket_hi(i);
    cum += __atomic_load_n(&h->b[i], __ATOMIC_RELAXED);
    if (hi == UINT64_MAX || (i % LYNX_LAT_SUB) != 0)
      continue;
    ns_seconds(le, sizeof(le), hi);
    lynx_prom_u64(f, bname, l, cum);
  }
  snprintf(le, sizeof(le), "+Inf");
  lynx_prom_u64(f, bname, l, cum);
  snprintf(bname, sizeof(bname), "%s_sum", name);
  lynx_prom_double(f, bname, labels,
                   (double)__atomic_load_n(&h->sum_ns, __ATOMIC_RELAXED) / 1e9,
                   9);
  snprintf(bname, sizeof(bname), "%s_count", name);
  lynx_prom_u64(f, bname, labels, cum);
}
