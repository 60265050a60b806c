/*
 * fuzz_http_body.c - the body of an API request (coordinator/http_reply.c):
 * parsed as the API parses it (lynx_http_body_parse: json-c, strict, then
 * jansson for a key given twice), decoded as POST /v1/services decodes it
 * (regjson.c lynx_json_service_spec), and created in a registry of its
 * own (lynx_reg_service_create), whose answer is encoded as the API
 * answers (lynx_json_service).
 *
 * Input: the body. Checked besides memory errors: a refusal carries a
 * status and a reason; a spec that was taken encodes as the state file
 * keeps it and decodes from that to the same spec (spec_check.h); the
 * answer parses as JSON.
 */
#include <errno.h>

#include "coord.h"
#include "fuzz.h"
#include "regjson.h"
#include "spec_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct lynx_service_spec spec;
  struct lynx_reg_err err;
  struct lynx_registry reg;
  struct json_object *body, *ans;
  unsigned status = 0;
  char msg[512] = "";
  fz_quiet();
  body =
      lynx_http_body_parse((const char *)data, size, &status, msg, sizeof(msg));
  if (!body) {
    FZ_CHECK((status == 400 || status == 413 || status == 500) && msg[0]);
    return 0;
  }
  memset(&spec, 0, sizeof(spec));
  memset(&err, 0, sizeof(err));
  if (lynx_json_service_spec(body, &spec, &err)) {
    FZ_CHECK(err.status == 400 && err.code[0] && err.message[0]);
    json_object_put(body);
    return 0;
  }
  json_object_put(body);
  fz_spec_roundtrip(&spec);
  lynx_reg_init(&reg, 3000, 10000, NULL);
  if (lynx_reg_service_create(&reg, &spec, 1000, &err) == 0) {
    struct lynx_reg_service *s = lynx_reg_service_find(&reg, spec.name);
    FZ_CHECK(s);
    ans = lynx_json_service(&reg, s, NULL);
    if (ans) {
      const char *text =
          json_object_to_json_string_ext(ans, JSON_C_TO_STRING_PLAIN);
      struct json_object *back = text ? json_tokener_parse(text) : NULL;
      FZ_CHECK(!text || back);
      json_object_put(back);
      json_object_put(ans);
    }
  } else {
    FZ_CHECK(err.status && err.message[0]);
  }
  lynx_reg_free(&reg);
  return 0;
}
