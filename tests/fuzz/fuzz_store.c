/*
 * fuzz_store.c - the coordinator's state file (coordinator/store.c): the
 * input is DIR/state.json, loaded by lynx_store_load into a registry of
 * its own as the coordinator loads it at start (read, parse, decode every
 * service with the API's decoder, create them, drain intents, epochs).
 *
 * Checked besides memory errors: a refusal says why; a state that loaded
 * encodes (lynx_store_state_obj, what is saved next) to JSON that loads
 * into another registry as the same state, and every service in it reads
 * back as the same spec (spec_check.h).
 *
 * The file is written to a fresh directory under LYNX_FUZZ_TMP, else
 * /dev/shm (memory: no disk traffic per input) or TMPDIR or /tmp, and
 * removed after.
 */
#include <limits.h>
#include <stdio.h>
#include <unistd.h>

#include "fuzz.h"
#include "spec_check.h"
#include "store.h"

static const char *tmp_base(void) {
  const char *s = getenv("LYNX_FUZZ_TMP");
  if (s && *s)
    return s;
  if (access("/dev/shm", W_OK) == 0)
    return "/dev/shm";
  s = getenv("TMPDIR");
  return s && *s ? s : "/tmp";
}

/* The state r holds, as it would be saved (malloc'd text, or NULL). */
static char *state_text(const struct lynx_registry *r) {
  struct json_object *o = lynx_store_state_obj(r, NULL);
  const char *s =
      o ? json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN) : NULL;
  char *t = s ? strdup(s) : NULL;
  json_object_put(o);
  return t;
}

static void check_reload(const struct lynx_registry *r) {
  struct lynx_registry r2;
  struct json_object *j;
  char err[512] = "", *a = state_text(r), *b;
  if (!a)
    return; /* out of memory */
  j = json_tokener_parse(a);
  FZ_CHECK(j);
  lynx_reg_init(&r2, 3000, 10000, NULL);
  FZ_CHECK(lynx_store_apply(j, "saved state", &r2, 1000, err, sizeof(err)) ==
           0);
  b = state_text(&r2);
  FZ_CHECK(!b || !strcmp(a, b));
  for (const struct lynx_reg_service *s = r->services; s; s = s->next)
    fz_spec_roundtrip(&s->spec);
  free(b);
  free(a);
  json_object_put(j);
  lynx_reg_free(&r2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char dir[PATH_MAX], path[PATH_MAX + 16], err[512] = "";
  struct lynx_registry r;
  FILE *f;
  int rc;
  fz_quiet();
  snprintf(dir, sizeof(dir), "%s/lynx-fuzz-store.XXXXXX", tmp_base());
  if (!mkdtemp(dir))
    return 0;
  snprintf(path, sizeof(path), "%s/state.json", dir);
  f = fopen(path, "wb");
  if (!f)
    goto out;
  if (fwrite(data, 1, size, f) != size) {
    fclose(f);
    goto out;
  }
  if (fclose(f))
    goto out;
  lynx_reg_init(&r, 3000, 10000, NULL);
  rc = lynx_store_load(dir, &r, 1000, err, sizeof(err));
  if (rc == 0)
    check_reload(&r);
  else
    FZ_CHECK(rc < 0 && err[0]);
  lynx_reg_free(&r);
out:
  unlink(path);
  rmdir(dir);
  return 0;
}
