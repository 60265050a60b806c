/*
 * wire.c - the label syntax of proto/wire.h.
 */
#include <errno.h>
#include <string.h>

#include "wire.h"

int lynx_labels_parse(const char *s, struct lynx_label *out, uint32_t max,
                      uint32_t *n) {
  uint32_t count = 0, i;
  const char *p = s;
  if (!n)
    return -EINVAL;
  *n = 0;
  if (!s || !*s)
    return 0;
  for (;;) {
    const char *end = strchr(p, ',');
    const char *eq;
    size_t len = end ? (size_t)(end - p) : strlen(p);
    size_t klen, vlen;
    eq = memchr(p, '=', len);
    if (!eq)
      return -EINVAL;
    klen = (size_t)(eq - p);
    vlen = len - klen - 1;
    if (klen == 0 || klen >= LYNX_LABEL_MAX || vlen >= LYNX_LABEL_MAX ||
        memchr(eq + 1, '=', vlen))
      return -EINVAL;
    if (count >= max || !out)
      return -EINVAL;
    memcpy(out[count].key, p, klen);
    out[count].key[klen] = '\0';
    memcpy(out[count].value, eq + 1, vlen);
    out[count].value[vlen] = '\0';
    for (i = 0; i < count; i++)
      if (!strcmp(out[i].key, out[count].key))
        return -EINVAL; /* the same key twice */
    count++;
    if (!end)
      break;
    p = end + 1;
  }
  *n = count;
  return 0;
}
