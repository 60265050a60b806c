/*
 * options.h - command-line configuration as a table.
 *
 * Each program describes its options once: {name, type, offset into its
 * config struct, default, bounds, help}. The same table parses argv
 * (--name VALUE or --name=VALUE; a one-letter name is a short option,
 * -x VALUE), prints --help, and reads the effective configuration back as
 * JSON (logged at start-up, served by metrics). The daemons, lynxctl (its
 * global options and each command's) and the test tools all parse their
 * command lines here: lynx_opts_parse for a daemon's options only,
 * lynx_opts_scan where positional arguments, a command's own options or a
 * hand-written usage text come in.
 */
#ifndef LYNX_OPTIONS_H
#define LYNX_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

struct json_object;

enum lynx_opt_type {
  LYNX_OPT_U32,   /* uint32_t, decimal, within [min, max] */
  LYNX_OPT_U64,   /* uint64_t, decimal, within [min, max] */
  LYNX_OPT_STR,   /* char *, strdup'd; NULL default allowed */
  LYNX_OPT_ENUM,  /* int, index into choices (NULL-terminated) */
  LYNX_OPT_FLAG,  /* int, 1 when given, takes no value */
  LYNX_OPT_ADDR,  /* char *, HOST:PORT (lynx_parse_hostport) whose port is in
                     [min, max]; NULL default allowed */
  LYNX_OPT_ADDRS, /* char *, HOST:PORT[,HOST:PORT...] (lynx_parse_hostports,
                     at most LYNX_ADDRS_MAX), each port in [min, max] */
};

struct lynx_opt {
  const char *name;
  enum lynx_opt_type type;
  size_t off;
  const char *def; /* textual default, parsed like the command line; NULL:
                      a string becomes NULL, any other type keeps the value
                      the caller put in cfg */
  uint64_t min, max;
  const char *const *choices;
  const char *help;
};

#define LYNX_OPT_END                                                           \
  { NULL, 0, 0, NULL, 0, 0, NULL, NULL }

/* Options the daemons (and the tools that speak their protocol) share,
 * defined once: off is the field's offset in the caller's cfg. */
#define LYNX_OPT_FRAME_MAX(off)                                                \
  {                                                                            \
    "frame-max", LYNX_OPT_U32, off, "1048576", 64, 1u << 26, NULL,             \
        "largest accepted control frame, bytes"                                \
  }
/* TLS (common/tls.h, docs/tls.md): the cluster CA, and this daemon's own
 * certificate and key; ca_help says what the CA does for this daemon. */
#define LYNX_OPT_TLS(ca_off, cert_off, key_off, ca_help)                         \
  {"tls-ca", LYNX_OPT_STR, ca_off, NULL, 0, 0, NULL, ca_help},                   \
      {"tls-cert", LYNX_OPT_STR,                                                 \
       cert_off,   NULL,                                                         \
       0,          0,                                                            \
       NULL,       "this daemon's certificate (PEM), signed by the cluster CA"}, \
  {                                                                              \
    "tls-key", LYNX_OPT_STR, key_off, NULL, 0, 0, NULL,                          \
        "the private key of --tls-cert (PEM; keep it chmod 600)"                 \
  }
#define LYNX_OPT_LOG_LEVEL(off, dflt)                                          \
  {                                                                            \
    "log-level", LYNX_OPT_STR, off, dflt, 0, 0, NULL,                          \
        "error, warn, info or debug"                                           \
  }

/*
 * Applies defaults, then argv. Returns 0, with *help set when --help (or
 * -h) was printed and the program should exit 0; -EINVAL after printing a
 * message that names the bad option and value. Strings in cfg are heap
 * copies: free them with lynx_opts_free.
 *
 * Exit codes, the same in every program: 0 success (and --help), 2 a usage
 * error (an unknown option, a value that is malformed, out of range, unknown
 * or contradicts another option: what lynx_opts_parse and the program's own
 * checks of its command line refuse), 1 a runtime failure (a file that
 * cannot be read, an address that cannot be bound, a device or peer that
 * is missing). The message always names the option and the value. The
 * agent exits with 75 (EX_TEMPFAIL) when it stops so that its supervisor
 * starts it again: a device it cannot use again in this process (a GPU
 * whose CUDA context a kernel's fault poisoned).
 */
#define LYNX_EXIT_RUNTIME 1
#define LYNX_EXIT_USAGE 2
#define LYNX_EXIT_RESTART 75
int lynx_opts_parse(const struct lynx_opt *tab, void *cfg, int argc,
                    char **argv, const char *usage, int *help);
void lynx_opts_free(const struct lynx_opt *tab, void *cfg);

/* What lynx_opts_scan does beyond lynx_opts_parse. */
enum {
  /* non-option arguments are kept in rest[] in order (not an error), and
   * "--" ends the options: every later argument is kept */
  LYNX_OPTS_POSITIONAL = 1u << 0,
  /* options not in the table are kept in rest[] too (lynxctl: the global
   * options are taken wherever they stand, the command's left to it) */
  LYNX_OPTS_PASS_UNKNOWN = 1u << 1,
  /* --help prints the usage text as given, without the option table */
  LYNX_OPTS_USAGE_ONLY = 1u << 2,
  /* --config FILE: the options of FILE, after the defaults and before
   * the command line, which overrides them (lynx_opts_parse_conf) */
  LYNX_OPTS_CONFIG = 1u << 3,
};

struct lynx_opts_scan {
  unsigned flags; /* LYNX_OPTS_* */
  char **rest;    /* with POSITIONAL or PASS_UNKNOWN: room for argc - 1 */
  int n_rest;     /* out: arguments kept in rest */
  uint64_t given; /* out: bit i set when tab[i] was on the command line
                     (tables of at most 64 options) */
  int help;       /* out: --help was printed (exit 0) */
};

/* lynx_opts_parse with the choices of *s; the same returns and messages
 * (s->help for lynx_opts_parse's *help).
 * argv[0] is the program (or command) name and is not parsed. */
int lynx_opts_scan(const struct lynx_opt *tab, void *cfg, int argc, char **argv,
                   const char *usage, struct lynx_opts_scan *s);

/*
 * lynx_opts_parse with --config FILE (the daemons): FILE holds one option a
 * line, "key = value", the key an option's long name (as --help lists it,
 * without the dashes), the value as on the command line (taken as it is
 * after the '=', blanks around it trimmed; a flag takes true, false, yes,
 * no, on, off, 1 or 0). Blank lines and lines starting with '#' are
 * skipped. An unknown key, a key given twice, a line without '=' or a bad
 * value is an error naming the file and the line (-EINVAL: exit 2). The
 * command line overrides the file. A file that cannot be read: -errno
 * (exit 1, LYNX_EXIT_RUNTIME), with a message. docs/configuration.md.
 */
int lynx_opts_parse_conf(const struct lynx_opt *tab, void *cfg, int argc,
                         char **argv, const char *usage, int *help);
/* The exit status for a non-zero return of lynx_opts_parse_conf. */
int lynx_opts_exit_code(int rc);

/* The effective configuration as a new JSON object (caller puts it). */
struct json_object *lynx_opts_json(const struct lynx_opt *tab, const void *cfg);

#endif
