/* prom.c - Prometheus text-exposition writer; see prom.h. */
#include "prom.h"

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
