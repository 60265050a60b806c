/*
 * jsondup.c - a key twice in one JSON object, found with jansson (see
 * jsondup.h for why this is a file of its own).
 */
#include "jsondup.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

int lynx_json_dup_key(const char *buf, size_t len, char *key, size_t key_len,
                      int *line, int *column) {
  /* any value at the top (the caller says what it wants there), NUL
   * escapes allowed and integers of any size taken as reals: only a
   * duplicate should make jansson refuse what json-c accepts */
  const size_t flags = JSON_REJECT_DUPLICATES | JSON_DECODE_ANY |
                       JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL;
  json_error_t e;
  json_t *j;
  const char *near, *k, *end;
  size_t n;

  j = json_loadb(buf, len, flags, &e);
  if (j) {
    json_decref(j);
    return 0;
  }
  if (json_error_code(&e) == json_error_out_of_memory)
    return -ENOMEM;
  if (json_error_code(&e) == json_error_null_byte_in_key) {
    *line = e.line;
    *column = e.column;
    return -EILSEQ;
  }
  if (json_error_code(&e) != json_error_duplicate_key)
    return 0;
  *line = e.line;
  *column = e.column;
  /* e.text is "duplicate object key near '\"KEY\"'": the token as written */
  if (key_len)
    key[0] = '\0';
  near = strstr(e.text, "near '");
  if (!near || !key_len)
    return -EEXIST;
  k = near + 6;
  if (*k == '"')
    k++;
  end = strrchr(k, '\'');
  if (!end)
    end = k + strlen(k);
  if (end > k && end[-1] == '"')
    end--;
  n = (size_t)(end - k);
  if (n >= key_len)
    n = key_len - 1;
  memcpy(key, k, n);
  key[n] = '\0';
  return -EEXIST;
}
