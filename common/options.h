/*
 * options.h - command-line configuration as a table.
 *
 * Each daemon describes its options once: {name, type, offset into its
 * config struct, default, bounds, help}. The same table parses argv
 * (--name VALUE or --name=VALUE), prints --help, and reads the effective
 * configuration back as JSON (logged at start-up, served by metrics).
 */
#ifndef LYNX_OPTIONS_H
#define LYNX_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

struct json_object;

enum lynx_opt_type {
  LYNX_OPT_U32,  /* uint32_t, decimal, within [min, max] */
  LYNX_OPT_STR,  /* char *, strdup'd; NULL default allowed */
  LYNX_OPT_ENUM, /* int, index into choices (NULL-terminated) */
  LYNX_OPT_FLAG, /* int, 1 when given, takes no value */
};

struct lynx_opt {
  const char *name;
  enum lynx_opt_type type;
  size_t off;
  const char *def; /* textual default, parsed like the command line */
  uint64_t min, max;
  const char *const *choices;
  const char *help;
};

#define LYNX_OPT_END {NULL, 0, 0, NULL, 0, 0, NULL, NULL}

/*
 * Applies defaults, then argv. Returns 0; 1 when --help was printed (exit 0);
 * -EINVAL after printing a message that names the bad option.
 * Strings in cfg are heap copies: free them with lynx_opts_free.
 */
int lynx_opts_parse(const struct lynx_opt *tab, void *cfg, int argc,
                    char **argv, const char *usage);
void lynx_opts_free(const struct lynx_opt *tab, void *cfg);

/* The effective configuration as a new JSON object (caller puts it). */
struct json_object *lynx_opts_json(const struct lynx_opt *tab, const void *cfg);

#endif
