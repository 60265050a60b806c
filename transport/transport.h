/*
 * transport.h - how a frontend reaches an accelerator's mqueue region, and
 * how an agent provides one.
 *
 * Backends (shm, tcp, rdma: transport_*.c, tcp_*.c, rdma_*.c) fill a
 * const struct lynx_transport_ops. A member a backend cannot provide
 * points at a function returning -ENOTSUP; no member is ever NULL.
 *
 * Agent side: agent_create returns a handle (struct lynx_transport_agent)
 * that owns everything the transport serves with (tcp: its listener,
 * thread and data-port guard; rdma: its device, CM listener and thread);
 * regions are allocated through it and remember it (r->agent).
 *
 * Frontend side: one lynx_tconn per (frontend worker, accelerator), used by
 * that worker's thread only. Writes and reads are *posted*: they take effect
 * at the latest when flush() returns (writes) or when poll() reports their
 * wr_id (reads). A backend may complete them earlier. Every access is
 * bounds-checked against the region size here, before it is issued.
 *
 * Errors are 0 / -errno. A connection that returned -ECONNRESET, -EIO or
 * -EPROTO is dead: close it. -ESTALE from connect or any op: the region
 * belongs to a newer frontend (fencing, below) or a newer incarnation of
 * itself; the connection is dead too.
 *
 * Fencing (docs/mqueue.md "Fencing"): a connect presents desc.producer, the
 * frontend epoch of its frontend. A region admits only its newest: an
 * older one is refused (-ESTALE), a newer one takes the region over and
 * every connection of an older one is cut (its ops fail, -ESTALE where the
 * backend can tell it apart), so each mqueue has one producer.
 */
#ifndef LYNX_TRANSPORT_H
#define LYNX_TRANSPORT_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "desc.h" /* struct lynx_region_desc, enum lynx_mr */

struct lynx_guard;

/* What an agent-side handle is created with. */
struct lynx_transport_opts {
  const char *listen; /* tcp/rdma: "host:port" to serve on (port 0 = any) */
  /* tcp: caps of the data port (connguard.h; 0 = no cap) */
  uint32_t conn_max, unauth_max, per_source;
  /* tcp: host-memory regions are POSIX shared-memory files as well, so
   * that a frontend on the agent's own host and in its network namespace
   * maps them through shm (struct lynx_region's shm; docs/design.md
   * "Local regions"); 0: private to the agent process */
  int share;
};

/* Agent side: one serving transport, returned by agent_create and passed
 * to every region operation (as SPDK's transports are). Backends embed
 * this first and recover themselves with container_of; nothing of a
 * transport's agent side is process-global, so a process (a test) may hold
 * several. */
struct lynx_transport_agent {
  const struct lynx_transport_ops *ops;
  char bound[LYNX_LOCATOR_MAX]; /* "host:port" listened on; "" for shm */
  /* the data port's guard (caps, counters for --metrics), or NULL where
   * the transport has none (shm; rdma does not use one yet) */
  struct lynx_guard *guard;
  int share; /* the opts' share, where the transport honours it (tcp) */
};

/*
 * Memory a region lives in that the agent process cannot load from and
 * store to (a GPU's, allocated by the agent's CUDA backend). The agent side
 * of tcp and rdma reaches such a region only through these; frontends see no
 * difference. Called from the transport's own thread, and from the agent's
 * (formatting, health reads): an implementation serialises them.
 *
 * Writes take effect in the order they were made, whichever call made them
 * (write or write_start); a read (read or read_start) sees every write made
 * before it.
 */
struct lynx_region_mem {
  const char *kind; /* "cuda", for messages */
  /* Copy into the region. One may still be in flight on return (src may
   * be reused at once). */
  int (*write)(void *ctx, uint64_t off, const void *src, size_t len);
  /* Copy out of the region; complete on return. */
  int (*read)(void *ctx, uint64_t off, void *dst, size_t len);
  /*
   * Batches, optional: all three set, or none (then every access goes
   * through write and read). The tcp server makes each received buffer of
   * operations one batch, from its one thread, so that device memory is
   * waited for once per buffer instead of once per read, and never for a
   * write. write and read may still come between (the agent's thread):
   * they leave a batch's reads alone.
   *
   * write_start: as write; flags LYNX_WR_PUBLISH: the last 4 bytes land
   *   after every byte before them. The copy may be held back to merge
   *   with the next adjacent write of the batch (never the publishing word
   *   with anything) and is issued at the latest by the next read_start or
   *   flush. An error may be an earlier held write's: the batch failed.
   * read_start: queues a copy of [off, off + len) that sees every earlier
   *   write; *bytes holds it from the return of the flush that ends its
   *   batch until the next write_start or read_start. -ENOBUFS: the batch
   *   already holds as many reads as the memory can stage (flush, use
   *   their bytes, start again); -E2BIG: too large to stage at all (use
   *   read).
   * flush: ends the batch: issues held writes and waits, once, for the
   *   reads started since the last flush; never waits for writes alone.
   *   0, or -errno (the reads' bytes are then undefined).
   */
  int (*write_start)(void *ctx, uint64_t off, const void *src, size_t len,
                     unsigned flags);
  int (*read_start)(void *ctx, uint64_t off, size_t len, const void **bytes);
  int (*flush)(void *ctx);
  /* rdma: register [off, off + len) of the region with protection domain
   * pd (struct ibv_pd *) for access (IBV_ACCESS_*); *mr is the struct
   * ibv_mr *. 0 or -errno, the reason in err. */
  int (*reg_mr)(void *ctx, void *pd, uint64_t off, size_t len, int access,
                void **mr, char *err, size_t errlen);
  /* The transport is done with the memory (its last data connection is
   * gone): the owner may free it. Called exactly once per attach. */
  void (*release)(void *ctx);
  uint64_t dev_addr; /* the region's base in the device's address space */
  /* Optional: a copy, in host memory, of the region's accelerator-control
   * array (8 bytes per mqueue at the geometry's actrl_off) that the
   * accelerator itself keeps current with release stores after each of
   * its own, or NULL. The tcp server's compound read takes the array from
   * here (acquire loads, no copy) and stages only the slots it names, so a
   * poll of device memory is waited for once, not twice (docs/gpu.md). */
  const void *ctrl_mirror;
  void *ctx;
};

/* A region's fencing, as the agent's metrics see it. */
struct lynx_fence_stats {
  uint64_t fence;     /* the newest producer epoch admitted (0: none yet) */
  uint64_t producers; /* live data connections admitted at fence (shm: 0,
                         the agent does not see them) */
  uint64_t refused;   /* connects refused for an older epoch (shm: 0) */
  uint64_t cut;       /* connections cut by a newer epoch (shm: 0) */
};

/* Agent side of tcp and rdma: one exported region's fence. Changed only by
 * the transport's serving thread (or under its lock), so the decisions
 * need no atomics; every field is still stored atomically because the
 * agent's metrics thread reads them without a lock. */
struct lynx_fence {
  uint64_t epoch, producers, refused, cut;
  char name[LYNX_LOCATOR_MAX]; /* the region, for log lines */
};

/* Agent side: memory the transport provides and exports. */
struct lynx_region {
  const struct lynx_transport_ops *ops;
  struct lynx_transport_agent *agent; /* the handle it was allocated from */
  const struct lynx_region_mem *mem;  /* device memory, or NULL: base */
  uint8_t *base;
  uint64_t size;
  char locator[LYNX_LOCATOR_MAX];
  int fd;
  uint64_t key;                  /* tcp, rdma: access key (random) */
  uint64_t remote_addr;          /* rdma */
  uint32_t rkeys[LYNX_MR_COUNT]; /* rdma */
  void *priv;                    /* backend state */
  char name[LYNX_LOCATOR_MAX];   /* what region_alloc/attach named it */
  /* tcp, rdma: the fence of the export (set by region_export, NULL before
   * and after region_free: it may outlive r); shm: NULL, the fence is the
   * header word LYNX_OFF_FENCE */
  const struct lynx_fence *fence;
  /* tcp with share: the shared-memory file the region's host memory is,
   * the shm transport's locator for it (unlinked by region_free); "" when
   * only this transport serves it */
  char shm[LYNX_LOCATOR_MAX];
};

/* Frontend side: backends embed this first and recover themselves with
 * container_of. */
struct lynx_tconn {
  const struct lynx_transport_ops *ops;
  struct lynx_region_desc desc;
  void *data;
};

/* writev flags */
#define LYNX_WR_PUBLISH                                                        \
  0x1u                     /* the last 4 bytes (4-aligned) become visible      \
                              only after every byte before them */
#define LYNX_WR_FENCE 0x2u /* do not start before earlier reads complete */

/* One mqueue's part of a compound TX read (read_tx): its TX slots from
 * free-running position from on, as many as the control array read in the
 * same operation says are published (tx_prod - from), at most max; none
 * when that count is out of range (tx_prod beyond from + slots). */
struct lynx_tx_read {
  uint32_t q;    /* the mqueue */
  uint32_t from; /* first position to read: the caller's tx_cons */
  uint32_t max;  /* slots at most: dst holds max * slot_size bytes */
  uint32_t got;  /* set when the read is reported: slots now in dst */
  void *dst;
};

/* Pushed answers (subscribe): the agent sends each TX slot its accelerator
 * publishes on a subscribed mqueue, unasked, with the large message the
 * slot names where it can. One of these per mqueue; the buffers are the
 * caller's and stay valid until the connection is closed. */
struct lynx_tx_large {
  uint32_t off, len; /* in the large area; len 0: none pushed */
};

struct lynx_tx_sub {
  uint32_t q;       /* the mqueue */
  uint32_t from;    /* caller: the first position to push (its tx_cons) */
  uint32_t rx_cons; /* caller: the rx_cons it knows; then the latest pushed */
  uint32_t prod;    /* transport: slots pushed up to this position (from on;
                       caller sets it to from) */
  uint32_t flags;   /* caller: LYNX_SUB_* */
  uint8_t *ring;    /* slots * slot_size: position p's slot at (p & (slots -
                       1)) * slot_size */
  uint8_t *large;   /* large_bytes of the region, or NULL where it has none */
  struct lynx_tx_large *lmsg; /* slots entries (NULL without large area):
                                 what came with position p's slot, at
                                 p & (slots - 1) */
};

/* A subscribed mqueue whose rx_cons matters on its own (a client
 * mqueue: its RX ring takes back ends' replies): each move is pushed at
 * once. Elsewhere rx_cons comes with the next slot pushed, or within a
 * few milliseconds. */
#define LYNX_SUB_RX_EAGER 0x1u

/* A connection's subscription: n entries of sub. */
struct lynx_push {
  struct lynx_tx_sub *sub;
  int n;
  /* transport: 0 until the agent answered, then 1 (it pushes; every poll
   * applies what came to the entries) or -errno (it will not: poll) */
  int state;
};

/* One mqueue a sleeping frontend worker waits on (arm): its index and how
 * far the worker has consumed its TX ring. */
struct lynx_arm {
  uint32_t q;
  uint32_t cons;
};

struct lynx_transport_ops {
  const char *name;

  /* Agent: start serving remote frontends on o->listen. *out is the
   * handle every region operation goes through; its bound holds the
   * "host:port" actually listened on. 0, or -errno with the reason in err
   * (e.g. no RDMA device). shm: a handle with nothing to serve. */
  int (*agent_create)(const struct lynx_transport_opts *o,
                      struct lynx_transport_agent **out, char *err,
                      size_t errlen);
  /* Agent: stop serving (closing every data connection) and free a. Free
   * every region of a first (a handle that still has regions is stopped
   * but kept for their region_free). NULL: a no-op. */
  void (*agent_destroy)(struct lynx_transport_agent *a);
  /* Agent: allocate a zeroed region of size bytes named after name; fills
   * r->base, size, locator (shm: the file; tcp/rdma: a's bound "host:port",
   * host possibly a wildcard the agent replaces before advertising) and
   * r->agent. Always a shared mapping (MAP_SHARED), so that a second
   * mapping of the same pages can outlive it (the CUDA backend registers
   * one with the GPU: accel/cuda/cuda_region.c). a NULL (not serving):
   * -ENOTCONN. */
  int (*region_alloc)(struct lynx_transport_agent *a, struct lynx_region *r,
                      const char *name, uint64_t size);
  /* Agent: like region_alloc, for zeroed device memory of size bytes the
   * transport reaches through mem (r->base stays NULL). The transport owns
   * the memory until it calls mem->release, which it does exactly once,
   * also when attach fails. -ENOTSUP where device memory cannot be
   * reached (shm). */
  int (*region_attach)(struct lynx_transport_agent *a, struct lynx_region *r,
                       const char *name, uint64_t size,
                       const struct lynx_region_mem *mem);
  /* Agent: make a formatted region reachable through r->agent (tcp: accept
   * connections that present r->key; rdma: register its three access
   * classes, fill rkeys and remote_addr). Called after lynx_region_format. */
  int (*region_export)(struct lynx_region *r);
  /* Agent: unexport (closing its data connections) and free; accepts a
   * half-built region. */
  void (*region_free)(struct lynx_region *r);

  /* Frontend: connect to the region d names, validate its header against d.
   * *out is freed with close. */
  int (*connect)(const struct lynx_region_desc *d, struct lynx_tconn **out);
  /* Post a gather write of iov to [off, off + total). */
  int (*writev)(struct lynx_tconn *c, uint64_t off, const struct iovec *iov,
                int iovcnt, unsigned flags);
  /* Post a read of [off, off + len) into dst (valid until reported). */
  int (*read)(struct lynx_tconn *c, uint64_t off, void *dst, size_t len,
              uint64_t wr_id);
  /* Post a compound read, reported as one wr_id: the whole control array
   * (actrl, 8 bytes per mqueue) into actrl and, from that same snapshot,
   * each tx[i]'s published TX slots into tx[i].dst (tx[i].got of them),
   * so that one round trip brings what the two-step path (a read of the
   * array, then reads of the slots it names) needs two for. tx (n
   * entries) and every buffer stay the caller's and valid until reported.
   * -ENOTSUP where the two steps cost no more (shm, rdma); -EMSGSIZE when
   * the largest possible answer is beyond what one operation carries. */
  int (*read_tx)(struct lynx_tconn *c, void *actrl, struct lynx_tx_read *tx,
                 int n, uint64_t wr_id);
  /* Post a subscription, reported as one wr_id: from then on (p->state
   * 1) the agent sends every TX slot published on p's mqueues, and poll,
   * which must be called while answers are awaited, copies each into its
   * entry's ring (and the large message it names into large), then moves
   * prod and rx_cons; wait_fd turns readable when some came. The slots
   * stay there until the caller's consumer index passes them, as in the
   * region. p and its buffers stay valid until close. -ENOTSUP where
   * answers are not pushed (shm, rdma: the frontend reads them). */
  int (*subscribe)(struct lynx_tconn *c, struct lynx_push *p, uint64_t wr_id);
  /* Doorbell: start everything posted since the last flush. */
  int (*flush)(struct lynx_tconn *c);
  /* Reap up to max completed reads into ids. Count, or -errno when the
   * connection failed. */
  int (*poll)(struct lynx_tconn *c, uint64_t *ids, int max);
  /* A file descriptor that turns readable when poll may find new
   * completions (the worker sleeps on it instead of a timer), or -ENOTSUP
   * where completions need no system call to arrive (shm). */
  int (*wait_fd)(struct lynx_tconn *c);
  /* Wake the accelerator if it sleeps on its doorbell; -ENOTSUP where an
   * accelerator cannot sleep (it busy-polls). */
  int (*notify)(struct lynx_tconn *c);
  /* Response doorbell (common/bell.h), before a frontend worker sleeps:
   * ask the accelerator to ring bell (nonzero) when it publishes on any of
   * the n mqueues a[i].q, whose TX rings the worker has consumed up to
   * a[i].cons; bell 0 withdraws the request. 1: a message is already
   * published past some cons (do not sleep; the request stands until
   * withdrawn), 0: done, -ENOTSUP where the accelerator does not ring (a
   * GPU's region) or cannot reach the worker's bell (tcp, rdma: their
   * wait_fd serves instead). */
  int (*arm)(struct lynx_tconn *c, uint32_t bell, const struct lynx_arm *a,
             int n);
  /* Release the connection; the region stays with its agent. */
  void (*close)(struct lynx_tconn *c);
};

/* A backend's table from its functions, each named <prefix>_<member>: one
 * place maps members to functions, and a backend that lacks one does not
 * compile (none is ever NULL). */
#define LYNX_TRANSPORT_OPS(nm, prefix)                                         \
  {                                                                            \
    .name = nm, .agent_create = prefix##_agent_create,                         \
    .agent_destroy = prefix##_agent_destroy,                                   \
    .region_alloc = prefix##_region_alloc,                                     \
    .region_attach = prefix##_region_attach,                                   \
    .region_export = prefix##_region_export,                                   \
    .region_free = prefix##_region_free, .connect = prefix##_connect,          \
    .writev = prefix##_writev, .read = prefix##_read,                          \
    .read_tx = prefix##_read_tx, .subscribe = prefix##_subscribe,              \
    .flush = prefix##_flush, .poll = prefix##_poll,                            \
    .wait_fd = prefix##_wait_fd, .notify = prefix##_notify,                    \
    .arm = prefix##_arm, .close = prefix##_close                               \
  }

extern const struct lynx_transport_ops lynx_transport_shm;
extern const struct lynx_transport_ops lynx_transport_tcp;
extern const struct lynx_transport_ops lynx_transport_rdma;

/* Wakes a CPU accelerator sleeping on the region's doorbell (shm notify,
 * and the tcp/rdma agents on a frontend's notify). 0 or -errno. */
int lynx_region_wake(uint8_t *base);

/* Agent side of tcp/rdma: region_alloc through handle a (NULL: not
 * serving, -ENOTCONN): zeroed memory the agent process serves itself
 * (a shared mapping, as region_alloc says), its locator a's bound and
 * r->name name. Anonymous, or where a->share a shared-memory file named
 * after name (r->shm). 0 or -errno. */
int lynx_region_map_served(struct lynx_region *r,
                           struct lynx_transport_agent *a, const char *name,
                           uint64_t size);

/* Creates the shared-memory file path (O_EXCL: never another's) of size
 * zeroed bytes, its pages allocated at once where reserve (a full
 * /dev/shm is then -ENOSPC here, not SIGBUS at a later store), and maps
 * it shared: *p, and its descriptor in *fd. 0 or -errno (nothing is left
 * behind). The shm transport's regions (reserve 0) and tcp's shared ones
 * (reserve 1). */
int lynx_shm_create(const char *path, uint64_t size, int reserve, int *fd,
                    void **p);

/* What region_free of tcp/rdma does with memory no export holds: the
 * file unlinked (r->shm; its mapping stays with whoever has it), and
 * base unmapped when unmap. */
void lynx_region_unmap_served(struct lynx_region *r, int unmap);

/* Agent side of tcp/rdma: region_attach through handle a (NULL: not
 * serving, -ENOTCONN); hands mem back at once (mem->release) when it
 * fails. 0 or -errno. */
int lynx_region_attach_served(struct lynx_region *r,
                              struct lynx_transport_agent *a, uint64_t size,
                              const struct lynx_region_mem *mem);

/* Agent side of tcp/rdma: fills an empty or wildcard host in a "host:port"
 * locator with host. */
void lynx_locator_set_host(char *locator, size_t len, const char *host);

/* read_tx of a backend without a compound read (shm, rdma): -ENOTSUP. */
int lynx__read_tx_none(struct lynx_tconn *c, void *actrl,
                       struct lynx_tx_read *tx, int n, uint64_t wr_id);

/* subscribe of a backend that does not push answers (shm, rdma):
 * -ENOTSUP. */
int lynx__subscribe_none(struct lynx_tconn *c, struct lynx_push *p,
                         uint64_t wr_id);

/* arm of a backend whose accelerators cannot reach a frontend's bell
 * (tcp, rdma): -ENOTSUP. */
int lynx__arm_none(struct lynx_tconn *c, uint32_t bell,
                   const struct lynx_arm *a, int n);

/* The backend called name (a descriptor's transport), or NULL
 * (transport_lookup.c). */
const struct lynx_transport_ops *lynx_transport_find(const char *name);

/* Bounds check shared by every backend: 0 when [off, off+len) lies inside a
 * region of size bytes, -EFAULT otherwise (overflow-safe). */
static inline int lynx_bounds_ok(uint64_t size, uint64_t off, uint64_t len) {
  return (off <= size && len <= size - off) ? 0 : -EFAULT;
}

/* Where [off, off+len) lies in a region of geometry g: the enum lynx_mr
 * class holding all of it, or -EFAULT when it is outside the region or
 * straddles two classes. */
struct lynx_geom;
int lynx_region_class(const struct lynx_geom *g, uint64_t off, uint64_t len);

/* The checks every backend makes before posting a gather write: the sum
 * of iov (overflow-safe) lies in the write class (fctrl, RX rings), and a
 * PUBLISH write is at least a word and ends on one. Sets *total. 0,
 * -EFAULT or -EINVAL. */
int lynx_writev_check(const struct lynx_geom *g, uint64_t off,
                      const struct iovec *iov, int iovcnt, unsigned flags,
                      uint64_t *total);

/* A published TX slot's large message, read from a host copy of the
 * slot's slot_size bytes: its metadata into *m, and 1 with its reference
 * in *ref when the slot is large and both pass the bounds rules of an
 * area of large_bytes; 0 otherwise (not large, or malformed: the
 * frontend's forwarder judges it). The agent's push and the frontend's
 * large reads read references with this one rule. */
struct lynx_slot_meta;
struct lynx_large_ref;
int lynx_slot_large(const uint8_t *slot, uint32_t slot_size,
                    uint32_t large_bytes, struct lynx_slot_meta *m,
                    struct lynx_large_ref *ref);

/* Checks a mapped region's header against its descriptor; 0 or -EPROTO with
 * the reason in err. */
int lynx_region_validate(const void *base, uint64_t mapped,
                         const struct lynx_region_desc *d, char *err,
                         size_t errlen);

/* Reads [off, off + len) of an agent-side region, host or device memory,
 * as a frontend would (acquire). 0, -EFAULT out of bounds, or the device's
 * -errno. */
int lynx_region_read(const struct lynx_region *r, uint64_t off, void *dst,
                     size_t len);

/* Writes the header of a freshly allocated region. */
int lynx_region_format(struct lynx_region *r, uint32_t q, uint32_t slots,
                       uint32_t slot_size, uint32_t large_bytes,
                       uint32_t ordering, uint64_t epoch, uint32_t accel_id);

/* ---- fencing by frontend epoch (docs/mqueue.md "Fencing") ---- */

enum lynx_fence_verdict {
  LYNX_FENCE_REFUSE = -1,  /* producer < fence: an older frontend */
  LYNX_FENCE_ADMIT = 0,    /* producer == fence: another connection of it */
  LYNX_FENCE_TAKEOVER = 1, /* producer > fence: a newer frontend */
};

/* The one rule every backend applies. Epoch 0 ("no epoch") is therefore
 * admitted only while the region has admitted no epoch. */
enum lynx_fence_verdict lynx_fence_decide(uint64_t fence, uint64_t producer);

/* The reason of a refusal, for logs and the tcp HELLO reply. */
void lynx_fence_why(char *buf, size_t len, uint64_t producer, uint64_t fence);

/* shm: the connect's CAS-max of the header word (at LYNX_OFF_FENCE of a
 * mapped region). 0: admitted (the word now holds producer), or -ESTALE
 * with the newer fence in *fence. */
int lynx_fence_cas(uint64_t *word, uint64_t producer, uint64_t *fence);

/* tcp, rdma agent: admits a connection presenting producer to f. 0 (same
 * epoch, counted as a producer), LYNX_FENCE_TAKEOVER (f->epoch is now
 * producer, its previous value in *was: the caller cuts every connection
 * of an older epoch, then calls lynx_fence_took_over), or -ESTALE
 * (refused, counted, the reason in why). */
int lynx_fence_admit(struct lynx_fence *f, uint64_t producer, uint64_t *was,
                     char *why, size_t wl);
/* After a takeover: counts the n connections cut and logs it once. */
void lynx_fence_took_over(struct lynx_fence *f, uint64_t was, uint64_t now,
                          unsigned n);
/* A connection admitted at producer is gone (closed, failed or cut). */
void lynx_fence_release(struct lynx_fence *f, uint64_t producer);
/* Writes epoch into the region's header word, host memory (base) or
 * device memory (mem), so that readers of the region see it. 0 or
 * -errno. */
int lynx_fence_store(uint8_t *base, const struct lynx_region_mem *mem,
                     uint64_t epoch);

/* The agent's view of r's fencing, without locks (the metrics thread). */
void lynx_region_fence_stats(const struct lynx_region *r,
                             struct lynx_fence_stats *out);

#endif
