/*
 * rxring.h - a UDP socket's receive path on io_uring: one multishot
 * recvmsg into a ring of provided buffers, its completions harvested from
 * the shared completion queue without a system call (docs/design.md,
 * "Receive path").
 *
 * One ring per socket, used by one thread: lynx_rxring_init may run on
 * another thread (it submits nothing), but every lynx_rxring_poll must run
 * on the thread that then owns the ring, because the kernel does the
 * receive work of a request on the thread that submitted it. The ring's fd
 * (lynx_rxring_fd) is readable while completions wait, so a thread that
 * sleeps in poll(2) on it wakes on a datagram.
 */
#ifndef LYNX_FE_RXRING_H
#define LYNX_FE_RXRING_H

#include <liburing.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* Provided buffers: each takes a whole datagram (UDP's largest payload is
 * 65,527 bytes over IPv6) after io_uring's header and the peer's address,
 * so no datagram is truncated. */
#define LYNX_RXRING_BUFS 128
#define LYNX_RXRING_BUF_SIZE (65536u + 128u)

struct lynx_rxring {
  struct io_uring ring;
  struct io_uring_buf_ring *br; /* the provided-buffer ring (mmap) */
  uint8_t *bufs;                /* LYNX_RXRING_BUFS buffers (mmap) */
  struct msghdr mh;             /* the receive's template: name length */
  int sock;
  int ready;        /* ring and buffers set up */
  int armed;        /* a multishot recvmsg is in flight */
  uint32_t err_run; /* error completions since the last datagram */
  int last_err;     /* the last one's -errno */
  /* counts, read by their owner only: io_uring_enter calls (arming,
   * cancelling), receives ended for want of buffers, error completions */
  uint64_t enters, nobufs, errors;
};

/* Called once per datagram by lynx_rxring_poll: its payload (len bytes;
 * valid only during the call), its sender, and whether it was longer than
 * the buffer (truncated: data holds its first len bytes). */
typedef void (*lynx_rxring_fn)(void *arg, const void *data, size_t len,
                               const struct sockaddr *from, int truncated);

/* Sets up a ring and its buffers for the bound UDP socket sock (not owned:
 * the caller closes it after lynx_rxring_free). Submits nothing. 0 or
 * -errno (-ENOSYS, -EPERM: io_uring disabled, filtered or absent; -EINVAL:
 * a kernel without provided-buffer rings; -ENOMEM); on error nothing is
 * left to free. */
int lynx_rxring_init(struct lynx_rxring *r, int sock);

/* Delivers at most max datagrams from the completion queue to fn, returns
 * their buffers, and arms the multishot receive again where the kernel
 * ended it (out of buffers, or for its own reasons). A system call only to
 * arm. Returns the number delivered, or a negative errno when the ring
 * keeps failing (8 error completions in a row without a datagram, or
 * arming fails): the caller should receive another way and free it. */
int lynx_rxring_poll(struct lynx_rxring *r, unsigned max, lynx_rxring_fn fn,
                     void *arg);

/* The ring's fd (poll it for POLLIN), or -1 when not set up. */
int lynx_rxring_fd(const struct lynx_rxring *r);

/* Cancels the receive, waits (at most 100 ms) for the kernel to let go of
 * the buffers, and frees everything. Datagrams still queued are discarded.
 * Idempotent; safe on a ring whose init failed or never ran (zeroed). */
void lynx_rxring_free(struct lynx_rxring *r);

/* Whether this process can receive UDP through io_uring here: sets up a
 * ring on a loopback socket, sends itself a datagram and receives it with a
 * multishot recvmsg into a provided buffer. 0, or -errno with the reason in
 * why. */
int lynx_rxring_probe(char *why, size_t len);

#endif
