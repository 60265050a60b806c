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
      fprintf(stderr, "%s%s: '%s' is not a number in [%llu, %llu]\n",
              dashes(o), o->name, val, (unsigned long long)o->min,
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
    if (val && (lynx_parse_hostport(val, &ss) ||
                lynx_sockaddr_port(&ss) < o->min ||
                lynx_sockaddr_port(&ss) > o->max)) {
      fprintf(stderr, "%s%s: '%s' is not HOST:PORT (a numeric IPv4 address, "
              "[IPv6] or localhost, and a port in %llu..%llu)\n", dashes(o),
              o->name, val,
              (unsigned long long)o->min, (unsigned long long)o->max);
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
        fprintf(stderr, "%s%s: '%s' is not HOST:PORT[,HOST:PORT...] (at most "
                "%d, each a numeric IPv4 address, [IPv6] or localhost, and a "
                "port in %llu..%llu)\n", dashes(o), o->name, val,
                LYNX_ADDRS_MAX, (unsigned long long)o->min,
                (unsigned long long)o->max);
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

static void print_help(const struct lynx_opt *tab, const char *usage) {
  printf("%s\n\nOptions:\n", usage);
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

int lynx_opts_scan(const struct lynx_opt *tab, void *cfg, int argc,
                   char **argv, const char *usage, struct lynx_opts_scan *s) {
  s->n_rest = 0;
  s->given = 0;
  s->help = 0;
  for (const struct lynx_opt *o = tab; o->name; o++)
    if (set_opt(o, cfg, o->type == LYNX_OPT_FLAG ? "0" : o->def))
      return -EINVAL;
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i], *val = NULL;
    size_t nl;
    const struct lynx_opt *o;
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      if (s->flags & LYNX_OPTS_USAGE_ONLY)
        fputs(usage, stdout);
      else
        print_help(tab, usage);
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
      v = json_object_new_int64((int64_t)*(const uint64_t *)p);
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
