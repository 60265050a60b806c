/*
 * ut_shm.h - test helpers for the shm backend's files: every shm file a
 * test makes is named lynx-ut-<pid>-<n> and remembered, so that an atexit
 * handler (ut_shm_unlink_all) and, after a crash, the parent process
 * (ut_shm_sweep, ut_shm_main) remove it. Header-only; used by
 * test_transport_shm.c and conformance_shm.c.
 */
#ifndef LYNX_UT_SHM_H
#define LYNX_UT_SHM_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "transport.h"

#define UT_SHM_MAX_NAMES 64
static char ut_shm_names[UT_SHM_MAX_NAMES][LYNX_LOCATOR_MAX];
static unsigned ut_shm_n_names;

static inline void ut_shm_unlink_all(void) {
  for (unsigned i = 0; i < ut_shm_n_names; i++)
    shm_unlink(ut_shm_names[i]); /* ENOENT for the ones already freed */
}

/* Removes every file of process pid's tests from /dev/shm, whatever
 * state that process died in. */
static inline void ut_shm_sweep(pid_t pid) {
  char prefix[64];
  struct dirent *de;
  DIR *d = opendir("/dev/shm");
  if (!d)
    return;
  snprintf(prefix, sizeof(prefix), "lynx-ut-%d-", (int)pid);
  while ((de = readdir(d)) != NULL)
    if (strncmp(de->d_name, prefix, strlen(prefix)) == 0) {
      char loc[300];
      snprintf(loc, sizeof(loc), "/%s", de->d_name);
      shm_unlink(loc);
    }
  closedir(d);
}

/* A fresh name for region_alloc; remembered (with its leading '/') so the
 * atexit handler can unlink it. */
static inline const char *ut_shm_new_name(char *buf, size_t len) {
  static unsigned seq;
  snprintf(buf, len, "lynx-ut-%d-%u", (int)getpid(), seq++);
  if (ut_shm_n_names < UT_SHM_MAX_NAMES)
    snprintf(ut_shm_names[ut_shm_n_names++], LYNX_LOCATOR_MAX, "/%s", buf);
  return buf;
}

static inline int ut_shm_exists(const char *locator) {
  char path[256];
  struct stat st;
  snprintf(path, sizeof(path), "/dev/shm%s", locator);
  return stat(path, &st) == 0;
}

/* In the test process: 77 (skip) when there is no POSIX shared memory
 * here (no /dev/shm), else run()'s status, with the atexit handler set. */
static inline int ut_shm_run(const char *what, int (*run)(void)) {
  char probe[64];
  int fd;
  atexit(ut_shm_unlink_all);
  ut_shm_new_name(probe, sizeof(probe));
  fd = shm_open(ut_shm_names[ut_shm_n_names - 1], O_RDWR | O_CREAT | O_EXCL,
                0600);
  if (fd < 0) {
    printf("SKIP: %s: shm_open: %s (no usable /dev/shm)\n", what,
           strerror(errno));
    return 77;
  }
  close(fd);
  ut_shm_unlink_all();
  return run();
}

/* The tests run in a child; the parent removes the child's shm files
 * afterwards, so not even a crash leaves one behind (teardowns and the
 * atexit handler clean up in the child on every other path). */
static inline int ut_shm_main(const char *what, int (*run)(void)) {
  pid_t pid;
  int st;
  fflush(NULL);
  pid = fork();
  if (pid < 0)
    return ut_shm_run(what, run);
  if (pid == 0)
    exit(ut_shm_run(what, run));
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) {
      perror("waitpid");
      return 1;
    }
  ut_shm_sweep(pid);
  if (WIFEXITED(st))
    return WEXITSTATUS(st);
  fprintf(stderr, "%s: test process killed by signal %d\n", what, WTERMSIG(st));
  return 128 + WTERMSIG(st);
}

#endif
