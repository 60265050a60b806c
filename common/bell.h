/*
 * bell.h - response doorbells: how a CPU accelerator wakes a frontend
 * worker that sleeps while it waits for answers over shm (docs/mqueue.md
 * "Response doorbells").
 *
 * A worker owns a bell: a Unix datagram socket bound to a path in /dev/shm
 * (where the shm regions themselves live, so a bell reaches whoever can map
 * the region, in any network namespace), named by a nonzero 32-bit id.
 * Before it sleeps it writes the id into fctrl.waiter of its mqueues, then
 * looks at their TX rings once more (the transport's arm); an accelerator
 * that publishes on an mqueue loads waiter after its index (a full fence
 * between, as the worker's between its store and its load) and, when it is
 * set, sends a 1-byte datagram to the bell. The worker polls the socket.
 */
#ifndef LYNX_BELL_H
#define LYNX_BELL_H

#include <stdint.h>

#include "mqueue.h"

struct lynx_bell {
  int fd;      /* -1: none */
  uint32_t id; /* 0: none */
};

/* Frontend worker: bind a bell under a fresh random id, after removing
 * the bells of killed workers (paths nothing listens on). 0 or -errno; on
 * failure b has no bell (fd -1, id 0). */
int lynx_bell_open(struct lynx_bell *b);
/* Empties the socket after a wake-up (one system call for up to 16 rings);
 * the number drained. */
int lynx_bell_drain(struct lynx_bell *b);
/* Unbinds and closes; a no-op on a bell that was never opened (zeroed, or
 * left by a failed open). */
void lynx_bell_close(struct lynx_bell *b);

/* Accelerator: rings bell id (one datagram through a socket the process
 * shares among its threads). 0 or -errno: -ENOENT or -ECONNREFUSED when no
 * worker has that bell (it left), -EAGAIN when its socket is full (it has
 * rings to drain already: nothing lost). */
int lynx_bell_ring(uint32_t id);

/* Accelerator, right after publishing on mq's TX ring: rings the bell of
 * the worker waiting on it, if one does. 1 when it rang, 0 when no one
 * waits, or -errno from lynx_bell_ring, which is also logged (rate-limited,
 * as who's; the worker then wakes on its timer). A worker that is woken
 * already may be rung again until it withdraws its waiter: a datagram it
 * drains. */
int lynx_bell_after_publish(const struct lynx_mq *mq, const char *who);

#endif
