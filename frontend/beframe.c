/* beframe.c - where a back end's reply ends; see beframe.h. */
#include "beframe.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

long fe_be_reply_len(enum fe_be_proto proto, const uint8_t *p, size_t n) {
  if (proto == FE_BE_LEN32) {
    uint32_t be32;
    if (n < 4)
      return 0;
    memcpy(&be32, p, 4);
    be32 = ntohl(be32);
    if (be32 > BE_REPLY_MAX)
      return -1;
    return n - 4 >= be32 ? 4 + (long)be32 : 0;
  }
  /* memcached text protocol */
  for (size_t pos = 0;;) {
    const uint8_t *eol = pos < n ? memchr(p + pos, '\n', n - pos) : NULL;
    size_t line;
    if (!eol)
      return n - pos > BE_LINE_MAX ? -1 : 0; /* no line is that long */
    line = (size_t)(eol - (p + pos)) + 1;
    if (line < 3 || eol[-1] != '\r') /* an empty line is no reply */
      return -1;
    if (line > BE_LINE_MAX) /* as a line that has not ended yet */
      return -1;
    if (line >= 6 && !memcmp(p + pos, "VALUE ", 6)) {
      char hdr[BE_LINE_MAX - 1]; /* the line without CR LF, plus a NUL */
      unsigned flags, bytes;
      memcpy(hdr, p + pos, line - 2);
      hdr[line - 2] = 0;
      if (sscanf(hdr, "VALUE %*s %u %u", &flags, &bytes) != 2 ||
          bytes > BE_REPLY_MAX)
        return -1;
      if (n - pos < line + bytes + 2)
        return 0;
      if (memcmp(p + pos + line + bytes, "\r\n", 2))
        return -1;
      pos += line + bytes + 2;
      if (pos > BE_REPLY_MAX + 1024u)
        return -1;
      continue;
    }
    if (pos == 0) /* a one-line reply: END, STORED, ERROR, ... */
      return (long)line;
    if (line == 5 && !memcmp(p + pos, "END\r\n", 5))
      return (long)(pos + line);
    return -1; /* VALUE blocks must end with END */
  }
}
