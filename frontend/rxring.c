/*
 * rxring.c - a UDP socket's receive path on io_uring (rxring.h).
 *
 * One multishot recvmsg stays armed on the socket: the kernel receives
 * each datagram into a buffer it takes from a provided-buffer ring and
 * posts a completion whose buffer holds io_uring's header, the sender's
 * address and the payload. The owner harvests completions straight from
 * the shared completion queue (no system call), hands each datagram to its
 * callback and gives the batch's buffers back with one store. A system
 * call is made only to arm the receive: at the start, and again when the
 * kernel ends it (no buffer was free, an empty datagram, which a multishot
 * receive takes for the end of a stream, or its own reasons). Compared with
 * recvmmsg, which costs one call per batch plus the call that finds the
 * socket empty, a busy socket is read without entering the kernel at all;
 * the kernel does the receive in task work on the owner's thread.
 *
 * The ring is set up without SQPOLL or DEFER_TASKRUN: SQPOLL would spend a
 * kernel thread's core, and deferred task work would need a system call
 * per harvest. COOP_TASKRUN: a datagram arriving while the owner sleeps
 * (in poll(2) on the ring's fd) wakes it, but one arriving while it runs
 * sends no interrupt; its task work runs at the owner's next system call,
 * which its loop makes every pass anyway (kernels before 5.19 lack the
 * flag: the ring is set up without it).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "rxring.h"

#define BGID 0          /* the provided-buffer group */
#define UD_RECV 1       /* user_data of the multishot receive */
#define UD_CANCEL 2     /* user_data of its cancellation */
#define ERR_RUN_MAX 8u  /* error completions in a row before giving up */
#define RING_ENTRIES 8u /* submissions: only arming and cancelling */
#define BR_BYTES (LYNX_RXRING_BUFS * sizeof(struct io_uring_buf))
#define BUF_BYTES ((size_t)LYNX_RXRING_BUFS * LYNX_RXRING_BUF_SIZE)

static void give_back(struct lynx_rxring *r, unsigned bid, int offset) {
  io_uring_buf_ring_add(r->br, r->bufs + (size_t)bid * LYNX_RXRING_BUF_SIZE,
                        LYNX_RXRING_BUF_SIZE, (unsigned short)bid,
                        io_uring_buf_ring_mask(LYNX_RXRING_BUFS), offset);
}

int lynx_rxring_init(struct lynx_rxring *r, int sock) {
  struct io_uring_params p;
  struct io_uring_buf_reg reg;
  int rc;
  memset(r, 0, sizeof(*r));
  memset(&p, 0, sizeof(p));
  /* room for a completion per buffer, and the errors that end a receive */
  p.flags = IORING_SETUP_CQSIZE | IORING_SETUP_COOP_TASKRUN;
  p.cq_entries = 2 * LYNX_RXRING_BUFS;
  rc = io_uring_queue_init_params(RING_ENTRIES, &r->ring, &p);
  if (rc == -EINVAL) {
    p.flags &= ~IORING_SETUP_COOP_TASKRUN;
    rc = io_uring_queue_init_params(RING_ENTRIES, &r->ring, &p);
  }
  if (rc)
    return rc;
  r->br = mmap(NULL, BR_BYTES, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (r->br == MAP_FAILED) {
    rc = -errno;
    goto free_ring;
  }
  /* pages are touched only as datagrams land in them */
  r->bufs = mmap(NULL, BUF_BYTES, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r->bufs == MAP_FAILED) {
    rc = -errno;
    goto free_br;
  }
  io_uring_buf_ring_init(r->br);
  memset(&reg, 0, sizeof(reg));
  reg.ring_addr = (uint64_t)(uintptr_t)r->br;
  reg.ring_entries = LYNX_RXRING_BUFS;
  reg.bgid = BGID;
  rc = io_uring_register_buf_ring(&r->ring, &reg, 0);
  if (rc)
    goto free_bufs;
  for (unsigned i = 0; i < LYNX_RXRING_BUFS; i++)
    give_back(r, i, (int)i);
  io_uring_buf_ring_advance(r->br, LYNX_RXRING_BUFS);
  /* room for an IPv6 address; no control messages */
  r->mh.msg_namelen = sizeof(struct sockaddr_in6);
  r->sock = sock;
  r->ready = 1;
  return 0;
free_bufs:
  munmap(r->bufs, BUF_BYTES);
free_br:
  munmap(r->br, BR_BYTES);
free_ring:
  io_uring_queue_exit(&r->ring);
  memset(r, 0, sizeof(*r));
  return rc;
}

static int arm(struct lynx_rxring *r) {
  struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
  int rc;
  if (!sqe)
    return -EBUSY; /* cannot be: nothing else is queued */
  io_uring_prep_recvmsg_multishot(sqe, r->sock, &r->mh, 0);
  sqe->flags |= IOSQE_BUFFER_SELECT;
  sqe->buf_group = BGID;
  io_uring_sqe_set_data64(sqe, UD_RECV);
  r->enters++;
  rc = io_uring_submit(&r->ring);
  if (rc < 0)
    return rc;
  r->armed = 1;
  return 0;
}

/* One completion of the receive: a datagram for fn, or why it ended.
 * Returns 1 when a datagram was delivered. */
static int complete(struct lynx_rxring *r, const struct io_uring_cqe *cqe,
                    lynx_rxring_fn fn, void *arg) {
  struct io_uring_recvmsg_out *o;
  unsigned bid;
  if (!(cqe->flags & IORING_CQE_F_MORE))
    r->armed = 0;
  if (cqe->res < 0) {
    if (cqe->res == -ENOBUFS) {
      r->nobufs++; /* armed again once this batch's buffers are back */
    } else {
      r->errors++;
      r->err_run++;
      r->last_err = cqe->res;
    }
    return 0;
  }
  if (!(cqe->flags & IORING_CQE_F_BUFFER))
    return 0; /* a receive completes with a buffer, or with an error */
  bid = cqe->flags >> IORING_CQE_BUFFER_SHIFT;
  o = io_uring_recvmsg_validate(r->bufs + (size_t)bid * LYNX_RXRING_BUF_SIZE,
                                cqe->res, &r->mh);
  if (!o || o->namelen > r->mh.msg_namelen) {
    r->errors++;
    return 0;
  }
  r->err_run = 0;
  fn(arg, io_uring_recvmsg_payload(o, &r->mh),
     io_uring_recvmsg_payload_length(o, cqe->res, &r->mh),
     io_uring_recvmsg_name(o), (o->flags & MSG_TRUNC) != 0);
  return 1;
}

int lynx_rxring_poll(struct lynx_rxring *r, unsigned max, lynx_rxring_fn fn,
                     void *arg) {
  struct io_uring_cqe *cqe;
  unsigned head, seen = 0, bufs = 0;
  int n = 0, rc;
  if (!r->ready)
    return -EINVAL;
  io_uring_for_each_cqe(&r->ring, head, cqe) {
    if ((unsigned)n >= max)
      break; /* bounded work per call: the rest waits for the next */
    seen++;
    if (cqe->user_data != UD_RECV)
      continue;
    n += complete(r, cqe, fn, arg);
    /* the buffer is copied out: back to the kernel with the batch */
    if (cqe->flags & IORING_CQE_F_BUFFER)
      give_back(r, cqe->flags >> IORING_CQE_BUFFER_SHIFT, (int)bufs++);
  }
  if (seen)
    io_uring_cq_advance(&r->ring, seen);
  if (bufs)
    io_uring_buf_ring_advance(r->br, (int)bufs);
  if (r->err_run >= ERR_RUN_MAX)
    return r->last_err;
  /* re-armed only once the queue is drained, so that the buffers of the
   * completions still in it are back */
  if (!r->armed && io_uring_cq_ready(&r->ring) == 0) {
    rc = arm(r);
    if (rc)
      return rc;
  }
  return n;
}

int lynx_rxring_fd(const struct lynx_rxring *r) {
  return r->ready ? r->ring.ring_fd : -1;
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void lynx_rxring_free(struct lynx_rxring *r) {
  struct io_uring_sqe *sqe;
  uint64_t end;
  int drained;
  if (!r->ready)
    return;
  if (r->armed && (sqe = io_uring_get_sqe(&r->ring)) != NULL) {
    io_uring_prep_cancel64(sqe, UD_RECV, 0);
    io_uring_sqe_set_data64(sqe, UD_CANCEL);
    r->enters++;
    if (io_uring_submit(&r->ring) < 0)
      r->armed = 1; /* nothing to wait for but the deadline */
  }
  /* the receive's last completion says the kernel let go of the buffers */
  end = now_ms() + 100;
  while (r->armed && now_ms() < end) {
    struct __kernel_timespec ts = {0, 10 * 1000 * 1000};
    struct io_uring_cqe *cqe;
    int rc = io_uring_wait_cqe_timeout(&r->ring, &cqe, &ts);
    if (rc == 0) {
      if (cqe->user_data == UD_RECV && !(cqe->flags & IORING_CQE_F_MORE))
        r->armed = 0;
      io_uring_cqe_seen(&r->ring, cqe);
    } else if (rc != -ETIME && rc != -EINTR) {
      break;
    }
  }
  drained = !r->armed;
  io_uring_unregister_buf_ring(&r->ring, BGID);
  io_uring_queue_exit(&r->ring);
  /* a receive that never confirmed its end may still be writing: its
   * buffers are left mapped rather than reused (cannot happen short of a
   * kernel that ignores the cancellation) */
  if (drained)
    munmap(r->bufs, BUF_BYTES);
  munmap(r->br, BR_BYTES);
  memset(r, 0, sizeof(*r));
}

/* ---- the probe ------------------------------------------------------- */

static void probe_got(void *arg, const void *data, size_t len,
                      const struct sockaddr *from, int truncated) {
  int *got = arg;
  (void)from;
  if (!truncated && len == 5 && memcmp(data, "probe", 5) == 0)
    *got = 1;
}

static const char *hint(int err) {
  switch (err) {
  case -ENOSYS:
    return " (this kernel has no io_uring)";
  case -EPERM:
  case -EACCES:
    return " (io_uring is disabled for this process: sysctl "
           "kernel.io_uring_disabled, a seccomp filter or a security "
           "module)";
  case -EINVAL:
    return " (this kernel predates provided-buffer rings, 5.19, or "
           "multishot recvmsg, 6.0)";
  case -ENOMEM:
    return " (out of memory, or of locked memory: RLIMIT_MEMLOCK)";
  default:
    return "";
  }
}

int lynx_rxring_probe(char *why, size_t len) {
  struct sockaddr_in a = {.sin_family = AF_INET};
  socklen_t alen = sizeof(a);
  struct lynx_rxring r;
  uint64_t end;
  int s, rc, got = 0;
  s = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s < 0) {
    rc = -errno;
    snprintf(why, len, "no UDP socket to probe with: %s", strerror(-rc));
    return rc;
  }
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(s, (struct sockaddr *)&a, sizeof(a)) != 0 ||
      getsockname(s, (struct sockaddr *)&a, &alen) != 0) {
    rc = -errno;
    snprintf(why, len, "no loopback UDP socket to probe with: %s",
             strerror(-rc));
    close(s);
    return rc;
  }
  rc = lynx_rxring_init(&r, s);
  if (rc) {
    snprintf(why, len, "cannot set up a ring with provided buffers: %s%s",
             strerror(-rc), hint(rc));
    close(s);
    return rc;
  }
  rc = lynx_rxring_poll(&r, 1, probe_got, &got); /* arms */
  if (rc >= 0 && sendto(s, "probe", 5, 0, (struct sockaddr *)&a, alen) != 5)
    rc = -errno;
  end = now_ms() + 1000;
  while (rc >= 0 && !got && now_ms() < end) {
    struct pollfd pfd = {lynx_rxring_fd(&r), POLLIN, 0};
    poll(&pfd, 1, 100);
    rc = lynx_rxring_poll(&r, 1, probe_got, &got);
  }
  if (rc < 0)
    snprintf(why, len, "multishot recvmsg failed: %s%s", strerror(-rc),
             hint(rc));
  else if (!got)
    snprintf(why, len, "multishot recvmsg received nothing in 1 s");
  lynx_rxring_free(&r);
  close(s);
  return rc < 0 ? rc : got ? 0 : -ETIMEDOUT;
}
