/* bell.c - response doorbells (bell.h). */
#include "bell.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"

#define BELL_DIR "/dev/shm"
#define BELL_TRIES 16

static socklen_t bell_addr(struct sockaddr_un *a, uint32_t id) {
  memset(a, 0, sizeof(*a));
  a->sun_family = AF_UNIX;
  snprintf(a->sun_path, sizeof(a->sun_path), BELL_DIR "/lynx-bell-%08x", id);
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) +
                     strlen(a->sun_path) + 1);
}

/* A bell path nobody listens on: what a worker that died left behind. */
static int bell_stale(const struct sockaddr_un *a, socklen_t len) {
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0), stale;
  if (fd < 0)
    return 0;
  stale = connect(fd, (const struct sockaddr *)a, len) != 0 &&
          errno == ECONNREFUSED;
  close(fd);
  return stale;
}

/* Bells of workers that were killed (their files stay): removed whenever
 * a worker opens its bell (workers start seldom; /dev/shm holds few
 * files), so that killed frontends leave litter only until the next one
 * starts. */
static void bell_sweep(void) {
  DIR *d = opendir(BELL_DIR);
  struct dirent *e;
  if (!d)
    return;
  while ((e = readdir(d))) {
    struct sockaddr_un a;
    socklen_t len;
    unsigned id;
    char tail;
    if (sscanf(e->d_name, "lynx-bell-%8x%c", &id, &tail) != 1 || !id)
      continue;
    len = bell_addr(&a, id);
    if (!strcmp(a.sun_path + sizeof(BELL_DIR), e->d_name) &&
        bell_stale(&a, len))
      unlink(a.sun_path);
  }
  closedir(d);
}

int lynx_bell_open(struct lynx_bell *b) {
  int fd, rc = -EADDRINUSE;
  b->fd = -1;
  b->id = 0;
  bell_sweep();
  fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  for (int i = 0; i < BELL_TRIES; i++) {
    struct sockaddr_un a;
    socklen_t len;
    uint32_t id;
    if (getrandom(&id, sizeof(id), 0) != (ssize_t)sizeof(id)) {
      rc = -errno;
      break;
    }
    if (!id)
      continue;
    len = bell_addr(&a, id);
    if (bind(fd, (struct sockaddr *)&a, len) == 0) {
      /* rung by the region's accelerator, whose user maps the region
       * (0600) too */
      chmod(a.sun_path, 0600);
      b->fd = fd;
      b->id = id;
      return 0;
    }
    rc = -errno;
    if (rc != -EADDRINUSE)
      break;
    if (bell_stale(&a, len))
      unlink(a.sun_path); /* litter cleared; the next try takes a new id */
  }
  close(fd);
  return rc;
}

int lynx_bell_drain(struct lynx_bell *b) {
  struct mmsghdr m[16];
  struct iovec iov[16];
  char buf[16];
  int n;
  if (b->fd < 0)
    return 0;
  for (int i = 0; i < 16; i++) {
    iov[i] = (struct iovec){&buf[i], 1};
    memset(&m[i], 0, sizeof(m[i]));
    m[i].msg_hdr.msg_iov = &iov[i];
    m[i].msg_hdr.msg_iovlen = 1;
  }
  n = recvmmsg(b->fd, m, 16, MSG_DONTWAIT, NULL);
  return n < 0 ? 0 : n;
}

void lynx_bell_close(struct lynx_bell *b) {
  if (b->id && b->fd >= 0) {
    struct sockaddr_un a;
    bell_addr(&a, b->id);
    unlink(a.sun_path);
    close(b->fd);
  }
  b->fd = -1;
  b->id = 0;
}

/* The process's ringing socket, shared by its threads (sendto on one
 * datagram socket is thread-safe); made on first use, kept for the
 * process's life. */
static int ring_fd = -1;

static int ring_sock(void) {
  int fd = __atomic_load_n(&ring_fd, __ATOMIC_ACQUIRE), want = -1;
  if (fd >= 0)
    return fd;
  fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  if (!__atomic_compare_exchange_n(&ring_fd, &want, fd, 0, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE)) {
    close(fd); /* another thread made it first */
    fd = want;
  }
  return fd;
}

int lynx_bell_ring(uint32_t id) {
  struct sockaddr_un a;
  socklen_t len = bell_addr(&a, id);
  int fd = ring_sock();
  if (fd < 0)
    return fd;
  if (sendto(fd, "", 1, MSG_DONTWAIT | MSG_NOSIGNAL, (struct sockaddr *)&a,
             len) < 0)
    return -errno;
  return 0;
}

int lynx_bell_after_publish(const struct lynx_mq *mq, const char *who) {
  uint32_t id;
  int rc;
  /* Dekker with the worker's arm: our index store and its waiter store
   * are each followed by a full fence, so either it sees our message or
   * we see its waiter. */
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  id = __atomic_load_n(&mq->fctrl->waiter, __ATOMIC_RELAXED);
  if (!id)
    return 0;
  rc = lynx_bell_ring(id);
  /* -EAGAIN: the worker has rings to drain already */
  if (rc < 0 && rc != -EAGAIN)
    LYNX_LOG_RL(LYNX_LOG_WARN, "bell",
                "%s: cannot ring bell %08x of the frontend worker waiting "
                "on its mqueue: %s (the worker wakes on its timer)",
                who, id, strerror(-rc));
  return rc ? rc : 1;
}
