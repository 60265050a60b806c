/* fuzz.c - fz_fail, shared by every harness; see fuzz.h. */
#include "fuzz.h"

#include <stdio.h>

void fz_fail(const char *file, int line, const char *what) {
  fprintf(stderr, "%s:%d: property violated: %s\n", file, line, what);
  abort();
}
