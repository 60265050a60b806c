/*
 * test_options.c - the one option parser (common/options.c): typed values
 * and their bounds, --opt=value, short options, positional arguments, the
 * pass-through lynxctl uses for its global options, which options were
 * given, and defaults; lists of addresses (LYNX_OPT_ADDRS,
 * lynx_parse_hostports).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "options.h"
#include "util.h"
#include "ut_main.h"

struct cfg {
  char *name, *file, *peers;
  uint32_t n;
  uint64_t big;
  int flag, mode;
};

static const char *const modes[] = {"a", "b", NULL};
#define O(f) offsetof(struct cfg, f)
enum { T_NAME, T_FILE, T_F, T_N, T_BIG, T_FLAG, T_MODE, T_PEERS };
static const struct lynx_opt tab[] = {
    [T_NAME] = {"name", LYNX_OPT_STR, O(name), "dflt", 0, 0, NULL, "a name"},
    [T_FILE] = {"file", LYNX_OPT_STR, O(file), NULL, 0, 0, NULL, "a file"},
    [T_F] = {"f", LYNX_OPT_STR, O(file), NULL, 0, 0, NULL, "same as --file"},
    [T_N] = {"n", LYNX_OPT_U32, O(n), NULL, 1, 10, NULL, "kept when absent"},
    [T_BIG] = {"big", LYNX_OPT_U64, O(big), "5", 0, UINT64_MAX, NULL, "u64"},
    [T_FLAG] = {"flag", LYNX_OPT_FLAG, O(flag), NULL, 0, 0, NULL, "a flag"},
    [T_MODE] = {"mode", LYNX_OPT_ENUM, O(mode), "b", 0, 0, modes, "a mode"},
    [T_PEERS] = {"peers", LYNX_OPT_ADDRS, O(peers), NULL, 1, 65535, NULL,
                 "host:port[,host:port...]"},
    LYNX_OPT_END,
};
#undef O

/* Scans the NULL-terminated argument list (after a program name). */
static int scan(struct cfg *c, struct lynx_opts_scan *s, char **rest, ...) {
  char *argv[32] = {"prog"};
  int argc = 1, rc;
  va_list ap;
  va_start(ap, rest);
  for (char *a; (a = va_arg(ap, char *)) != NULL;)
    argv[argc++] = a;
  va_end(ap);
  s->rest = rest;
  rc = lynx_opts_scan(tab, c, argc, argv, "usage: prog", s);
  return rc;
}

static void test_typed_values(void **state) {
  struct cfg c;
  struct lynx_opts_scan s = {0, NULL, 0, 0, 0};
  (void)state;
  memset(&c, 0, sizeof(c));
  c.n = 7; /* no default: kept */
  assert_int_equal(scan(&c, &s, NULL, NULL), 0);
  assert_string_equal(c.name, "dflt");
  assert_null(c.file);
  assert_int_equal(c.n, 7);
  assert_true(c.big == 5);
  assert_int_equal(c.flag, 0);
  assert_int_equal(c.mode, 1);
  assert_true(s.given == 0);
  assert_int_equal(scan(&c, &s, NULL, "--name=x", "-n", "3", "--big",
                        "18446744073709551615", "--flag", "--mode=a", "-f", "-",
                        NULL),
                   0);
  assert_string_equal(c.name, "x");
  assert_string_equal(c.file, "-");
  assert_int_equal(c.n, 3);
  assert_true(c.big == UINT64_MAX);
  assert_int_equal(c.flag, 1);
  assert_int_equal(c.mode, 0);
  assert_true(s.given == ((1u << T_NAME) | (1u << T_F) | (1u << T_N) |
                          (1u << T_BIG) | (1u << T_FLAG) | (1u << T_MODE)));
  lynx_opts_free(tab, &c);
}

static void test_usage_errors(void **state) {
  struct cfg c;
  struct lynx_opts_scan s = {0, NULL, 0, 0, 0};
  (void)state;
  memset(&c, 0, sizeof(c));
  assert_int_equal(scan(&c, &s, NULL, "-n", "11", NULL), -EINVAL);
  assert_int_equal(scan(&c, &s, NULL, "-n", "x", NULL), -EINVAL);
  assert_int_equal(scan(&c, &s, NULL, "--mode", "c", NULL), -EINVAL);
  assert_int_equal(scan(&c, &s, NULL, "--name", NULL), -EINVAL);
  assert_int_equal(scan(&c, &s, NULL, "--bogus", NULL), -EINVAL);
  assert_int_equal(scan(&c, &s, NULL, "-x", NULL), -EINVAL);
  /* a one-letter name is only a short option, a longer one only long */
  assert_int_equal(scan(&c, &s, NULL, "--f", "x", NULL), -EINVAL);
  assert_int_equal(scan(&c, &s, NULL, "-name", "x", NULL), -EINVAL);
  assert_int_equal(scan(&c, &s, NULL, "positional", NULL), -EINVAL);
  lynx_opts_free(tab, &c);
}

/* Address lists: up to LYNX_ADDRS_MAX HOST:PORT separated by commas
 * (spaces around them allowed), each checked as one address is; the
 * option keeps the text, lynx_parse_hostports gives each address and its
 * text. */
static void test_addr_lists(void **state) {
  struct cfg c;
  struct lynx_opts_scan s = {0, NULL, 0, 0, 0};
  struct sockaddr_storage ss[LYNX_ADDRS_MAX];
  char strs[LYNX_ADDRS_MAX][LYNX_ADDR_STR_MAX];
  unsigned n = 99;
  char nine[160] = "";
  (void)state;
  memset(&c, 0, sizeof(c));
  assert_int_equal(scan(&c, &s, NULL, "--peers",
                        "127.0.0.1:7700, [::1]:7701 ,localhost:7702", NULL),
                   0);
  assert_string_equal(c.peers, "127.0.0.1:7700, [::1]:7701 ,localhost:7702");
  assert_int_equal(lynx_parse_hostports(c.peers, ss, strs, LYNX_ADDRS_MAX, &n),
                   0);
  assert_int_equal(n, 3);
  assert_string_equal(strs[0], "127.0.0.1:7700");
  assert_string_equal(strs[1], "[::1]:7701");
  assert_string_equal(strs[2], "localhost:7702");
  assert_int_equal(lynx_sockaddr_port(&ss[1]), 7701);
  assert_int_equal(ss[1].ss_family, AF_INET6);
  assert_int_equal(lynx_parse_hostports("127.0.0.1:1", ss, NULL, 1, &n), 0);
  assert_int_equal(n, 1);
  for (int i = 0; i < LYNX_ADDRS_MAX + 1; i++)
    snprintf(nine + strlen(nine), sizeof(nine) - strlen(nine), "%s10.0.0.%d:1",
             i ? "," : "", i);
  {
    const char *bad[] = {"",
                         ",",
                         "127.0.0.1:1,",
                         ",127.0.0.1:1",
                         "127.0.0.1:1,,127.0.0.1:2",
                         "127.0.0.1",
                         "127.0.0.1:1,host:2",
                         "127.0.0.1:0",
                         nine};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
      assert_int_equal(scan(&c, &s, NULL, "--peers", bad[i], NULL), -EINVAL);
  }
  assert_int_equal(lynx_parse_hostports(nine, ss, NULL, LYNX_ADDRS_MAX, &n),
                   -EINVAL);
  lynx_opts_free(tab, &c);
}

static void test_positional(void **state) {
  struct cfg c;
  struct lynx_opts_scan s = {LYNX_OPTS_POSITIONAL, NULL, 0, 0, 0};
  char *rest[32];
  (void)state;
  memset(&c, 0, sizeof(c));
  assert_int_equal(
      scan(&c, &s, rest, "a", "--name", "x", "-", "b", "--", "--n", NULL), 0);
  assert_int_equal(s.n_rest, 4);
  assert_string_equal(rest[0], "a");
  assert_string_equal(rest[1], "-");
  assert_string_equal(rest[2], "b");
  assert_string_equal(rest[3], "--n");
  assert_string_equal(c.name, "x");
  /* unknown options are still errors without PASS_UNKNOWN */
  assert_int_equal(scan(&c, &s, rest, "a", "--bogus", NULL), -EINVAL);
  lynx_opts_free(tab, &c);
}

/* lynxctl: the global options come out wherever they stand; the command,
 * its options and their values stay in order. */
static void test_pass_unknown(void **state) {
  struct cfg c;
  struct lynx_opts_scan s = {LYNX_OPTS_POSITIONAL | LYNX_OPTS_PASS_UNKNOWN,
                             NULL, 0, 0, 0};
  char *rest[32];
  (void)state;
  memset(&c, 0, sizeof(c));
  assert_int_equal(scan(&c, &s, rest, "service", "create", "--port", "1",
                        "--flag", "-x", "--name", "n", "--port=2", NULL),
                   0);
  assert_int_equal(s.n_rest, 6);
  assert_string_equal(rest[0], "service");
  assert_string_equal(rest[2], "--port");
  assert_string_equal(rest[3], "1");
  assert_string_equal(rest[4], "-x");
  assert_string_equal(rest[5], "--port=2");
  assert_int_equal(c.flag, 1);
  assert_string_equal(c.name, "n");
  lynx_opts_free(tab, &c);
}

static void test_help(void **state) {
  struct cfg c;
  struct lynx_opts_scan s = {LYNX_OPTS_USAGE_ONLY, NULL, 0, 0, 0};
  (void)state;
  memset(&c, 0, sizeof(c));
  assert_int_equal(scan(&c, &s, NULL, "--help", NULL), 0);
  assert_int_equal(s.help, 1);
  s.flags = 0;
  assert_int_equal(scan(&c, &s, NULL, "-h", NULL), 0);
  assert_int_equal(s.help, 1);
  assert_int_equal(scan(&c, &s, NULL, "--flag", NULL), 0);
  assert_int_equal(s.help, 0);
  lynx_opts_free(tab, &c);
}

/* ---- configuration files (--config) ---------------------------------- */

/* A file of the test's with text; its path in path (the caller unlinks). */
static void conf_file(char *path, size_t n, const char *text) {
  FILE *f;
  snprintf(path, n, "/tmp/lynx-ut-conf-%d-%u.conf", (int)getpid(),
           (unsigned)rand());
  f = fopen(path, "w");
  assert_non_null(f);
  assert_true(fputs(text, f) >= 0);
  assert_int_equal(fclose(f), 0);
}

/* lynx_opts_parse_conf on the NULL-terminated arguments. */
static int conf_parse(struct cfg *c, int *help, ...) {
  char *argv[16] = {"prog"};
  int argc = 1;
  va_list ap;
  va_start(ap, help);
  for (char *a; (a = va_arg(ap, char *)) != NULL;)
    argv[argc++] = a;
  va_end(ap);
  return lynx_opts_parse_conf(tab, c, argc, argv, "usage: prog", help);
}

/* The file's options apply after the defaults; the command line
 * overrides them; comments, blank lines and blanks around keys and values
 * are skipped; a flag takes true/false and the like. */
static void test_config_file(void **state) {
  struct cfg c;
  char path[128], arg[160];
  int help;
  (void)state;
  memset(&c, 0, sizeof(c));
  conf_file(path, sizeof(path),
            "# a comment\n"
            "\n"
            "  name =  from the file  \n"
            "n=4\r\n"
            "flag = yes\n"
            "peers = 127.0.0.1:1, [::1]:2\n"
            "\tmode\t=\ta\n");
  assert_int_equal(conf_parse(&c, &help, "--config", path, NULL), 0);
  assert_int_equal(help, 0);
  assert_string_equal(c.name, "from the file");
  assert_int_equal(c.n, 4);
  assert_int_equal(c.flag, 1);
  assert_int_equal(c.mode, 0);
  assert_string_equal(c.peers, "127.0.0.1:1, [::1]:2");
  assert_true(c.big == 5); /* not in the file: its default */
  snprintf(arg, sizeof(arg), "--config=%s", path);
  assert_int_equal(conf_parse(&c, &help, "--name", "cli", arg, "-n", "9", NULL),
                   0);
  assert_string_equal(c.name, "cli");
  assert_int_equal(c.n, 9);
  assert_int_equal(c.flag, 1);
  lynx_opts_free(tab, &c);
  unlink(path);
}

/* Errors name the file and line: exit 2; a file that cannot be read:
 * exit 1; --help wins over a bad file. */
static void test_config_errors(void **state) {
  static const char *const bad[] = {
      "bogus = 1\n",           /* unknown key */
      "name = a\nname = b\n",  /* twice */
      "just words\n",          /* no '=' */
      "n = 11\n",              /* out of range */
      "flag = maybe\n",        /* not a boolean */
      "mode = c\n",            /* not a choice */
      "config = other.conf\n", /* no nesting */
      "--name = x\n",          /* the key without dashes */
  };
  struct cfg c;
  char path[128];
  int help;
  (void)state;
  memset(&c, 0, sizeof(c));
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    conf_file(path, sizeof(path), bad[i]);
    assert_int_equal(conf_parse(&c, &help, "--config", path, NULL), -EINVAL);
    assert_int_equal(lynx_opts_exit_code(-EINVAL), LYNX_EXIT_USAGE);
    unlink(path);
  }
  assert_int_equal(
      conf_parse(&c, &help, "--config", "/nonexistent/lynx.conf", NULL),
      -ENOENT);
  assert_int_equal(lynx_opts_exit_code(-ENOENT), LYNX_EXIT_RUNTIME);
  assert_int_equal(conf_parse(&c, &help, "--config", NULL), -EINVAL);
  conf_file(path, sizeof(path), "bogus = 1\n");
  assert_int_equal(conf_parse(&c, &help, "--config", path, "--help", NULL), 0);
  assert_int_equal(help, 1);
  unlink(path);
  /* without LYNX_OPTS_CONFIG, --config is an unknown option */
  {
    struct lynx_opts_scan s = {0, NULL, 0, 0, 0};
    assert_int_equal(scan(&c, &s, NULL, "--config", "x", NULL), -EINVAL);
  }
  lynx_opts_free(tab, &c);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_addr_lists),   cmocka_unit_test(test_typed_values),
      cmocka_unit_test(test_usage_errors), cmocka_unit_test(test_positional),
      cmocka_unit_test(test_pass_unknown), cmocka_unit_test(test_help),
      cmocka_unit_test(test_config_file),  cmocka_unit_test(test_config_errors),
  };
  return LYNX_UT_MAIN(argc, argv, "options", tests, NULL, NULL);
}
