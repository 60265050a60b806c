/* options.c - table-driven option parsing; see options.h. */
#include "options.h"

#include <errno.h>
#include <json-c/json.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* "-" before a one-letter (short) option's name, "--" before the rest. */
static const char *dashes(const struct lynx_opt *o) {
  return o->name[0] && !o->name[1] ? "-" : "--";
}

static int set_opt(const struct lynx_opt *o, void *cfg, const char *val) {
  char *p = (char *)cfg + o->off;
  uint64_t v;
  if (!val && o->type != LYNX_OPT_STR && o->type != LYNX_OPT_ADDR &&
      o->type != LYNX_OPT_ADDRS)
    return 0; /* no default: the caller's value stays */
  switch (o->type) {
  case LYNX_OPT_U32:
  case LYNX_OPT_U64:
    if (lynx_parse_u64(val, o->min, o->max, &v)) {
      fprintf(stderr, "%s%s: '%s' is not a number in [%llu, %llu]\n", dashes(o),
              o->name, val, (unsigned long long)o->min,
              (unsigned long long)o->max);
      return -EINVAL;
    }
    if (o->type == LYNX_OPT_U32)
      *(uint32_t *)p = (uint32_t)v;
    else
      *(uint64_t *)p = v;
    return 0;
  case LYNX_OPT_ADDR: {
    struct sockaddr_storage ss;
    if (val &&
        (lynx_parse_hostport(val, &ss) || lynx_sockaddr_port(&ss) < o->min ||
         lynx_sockaddr_port(&ss) > o->max)) {
      fprintf(stderr,
              "%s%s: '%s' is not HOST:PORT (a numeric IPv4 address, "
              "[IPv6] or localhost, and a port in %llu..%llu)\n",
              dashes(o), o->name, val, (unsigned long long)o->min,
              (unsigned long long)o->max);
      return -EINVAL;
    }
  }
    __attribute__((fallthrough)); /* stored as a string */
  case LYNX_OPT_ADDRS:
    if (o->type == LYNX_OPT_ADDRS && val) {
      struct sockaddr_storage ss[LYNX_ADDRS_MAX];
      unsigned n = 0, i;
      int bad = lynx_parse_hostports(val, ss, NULL, LYNX_ADDRS_MAX, &n);
      for (i = 0; !bad && i < n; i++)
        bad = lynx_sockaddr_port(&ss[i]) < o->min ||
              lynx_sockaddr_port(&ss[i]) > o->max;
      if (bad) {
        fprintf(stderr,
                "%s%s: '%s' is not HOST:PORT[,HOST:PORT...] (at most "
                "%d, each a numeric IPv4 address, [IPv6] or localhost, and a "
                "port in %llu..%llu)\n",
                dashes(o), o->name, val, LYNX_ADDRS_MAX,
                (unsigned long long)o->min, (unsigned long long)o->max);
        return -EINVAL;
      }
    }
    __attribute__((fallthrough)); /* stored as a string */
  case LYNX_OPT_STR: {
    char *dup = val ? strdup(val) : NULL;
    if (val && !dup)
      return -ENOMEM;
    free(*(char **)p);
    *(char **)p = dup;
    return 0;
  }
  case LYNX_OPT_ENUM:
    for (int i = 0; o->choices[i]; i++)
      if (strcmp(o->choices[i], val) == 0) {
        *(int *)p = i;
        return 0;
      }
    fprintf(stderr, "%s%s: '%s' is not one of:", dashes(o), o->name, val);
    for (int i = 0; o->choices[i]; i++)
      fprintf(stderr, " %s", o->choices[i]);
    fputc('\n', stderr);
    return -EINVAL;
  case LYNX_OPT_FLAG:
    *(int *)p = val && strcmp(val, "0") != 0;
    return 0;
  }
  return -EINVAL;
}

static void print_help(const struct lynx_opt *tab, const char *usage,
                       unsigned flags) {
  printf("%s\n\nOptions:\n", usage);
  if (flags & LYNX_OPTS_CONFIG)
    printf("  %-26s %s\n", "--config FILE",
           "read options from FILE first: one \"key = value\" a line, the "
           "keys the long options below; the command line overrides them");
  for (const struct lynx_opt *o = tab; o->name; o++) {
    char lhs[64];
    snprintf(lhs, sizeof(lhs), "%s%s%s", dashes(o), o->name,
             o->type == LYNX_OPT_FLAG ? "" : " VALUE");
    printf("  %-26s %s", lhs, o->help);
    if (o->type == LYNX_OPT_ENUM) {
      printf(" (");
      for (int i = 0; o->choices[i]; i++)
        printf("%s%s", i ? "|" : "", o->choices[i]);
      printf(")");
    }
    if (o->def && o->type != LYNX_OPT_FLAG)
      printf(" [default %s]", o->def);
    putchar('\n');
  }
  printf("  %-26s %s\n", "--help", "print this help");
}

/* The table entry argv names ("--name", "--name=value" or "-x"); NULL
 * when it names none. *nl is the length of the name after the dashes. */
static const struct lynx_opt *find_opt(const struct lynx_opt *tab,
                                       const char *arg, size_t *nl) {
  int shrt = arg[1] != '-';
  arg += shrt ? 1 : 2;
  *nl = strcspn(arg, "=");
  if (shrt && *nl != 1)
    return NULL;
  for (const struct lynx_opt *o = tab; o->name; o++)
    if (strlen(o->name) == *nl && strncmp(o->name, arg, *nl) == 0 &&
        (*nl == 1) == shrt)
      return o;
  return NULL;
}

/* ---- configuration files ---------------------------------------------- */

#define CONF_LINE_MAX 4096

static char *trim(char *s) {
  char *e;
  while (*s == ' ' || *s == '\t')
    s++;
  e = s + strlen(s);
  while (e > s &&
         (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r' || e[-1] == '\n'))
    *--e = '\0';
  return s;
}

static const char *conf_flag(const char *v) {
  static const char *const yes[] = {"true", "yes", "on", "1"};
  static const char *const no[] = {"false", "no", "off", "0"};
  for (size_t i = 0; i < 4; i++) {
    if (strcmp(v, yes[i]) == 0)
      return "1";
    if (strcmp(v, no[i]) == 0)
      return "0";
  }
  return NULL;
}

/* One line of path (number n): applied to cfg, or -EINVAL after a message
 * naming the file and line. at[] holds the line each option was set on. */
static int conf_line(const struct lynx_opt *tab, void *cfg, const char *path,
                     unsigned n, char *line, unsigned *at) {
  char *eq, *key, *val = NULL;
  const struct lynx_opt *o;
  key = trim(line);
  if (!*key || *key == '#')
    return 0;
  eq = strchr(key, '=');
  if (!eq) {
    fprintf(stderr, "%s:%u: '%s' is not \"key = value\"\n", path, n, key);
    return -EINVAL;
  }
  *eq = '\0';
  key = trim(key);
  val = trim(eq + 1);
  for (o = tab; o->name && strcmp(o->name, key) != 0; o++)
    ;
  if (!o->name) {
    fprintf(stderr,
            "%s:%u: unknown key '%s' (the keys are the long options "
            "of --help, without the dashes)\n",
            path, n, key);
    return -EINVAL;
  }
  if (at[o - tab]) {
    fprintf(stderr, "%s:%u: '%s' given twice (first on line %u)\n", path, n,
            key, at[o - tab]);
    return -EINVAL;
  }
  at[o - tab] = n;
  if (o->type == LYNX_OPT_FLAG && !(val = (char *)conf_flag(val))) {
    fprintf(stderr, "%s:%u: '%s' takes true or false, not '%s'\n", path, n, key,
            trim(eq + 1));
    return -EINVAL;
  }
  if (set_opt(o, cfg, val)) {
    fprintf(stderr, "  (%s, line %u)\n", path, n);
    return -EINVAL;
  }
  return 0;
}

/* Applies path's options to cfg: 0, -EINVAL (its content), or -errno (it
 * cannot be read), with a message either way. */
static int conf_read(const struct lynx_opt *tab, void *cfg, const char *path) {
  char line[CONF_LINE_MAX + 2];
  unsigned n = 0, *at;
  size_t k = 0;
  int rc = 0;
  FILE *f = fopen(path, "re");
  if (!f) {
    rc = -errno;
    fprintf(stderr, "--config: cannot read '%s': %s\n", path, strerror(-rc));
    return rc;
  }
  while (tab[k].name)
    k++;
  at = calloc(k ? k : 1, sizeof(*at));
  if (!at) {
    fclose(f);
    return -ENOMEM;
  }
  while (!rc && fgets(line, sizeof(line), f)) {
    n++;
    if (strlen(line) > CONF_LINE_MAX && line[strlen(line) - 1] != '\n') {
      fprintf(stderr, "%s:%u: line longer than %d bytes\n", path, n,
              CONF_LINE_MAX);
      rc = -EINVAL;
      break;
    }
    rc = conf_line(tab, cfg, path, n, line, at);
  }
  if (!rc && ferror(f)) {
    rc = -EIO;
    fprintf(stderr, "--config: error reading '%s'\n", path);
  }
  free(at);
  fclose(f);
  return rc;
}

/* --config's file among argv (LYNX_OPTS_CONFIG), and whether --help is
 * there (which wins over a bad file). -EINVAL when --config lacks one. */
static int conf_find(int argc, char **argv, const char **path, int *help) {
  *path = NULL;
  *help = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--") == 0)
      break;
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
      *help = 1;
    else if (strncmp(argv[i], "--config=", 9) == 0)
      *path = argv[i] + 9;
    else if (strcmp(argv[i], "--config") == 0) {
      if (i + 1 >= argc) {
        fprintf(stderr, "--config needs a value\n");
        return -EINVAL;
      }
      *path = argv[++i];
    }
  }
  return 0;
}

int lynx_opts_scan(const struct lynx_opt *tab, void *cfg, int argc, char **argv,
                   const char *usage, struct lynx_opts_scan *s) {
  const char *conf = NULL;
  int help = 0, rc;
  s->n_rest = 0;
  s->given = 0;
  s->help = 0;
  for (const struct lynx_opt *o = tab; o->name; o++)
    if (set_opt(o, cfg, o->type == LYNX_OPT_FLAG ? "0" : o->def))
      return -EINVAL;
  if (s->flags & LYNX_OPTS_CONFIG) {
    rc = conf_find(argc, argv, &conf, &help);
    if (rc)
      return rc;
    if (conf && !help && (rc = conf_read(tab, cfg, conf)) != 0)
      return rc;
  }
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i], *val = NULL;
    size_t nl;
    const struct lynx_opt *o;
    if ((s->flags & LYNX_OPTS_CONFIG) && strncmp(arg, "--config", 8) == 0 &&
        (arg[8] == '\0' || arg[8] == '=')) {
      i += arg[8] == '\0'; /* its file: read above */
      continue;
    }
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      if (s->flags & LYNX_OPTS_USAGE_ONLY)
        fputs(usage, stdout);
      else
        print_help(tab, usage, s->flags);
      s->help = 1;
      return 0;
    }
    if ((s->flags & LYNX_OPTS_POSITIONAL) && strcmp(arg, "--") == 0) {
      while (++i < argc)
        s->rest[s->n_rest++] = argv[i];
      break;
    }
    if (arg[0] != '-' || !arg[1]) { /* "-" is an argument (stdin) */
      if (s->flags & LYNX_OPTS_POSITIONAL) {
        s->rest[s->n_rest++] = argv[i];
        continue;
      }
      fprintf(stderr, "unexpected argument '%s' (see --help)\n", arg);
      return -EINVAL;
    }
    o = find_opt(tab, arg, &nl);
    if (!o) {
      if (s->flags & LYNX_OPTS_PASS_UNKNOWN) {
        s->rest[s->n_rest++] = argv[i];
        continue;
      }
      /* -x: the daemons have always called it an argument */
      if (arg[1] != '-')
        fprintf(stderr, "unexpected argument '%s' (see --help)\n", arg);
      else
        fprintf(stderr, "unknown option '--%.*s' (see --help)\n", (int)nl,
                arg + 2);
      return -EINVAL;
    }
    arg += dashes(o)[1] ? 2 : 1;
    if (arg[nl] == '=')
      val = arg + nl + 1;
    else if (o->type == LYNX_OPT_FLAG)
      val = "1";
    else if (i + 1 < argc)
      val = argv[++i];
    else {
      fprintf(stderr, "%s%s needs a value\n", dashes(o), o->name);
      return -EINVAL;
    }
    if (set_opt(o, cfg, val))
      return -EINVAL;
    if (o - tab < 64)
      s->given |= 1ull << (o - tab);
  }
  return 0;
}

int lynx_opts_parse(const struct lynx_opt *tab, void *cfg, int argc,
                    char **argv, const char *usage, int *help) {
  struct lynx_opts_scan s = {0, NULL, 0, 0, 0};
  int rc = lynx_opts_scan(tab, cfg, argc, argv, usage, &s);
  *help = s.help;
  return rc;
}

int lynx_opts_parse_conf(const struct lynx_opt *tab, void *cfg, int argc,
                         char **argv, const char *usage, int *help) {
  struct lynx_opts_scan s = {LYNX_OPTS_CONFIG, NULL, 0, 0, 0};
  int rc = lynx_opts_scan(tab, cfg, argc, argv, usage, &s);
  *help = s.help;
  return rc;
}

int lynx_opts_exit_code(int rc) {
  return rc == -EINVAL ? LYNX_EXIT_USAGE : LYNX_EXIT_RUNTIME;
}

void lynx_opts_free(const struct lynx_opt *tab, void *cfg) {
  for (const struct lynx_opt *o = tab; o->name; o++)
    if (o->type == LYNX_OPT_STR || o->type == LYNX_OPT_ADDR ||
        o->type == LYNX_OPT_ADDRS) {
      char **p = (char **)((char *)cfg + o->off);
      free(*p);
      *p = NULL;
    }
}

struct json_object *lynx_opts_json(const struct lynx_opt *tab,
                                   const void *cfg) {
  struct json_object *j = json_object_new_object();
  for (const struct lynx_opt *o = tab; o->name; o++) {
    const char *p = (const char *)cfg + o->off;
    struct json_object *v = NULL;
    switch (o->type) {
    case LYNX_OPT_U32:
      v = json_object_new_int64(*(const uint32_t *)p);
      break;
    case LYNX_OPT_U64:
      v = json_object_new_int64((int64_t) * (const uint64_t *)p);
      break;
    case LYNX_OPT_STR:
    case LYNX_OPT_ADDR:
    case LYNX_OPT_ADDRS:
      v = *(char *const *)p ? json_object_new_string(*(char *const *)p) : NULL;
      break;
    case LYNX_OPT_ENUM:
      v = json_object_new_string(o->choices[*(const int *)p]);
      break;
    case LYNX_OPT_FLAG:
      v = json_object_new_boolean(*(const int *)p);
      break;
    }
    json_object_object_add(j, o->name, v);
  }
  return j;
}
