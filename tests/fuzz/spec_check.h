/*
 * spec_check.h - the property the API's and the state file's harnesses
 * (fuzz_http_body.c, fuzz_store.c) share: a service spec the coordinator
 * took reads back the same from the JSON it keeps of it in the state
 * directory or etcd (lynx_json_service_spec_obj), or a coordinator
 * restarting would lose or change the service.
 */
#ifndef LYNX_FUZZ_SPEC_CHECK_H
#define LYNX_FUZZ_SPEC_CHECK_H

#include <json-c/json.h>
#include <string.h>

#include "fuzz.h"
#include "regjson.h"

static inline void fz_spec_roundtrip(const struct lynx_service_spec *sp) {
  struct lynx_service_spec back;
  struct lynx_reg_err err;
  struct json_object *o = lynx_json_service_spec_obj(sp), *j;
  const char *text;
  if (!o)
    return; /* out of memory */
  text = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN);
  j = text ? json_tokener_parse(text) : NULL;
  FZ_CHECK(!text || j);
  memset(&back, 0, sizeof(back));
  memset(&err, 0, sizeof(err));
  if (j) {
    FZ_CHECK(lynx_json_service_spec(j, &back, &err) == 0);
    FZ_CHECK(memcmp(&back, sp, sizeof(back)) == 0);
  }
  json_object_put(j);
  json_object_put(o);
}

#endif
