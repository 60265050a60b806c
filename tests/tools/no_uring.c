/*
 * lynx-no-uring - runs a program with io_uring unavailable to it, as a
 * host that disables io_uring (sysctl kernel.io_uring_disabled=2, a
 * container runtime's seccomp profile) leaves it.
 *
 *   lynx-no-uring PROGRAM [ARG...]
 *
 * Installs a seccomp filter under which io_uring_setup(2) fails with
 * EPERM, then executes PROGRAM; the filter is inherited by its threads and
 * children, and nothing else is restricted. Needs no privilege
 * (PR_SET_NO_NEW_PRIVS). Exit status: PROGRAM's, or 77 when this kernel or
 * architecture cannot take the filter (the reason on stderr), 2 on usage
 * errors.
 */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#else
#define ARCH 0
#endif

int main(int argc, char **argv) {
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {(unsigned short)(sizeof(f) / sizeof(f[0])), f};
  if (argc < 2) {
    fprintf(stderr, "usage: lynx-no-uring PROGRAM [ARG...]\n");
    return 2;
  }
  if (ARCH == 0) {
    fprintf(stderr, "lynx-no-uring: no seccomp filter for this "
                    "architecture\n");
    return 77;
  }
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
      prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
    fprintf(stderr, "lynx-no-uring: cannot install the seccomp filter: %s\n",
            strerror(errno));
    return 77;
  }
  execvp(argv[1], argv + 1);
  fprintf(stderr, "lynx-no-uring: %s: %s\n", argv[1], strerror(errno));
  return 127;
}
