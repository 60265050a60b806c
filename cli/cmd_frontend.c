/*
 * cmd_frontend.c - lynxctl's commands on frontends: the list, frontend
 * drain and frontend undrain.
 *
 * A frontend's drain is the coordinator's to carry out (it moves the
 * frontend's instances to the others, docs/api.md); lynxctl asks for it
 * and says that it asked.
 */
#include <stddef.h>
#include <string.h>

#include "lynxctl.h"

static const struct col fe_cols[] = {
    {"ID", "id", ctl_f_str},
    {"ADDRESS", "address", ctl_f_str},
    {"CONNECTED", "connected", ctl_f_bool},
    {"ACTIVE", "active", ctl_f_bool},
    {"DRAINING", "draining", ctl_f_bool},
    {"INSTANCES", "instances", ctl_f_str},
    {"RELEASING", "releasing", ctl_f_str},
    {"EPOCH", "epoch", ctl_f_str},
    {"TABLE-VERSION", "table_version", ctl_f_str},
    {"LAST-SEEN", "last_seen_ms", ctl_f_ms_ago},
    {NULL, NULL, NULL},
};

int ctl_cmd_frontends(struct ctl *t, int argc, char **argv) {
  (void)argc;
  (void)argv;
  return ctl_list(t, "/v1/frontends", fe_cols);
}

/* frontend drain ID | frontend undrain ID */
int ctl_cmd_frontend(struct ctl *t, int argc, char **argv) {
  const char *sub = argc > 1 ? argv[1] : NULL;

  if (sub && argc == 3) {
    if (strcmp(sub, "drain") == 0)
      return ctl_object(t, "POST", "/v1/frontends/", argv[2], "/drain",
                        "frontend", "drain requested");
    if (strcmp(sub, "undrain") == 0)
      return ctl_object(t, "POST", "/v1/frontends/", argv[2], "/undrain",
                        "frontend", "undrained");
  }
  return ctl_usage_err("frontend: expected 'drain ID' or 'undrain ID'");
}
