/*
 * reg_text.c - text the registry shows: validation and cleaning of UTF-8
 * (registry.h, "text").
 *
 * Names, labels and selectors an operator or agent gives are matched byte
 * for byte, so they are refused when they are not text (lynx_text_ok);
 * free text an agent sends (addresses, models, errors) is only shown, so
 * it is cleaned instead (lynx_text_clean). Nothing here knows the
 * registry: the bottom layer, beside registry.c.
 */
#include "registry.h"

#include <stdint.h>
#include <string.h>

/* The UTF-8 sequence at s (n bytes available): its length, with its code
 * point in *cp; 0 when it is not a valid one (a stray continuation byte,
 * an overlong form, a surrogate, above U+10FFFF, or cut short). */
static size_t utf8_seq(const unsigned char *s, size_t n, uint32_t *cp) {
  uint32_t c;
  size_t len, i;
  if (!n)
    return 0;
  c = s[0];
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  if (c >= 0xc2 && c <= 0xdf)
    len = 2, c &= 0x1f;
  else if (c >= 0xe0 && c <= 0xef)
    len = 3, c &= 0x0f;
  else if (c >= 0xf0 && c <= 0xf4)
    len = 4, c &= 0x07;
  else
    return 0;
  if (n < len)
    return 0;
  for (i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80)
      return 0;
    c = c << 6 | (s[i] & 0x3fu);
  }
  if ((len == 3 && c < 0x800) || (len == 4 && (c < 0x10000 || c > 0x10ffff)) ||
      (c >= 0xd800 && c <= 0xdfff))
    return 0;
  *cp = c;
  return len;
}

/* C0 controls, DEL and C1 controls: what a terminal may act on. */
static int is_control(uint32_t c) {
  return c < 0x20 || (c >= 0x7f && c <= 0x9f);
}

int lynx_text_ok(const char *s, size_t len) {
  size_t i = 0, k;
  uint32_t c;
  if (!s)
    return len == 0;
  while (i < len) {
    k = utf8_seq((const unsigned char *)s + i, len - i, &c);
    if (!k || is_control(c))
      return 0;
    i += k;
  }
  return 1;
}

char *lynx_text_clean(char *dst, size_t size, const char *src) {
  size_t n, i = 0, o = 0, k;
  uint32_t c;
  if (!size)
    return dst;
  n = src ? strlen(src) : 0;
  /* o never passes i: the output is never longer than what it came from,
   * so cleaning in place only ever moves bytes backwards */
  while (i < n) {
    k = utf8_seq((const unsigned char *)src + i, n - i, &c);
    if (!k || is_control(c)) {
      if (o + 1 >= size)
        break;
      dst[o++] = k ? ' ' : '?';
      i += k ? k : 1;
      continue;
    }
    if (o + k >= size)
      break;
    memmove(dst + o, src + i, k);
    o += k;
    i += k;
  }
  dst[o] = '\0';
  return dst;
}
