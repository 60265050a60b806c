/*
 * usage.c - lynxctl's usage text, and what every command says and returns
 * on a usage error (exit 2, with the hint to --help); below every other
 * file of the program, which all may refuse their arguments.
 */
#include <stdarg.h>
#include <stdio.h>

#include "lynxctl.h"
#include "options.h"

const char ctl_usage_text[] =
    "usage: lynxctl [--api URL[,URL...]] [--token-file F] [--cacert F]\n"
    "               [--json] COMMAND\n"
    "\n"
    "commands:\n"
    "  nodes | accelerators | mqueues | services | frontends\n"
    "  service create --name N --port P --app A [--slot-size Z] [--slots S]\n"
    "                 [--msg-max B] [--mqueues M] [--work-us U]\n"
    "                 [--proto udp|tcp [--framing len32|fixed:N]]\n"
    "                 [--backend NAME=HOST:PORT[/memcached|/len32]]...\n"
    "                 [--placement all | --replicas N] [--selector k=v,...]\n"
    "                 [--app-config JSON]  (the app's configuration: an\n"
    "                                   object its instances start with)\n"
    "  service create -f FILE.json      (-f - reads standard input)\n"
    "  service show NAME                its fields, back ends and where its\n"
    "                                   instances run\n"
    "  service delete NAME\n"
    "  node drain ID [--wait [--timeout S]]\n"
    "                                   --wait: until its instances are\n"
    "                                   stopped, S seconds at most (60),\n"
    "                                   else exit 1\n"
    "  node undrain ID | node forget ID\n"
    "  frontend drain ID | frontend undrain ID\n"
    "  watch                            a line and the node table per change\n"
    "  top [-d SECONDS] [-n COUNT] [-s rate|outstanding|p99|id] [-b]\n"
    "                                   accelerators by load, every -d s (1);\n"
    "                                   -n frames, then exit; -b text frames\n"
    "                                   (also when stdout is no terminal);\n"
    "                                   keys: q quit, r o p i sort, space\n"
    "                                   refresh\n"
    "\n"
    "options:\n"
    "  --api URL[,URL...]\n"
    "                    coordinator API (default $LYNX_API, else\n"
    "                    " DEFAULT_API "); several (the coordinators of\n"
    "                    one cluster): each in turn until one answers\n"
    "  --token-file F    send the token in F (default $LYNX_TOKEN_FILE)\n"
    "  --cacert F        trust the API's certificate when this CA signed it\n"
    "                    (https:// URLs; default $LYNX_CACERT, else the\n"
    "                    system's CAs)\n"
    "  --json            print the API's JSON instead of tables\n"
    "\n"
    "exit codes: 0 ok, 1 API error or other runtime failure, 2 usage error, "
    "3 coordinator unreachable\n";

int ctl_usage_err(const char *fmt, ...) {
  va_list ap;
  fputs("lynxctl: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputs("\n(lynxctl --help for usage)\n", stderr);
  return EX_USAGE;
}

/* A command's options into opts (tab's). 1 when the command ends here,
 * with *exit_code: after an error (said, with a hint: EX_USAGE) or --help
 * (EX_OK), opts freed; 0 to go on (*exit_code EX_OK). */
int ctl_scan_cmd(const struct lynx_opt *tab, void *opts, int argc, char **argv,
                 struct lynx_opts_scan *scan, int *exit_code) {
  int rc = lynx_opts_scan(tab, opts, argc, argv, ctl_usage_text, scan);
  *exit_code = rc ? EX_USAGE : EX_OK;
  if (!rc && !scan->help)
    return 0;
  lynx_opts_free(tab, opts);
  if (rc)
    fputs("(lynxctl --help for usage)\n", stderr);
  return 1;
}
