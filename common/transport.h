/*
 * transport.h - how a frontend reaches an accelerator's mqueue region, and
 * how an agent provides one.
 *
 * Backends ("shm" here; "tcp" and "rdma" plug in the same way) fill a
 * const struct lynx_transport_ops. A member a backend cannot provide points
 * at a function returning -ENOTSUP; no member is ever NULL.
 *
 * Frontend side: one lynx_tconn per (frontend worker, accelerator), used by
 * that worker's thread only. Writes and reads are *posted*: they take effect
 * at the latest when flush() returns (writes) or when poll() reports their
 * wr_id (reads). A backend may complete them earlier. Every access is
 * bounds-checked against the region size here, before it is issued.
 *
 * Errors are 0 / -errno. A connection that returned -ECONNRESET, -EIO or
 * -EPROTO is dead: close it.
 */
#ifndef LYNX_TRANSPORT_H
#define LYNX_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define LYNX_LOCATOR_MAX 128

/* What a frontend needs to reach one region (mirrors lynx.RegionDesc). */
struct lynx_region_desc {
  uint32_t accel_id;
  char transport[16];
  char locator[LYNX_LOCATOR_MAX];
  uint64_t region_size;
  uint64_t epoch;
  uint32_t n_mqueues, slot_size, slots;
  uint32_t ordering; /* enum lynx_ordering */
  uint64_t key;         /* tcp, rdma: the region's access key */
  uint64_t remote_addr; /* rdma: region base in the agent */
  uint32_t rkeys[3];    /* rdma: indexed by enum lynx_mr */
};

/* The three access classes of a region (layout version 2): what a frontend
 * reads (header + actrl, TX rings) and what it writes (fctrl + RX rings). */
enum lynx_mr {
  LYNX_MR_CTL = 0,   /* [0, fctrl_off): remote read */
  LYNX_MR_WRITE = 1, /* [fctrl_off, rings_off + Q*S*Z): remote write */
  LYNX_MR_TX = 2,    /* [rings_off + Q*S*Z, region_size): remote read */
  LYNX_MR_COUNT = 3,
};

/*
 * Memory a region lives in that the agent process cannot load from and
 * store to (a GPU's, allocated by the agent's CUDA backend). The agent side
 * of tcp and rdma reaches such a region only through these; frontends see no
 * difference. Called from the transport's own thread.
 */
struct lynx_region_mem {
  const char *kind; /* "cuda", for messages */
  /* Copy into the region. Writes take effect in the order they were made;
   * one may still be in flight on return (src may be reused at once). */
  int (*write)(void *ctx, uint64_t off, const void *src, size_t len);
  /* Copy out of the region; sees every earlier write. */
  int (*read)(void *ctx, uint64_t off, void *dst, size_t len);
  /* rdma: register [off, off + len) of the region with protection domain
   * pd (struct ibv_pd *) for access (IBV_ACCESS_*); *mr is the struct
   * ibv_mr *. 0 or -errno, the reason in err. */
  int (*reg_mr)(void *ctx, void *pd, uint64_t off, size_t len, int access,
                void **mr, char *err, size_t errlen);
  /* The transport is done with the memory (its last data connection is
   * gone): the owner may free it. Called exactly once per attach. */
  void (*release)(void *ctx);
  uint64_t dev_addr; /* the region's base in the device's address space */
  void *ctx;
};

/* Agent side: memory the transport provides and exports. */
struct lynx_region {
  const struct lynx_transport_ops *ops;
  const struct lynx_region_mem *mem; /* device memory, or NULL: base */
  uint8_t *base;
  uint64_t size;
  char locator[LYNX_LOCATOR_MAX];
  int fd;
  uint64_t key;         /* tcp, rdma: access key (random) */
  uint64_t remote_addr; /* rdma */
  uint32_t rkeys[3];    /* rdma */
  void *priv;           /* backend state */
};

/* Frontend side: backends embed this first and recover themselves with
 * container_of. */
struct lynx_tconn {
  const struct lynx_transport_ops *ops;
  struct lynx_region_desc desc;
  void *data;
};

/* writev flags */
#define LYNX_WR_PUBLISH 0x1u /* the last 4 bytes (4-aligned) become visible
                                only after every byte before them */
#define LYNX_WR_FENCE 0x2u   /* do not start before earlier reads complete */

struct lynx_transport_ops {
  const char *name;

  /* Agent, once per process before any region: start serving remote
   * frontends on listen ("host:port"; port 0 = any). Fills bound with the
   * "host:port" actually listened on. 0, or -errno with the reason in err
   * (e.g. no RDMA device). shm: nothing to serve. */
  int (*agent_start)(const char *listen, char *bound, size_t boundlen,
                     char *err, size_t errlen);
  /* Agent: stop serving; closes every data connection. */
  void (*agent_stop)(void);
  /* Agent: allocate a zeroed region of size bytes named after name; fills
   * r->base, size, locator (shm: the file; tcp/rdma: the bound "host:port",
   * host possibly a wildcard the agent replaces before advertising). */
  int (*region_alloc)(struct lynx_region *r, const char *name, uint64_t size);
  /* Agent: like region_alloc, for zeroed device memory of size bytes the
   * transport reaches through mem (r->base stays NULL). The transport owns
   * the memory until it calls mem->release, which it does exactly once,
   * also when attach fails. -ENOTSUP where device memory cannot be
   * reached (shm). */
  int (*region_attach)(struct lynx_region *r, const char *name, uint64_t size,
                       const struct lynx_region_mem *mem);
  /* Agent: make a formatted region reachable (tcp: accept connections that
   * present r->key; rdma: register its three access classes, fill rkeys and
   * remote_addr). Called after lynx_region_format. */
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
  /* Release the connection; the region stays with its agent. */
  void (*close)(struct lynx_tconn *c);
};

extern const struct lynx_transport_ops lynx_transport_shm;
extern const struct lynx_transport_ops lynx_transport_tcp;
extern const struct lynx_transport_ops lynx_transport_rdma;

/* The agent's tcp data port (the rdma transport does not use it yet): its
 * connection caps, configured before agent_start (all 0: no cap), and the
 * counters its --metrics shows (connguard.h). */
struct lynx_guard;
extern struct lynx_guard lynx_data_guard;

/* Wakes a CPU accelerator sleeping on the region's doorbell (shm notify,
 * and the tcp/rdma agents on a frontend's notify). 0 or -errno. */
int lynx_region_wake(uint8_t *base);

/* Agent side of tcp/rdma: region_alloc for a transport whose server is
 * running (else -ENOTCONN) and listens at locator: zeroed anonymous memory
 * the agent process serves itself. 0 or -errno. */
int lynx_region_map_anon(struct lynx_region *r,
                         const struct lynx_transport_ops *ops, int running,
                         uint64_t size, const char *locator);

/* Agent side of tcp/rdma: region_attach for a transport whose server is
 * running (else -ENOTCONN) and listens at locator; hands mem back at once
 * (mem->release) when it fails. 0 or -errno. */
int lynx_region_attach_served(struct lynx_region *r,
                              const struct lynx_transport_ops *ops,
                              int running, uint64_t size,
                              const struct lynx_region_mem *mem,
                              const char *locator);

/* Agent side of tcp/rdma: fills an empty or wildcard host in a "host:port"
 * locator with host. */
void lynx_locator_set_host(char *locator, size_t len, const char *host);

/* The backend called name, or NULL. */
const struct lynx_transport_ops *lynx_transport_find(const char *name);

/* Bounds check shared by every backend: 0 when [off, off+len) lies inside a
 * region of size bytes, -EFAULT otherwise (overflow-safe). */
static inline int lynx_bounds_ok(uint64_t size, uint64_t off, uint64_t len) {
  return (off <= size && len <= size - off) ? 0 : -14;
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
                       uint32_t slot_size, uint32_t ordering, uint64_t epoch,
                       uint32_t accel_id);

/* Descriptor <-> protobuf. to_pb points into d (no copies: keep d alive
 * while pb is used). from_pb validates; 0 or -EINVAL with a reason. */
struct Lynx__RegionDesc;
void lynx_desc_to_pb(const struct lynx_region_desc *d,
                     struct Lynx__RegionDesc *pb);
int lynx_desc_from_pb(const struct Lynx__RegionDesc *pb,
                      struct lynx_region_desc *d, char *err, size_t errlen);

#endif
