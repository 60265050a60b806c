/*
 * driver.c - main() of a harness built without libFuzzer (gcc, or clang
 * without LYNX_FUZZ): runs every file named on the command line, and every
 * regular file in every directory named, through LLVMFuzzerTestOneInput
 * once, in name order. What ctest's fuzz_<harness>.corpus tests run: each
 * seed and each reproducer of tests/fuzz/corpus/<harness>/ on every build,
 * the ASan one included. A crash is the harness's (ASan, UBSan, FZ_CHECK);
 * this driver fails only when it cannot read an input or found none.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

/* libFuzzer calls it before the first input when a harness defines it */
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  uint8_t *buf = NULL;
  size_t len = 0, cap = 0;
  if (!f) {
    fprintf(stderr, "%s: %s\n", path, strerror(errno));
    return -1;
  }
  for (;;) {
    size_t n;
    if (len == cap) {
      uint8_t *b = realloc(buf, cap ? 2 * cap : 4096);
      if (!b) {
        fprintf(stderr, "%s: out of memory\n", path);
        free(buf);
        fclose(f);
        return -1;
      }
      buf = b;
      cap = cap ? 2 * cap : 4096;
    }
    n = fread(buf + len, 1, cap - len, f);
    len += n;
    if (n == 0)
      break;
  }
  if (ferror(f)) {
    fprintf(stderr, "%s: read error\n", path);
    free(buf);
    fclose(f);
    return -1;
  }
  fclose(f);
  /* a copy of exactly len bytes: ASan sees a read past the input */
  {
    uint8_t *exact = malloc(len ? len : 1);
    if (!exact) {
      free(buf);
      return -1;
    }
    memcpy(exact, buf, len);
    free(buf);
    fprintf(stderr, "running %s (%zu bytes)\n", path, len);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
  }
  return 0;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Runs the regular files of dir in name order; how many, or -1. */
static int run_dir(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char **names = NULL;
  size_t n = 0, cap = 0;
  int ran = 0;
  if (!d) {
    fprintf(stderr, "%s: %s\n", dir, strerror(errno));
    return -1;
  }
  while ((e = readdir(d))) {
    char path[4096];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    if (e->d_name[0] == '.' || stat(path, &st) || !S_ISREG(st.st_mode))
      continue;
    if (n == cap) {
      char **t = realloc(names, (cap ? 2 * cap : 64) * sizeof(*t));
      if (!t)
        break;
      names = t;
      cap = cap ? 2 * cap : 64;
    }
    names[n] = strdup(path);
    if (names[n])
      n++;
  }
  closedir(d);
  if (n)
    qsort(names, n, sizeof(*names), by_name);
  for (size_t i = 0; i < n; i++) {
    if (ran >= 0)
      ran = run_file(names[i]) ? -1 : ran + 1;
    free(names[i]);
  }
  free(names);
  return ran;
}

int main(int argc, char **argv) {
  int total = 0;
  if (LLVMFuzzerInitialize)
    LLVMFuzzerInitialize(&argc, &argv);
  if (argc < 2) {
    fprintf(stderr,
            "usage: %s FILE|DIR...\n"
            "runs each input once through the harness (a build without "
            "libFuzzer; docs/fuzzing.md)\n",
            argv[0]);
    return 2;
  }
  for (int i = 1; i < argc; i++) {
    struct stat st;
    int k;
    if (stat(argv[i], &st)) {
      fprintf(stderr, "%s: %s\n", argv[i], strerror(errno));
      return 1;
    }
    k = S_ISDIR(st.st_mode) ? run_dir(argv[i]) : run_file(argv[i]) ? -1 : 1;
    if (k < 0)
      return 1;
    total += k;
  }
  if (!total) {
    fprintf(stderr, "%s: no inputs found\n", argv[0]);
    return 1;
  }
  fprintf(stderr, "%s: %d inputs ran\n", argv[0], total);
  return 0;
}
