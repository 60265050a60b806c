/*
 * rdma_conformance.c - the rdma transport over a real RDMA device
 * (hardware, SoftRoCE or siw): an agent side (agent_create, a formatted and
 * exported region) and frontend connections in one process, through the
 * real rdma_cm and verbs, on the device's own IPv4 address.
 *
 *   lynx-rdma-conformance [host]      host: default $LYNX_RDMA_ADDR, else
 *                                     the first IPv4 address of the first
 *                                     RDMA device's network interface
 *
 * Exit 0 when every step passes, 1 on the first failure, 77 (skip) when
 * there is no RDMA device or no address to reach it on.
 *
 * Steps: connect (header read and validated over the QP); a request
 * written with one publish WRITE and received by the accelerator's ring
 * code; a response read back (actrl, TX slot); a long run of small
 * writes (chains, inline, selective signalling, -ENOBUFS retry); the wait
 * fd of a sleeping worker; local refusals; notify waking a "sleeping"
 * accelerator; the device's own enforcement of the three registrations (a write
 * that passes the local check but lands in a TX ring, a read that lands in an
 * RX ring: both must fail with -EIO); wrong key and stale epoch refused at
 * connect; region_free disconnecting a live frontend.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <ifaddrs.h>
#include <infiniband/verbs.h>
#include <net/if.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "mqueue.h"
#include "transport.h"
#include "util.h"

#define Q 2u
#define S 8u
#define Z 256u
#define WAIT_NS 3000000000ull

static const struct lynx_transport_ops *ops = &lynx_transport_rdma;
static struct lynx_transport_agent *agent; /* the agent side's handle */
static struct lynx_region region;
static struct lynx_region_desc desc;
static struct lynx_geom geom;
static int step_no;

#define FAIL(...)                                                              \
  do {                                                                         \
    fprintf(stderr, "rdma_conformance: step %d FAILED (%s:%d): ", step_no,     \
            __FILE__, __LINE__);                                               \
    fprintf(stderr, __VA_ARGS__);                                              \
    fputc('\n', stderr);                                                       \
    return -1;                                                                 \
  } while (0)

/* ---- where the device is ------------------------------------------------- */

static int read_line(const char *path, char *buf, size_t len) {
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  if (!fgets(buf, (int)len, f)) {
    fclose(f);
    return -1;
  }
  fclose(f);
  buf[strcspn(buf, "\r\n")] = 0;
  return buf[0] ? 0 : -1;
}

/* The network interface of an RDMA device: RoCE's GID table, rxe/siw's
 * parent, or an IPoIB port's net directory. */
static int dev_netdev(const char *dev, char *nd, size_t len) {
  char path[512];
  DIR *d;
  struct dirent *de;
  snprintf(path, sizeof(path),
           "/sys/class/infiniband/%s/ports/1/gid_attrs/ndevs/0", dev);
  if (read_line(path, nd, len) == 0)
    return 0;
  snprintf(path, sizeof(path), "/sys/class/infiniband/%s/parent", dev);
  if (read_line(path, nd, len) == 0)
    return 0;
  snprintf(path, sizeof(path), "/sys/class/infiniband/%s/device/net", dev);
  d = opendir(path);
  if (!d)
    return -1;
  while ((de = readdir(d)) != NULL)
    if (de->d_name[0] != '.') {
      size_t n = strnlen(de->d_name, len - 1);
      memcpy(nd, de->d_name, n);
      nd[n] = 0;
      closedir(d);
      return 0;
    }
  closedir(d);
  return -1;
}

static int netdev_ipv4(const char *nd, char *host, size_t len) {
  struct ifaddrs *ifa, *i;
  int rc = -1;
  if (getifaddrs(&ifa))
    return -1;
  for (i = ifa; i && rc; i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
        strcmp(i->ifa_name, nd) == 0) {
      inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, host,
                (socklen_t)len);
      rc = 0;
    }
  freeifaddrs(ifa);
  return rc;
}

/* 0 with host set, 77 to skip. */
static int find_device(int argc, char **argv, char *host, size_t len) {
  int n = 0;
  struct ibv_device **l = ibv_get_device_list(&n);
  const char *env = getenv("LYNX_RDMA_ADDR");
  if (!l || n == 0) {
    if (l)
      ibv_free_device_list(l);
    printf("rdma_conformance: SKIP: no RDMA device (ibv_get_device_list "
           "returned none). Add SoftRoCE with: modprobe rdma_rxe; rdma link "
           "add rxe0 type rxe netdev IFACE (docs/rdma.md)\n");
    return 77;
  }
  if (argc > 1 || (env && *env)) {
    snprintf(host, len, "%s", argc > 1 ? argv[1] : env);
    ibv_free_device_list(l);
    return 0;
  }
  for (int k = 0; k < n; k++) {
    char nd[IF_NAMESIZE + 1];
    const char *name = ibv_get_device_name(l[k]);
    if (dev_netdev(name, nd, sizeof(nd)) == 0 &&
        netdev_ipv4(nd, host, len) == 0) {
      printf("rdma_conformance: device %s, interface %s, address %s\n", name,
             nd, host);
      ibv_free_device_list(l);
      return 0;
    }
  }
  ibv_free_device_list(l);
  printf("rdma_conformance: SKIP: %d RDMA device(s) but no IPv4 address on "
         "their interfaces; set LYNX_RDMA_ADDR\n",
         n);
  return 77;
}

/* ---- helpers ------------------------------------------------------------- */

static int wait_read(struct lynx_tconn *tc, uint64_t want) {
  uint64_t deadline = lynx_now_ns() + WAIT_NS, id;
  for (;;) {
    int rc = tc->ops->poll(tc, &id, 1);
    if (rc < 0)
      return rc;
    if (rc == 1 && id == want)
      return 0;
    if (rc == 1)
      return -EPROTO;
    if (lynx_now_ns() > deadline)
      return -ETIMEDOUT;
  }
}

/* Posts a read of len bytes at off and waits for it. */
static int sync_read(struct lynx_tconn *tc, uint64_t off, void *dst, size_t len,
                     uint64_t id) {
  int rc = tc->ops->read(tc, off, dst, len, id);
  if (!rc)
    rc = tc->ops->flush(tc);
  return rc ? rc : wait_read(tc, id);
}

/* Waits for a dead connection to say so. */
static int wait_error(struct lynx_tconn *tc) {
  uint64_t deadline = lynx_now_ns() + WAIT_NS, id;
  uint8_t b[8];
  int rc = 0;
  while (rc >= 0 && lynx_now_ns() < deadline) {
    /* keep one read in flight: a flushed QP reports through it */
    if (tc->ops->read(tc, 0, b, sizeof(b), 1) == 0)
      tc->ops->flush(tc);
    rc = tc->ops->poll(tc, &id, 1);
  }
  return rc;
}

static uint32_t fctrl_value(uint32_t q) {
  return lynx_load_acquire32(
      (uint32_t *)(region.base + lynx_fctrl_off(&geom, q)));
}

/* ---- steps --------------------------------------------------------------- */

static int step_connect(struct lynx_tconn **tc) {
  int rc = ops->connect(&desc, tc);
  if (rc)
    FAIL("connect to %s: %s", desc.locator, strerror(-rc));
  return 0;
}

static int step_request(struct lynx_tconn *tc) {
  static const char msg[] = "conformance ping";
  static const uint8_t zeros[16];
  uint32_t len = sizeof(msg), poff = lynx_payload_off(Z, len);
  struct lynx_slot_meta m = {len, 0xC0FFEE, LYNX_ST_OK, (uint16_t)(poff / 16),
                             lynx_seq_for(0)};
  struct iovec iov[3] = {{(void *)msg, len},
                         {(void *)zeros, lynx_slot_cap(Z) - poff - len},
                         {&m, sizeof(m)}};
  uint64_t slot = lynx_slot_off(&geom, lynx_rx_ring_off(&geom, 0), 0);
  uint64_t deadline = lynx_now_ns() + WAIT_NS;
  struct lynx_mq mq;
  struct lynx_msg got = {0};
  int rc = tc->ops->writev(tc, slot + poff, iov, 3, LYNX_WR_PUBLISH);
  if (!rc)
    rc = tc->ops->flush(tc);
  if (rc)
    FAIL("posting a request: %s", strerror(-rc));
  lynx_mq_bind(&mq, region.base, &geom, 0);
  while ((rc = lynx_mq_recv(&mq, &got)) == -EAGAIN) {
    uint64_t id;
    int prc = tc->ops->poll(tc, &id, 1);
    if (prc < 0)
      FAIL("poll while the request travels: %s", strerror(-prc));
    if (lynx_now_ns() > deadline)
      FAIL("the request never arrived in the RX ring");
  }
  if (rc || got.len != len || got.tag != 0xC0FFEE || memcmp(got.data, msg, len))
    FAIL("the accelerator received something else (rc %d, len %u, tag 0x%x)",
         rc, got.len, got.tag);
  lynx_mq_release(&mq);
  return 0;
}

static int step_response(struct lynx_tconn *tc) {
  static const char pong[] = "conformance pong";
  struct lynx_actrl a[Q];
  uint8_t slot[Z];
  struct lynx_slot_meta m;
  struct lynx_mq mq;
  uint8_t *buf;
  int rc;
  lynx_mq_bind(&mq, region.base, &geom, 1);
  if (lynx_mq_reserve(&mq, sizeof(pong), &buf))
    FAIL("cannot reserve a TX slot");
  memcpy(buf, pong, sizeof(pong));
  lynx_mq_commit(&mq, 0xABCD, sizeof(pong), sizeof(pong), LYNX_ST_OK);
  rc = sync_read(tc, geom.actrl_off, a, sizeof(a), 11);
  if (rc)
    FAIL("reading actrl: %s", strerror(-rc));
  if (a[1].tx_prod != 1)
    FAIL("actrl[1].tx_prod is %u, want 1", a[1].tx_prod);
  rc = sync_read(tc, lynx_slot_off(&geom, lynx_tx_ring_off(&geom, 1), 0), slot,
                 sizeof(slot), 12);
  if (rc)
    FAIL("reading the TX slot: %s", strerror(-rc));
  memcpy(&m, slot + Z - LYNX_META_SIZE, sizeof(m));
  if (m.seq != lynx_seq_for(0) || m.tag != 0xABCD || m.len != sizeof(pong) ||
      lynx_meta_check(&m, Z) ||
      memcmp(slot + m.off16 * 16u, pong, sizeof(pong)))
    FAIL("the response read back differs (seq %u tag 0x%x len %u)", m.seq,
         m.tag, m.len);
  return 0;
}

/* Many small writes: chains, inline, signalling, and -ENOBUFS handled by
 * polling; a read afterwards is a barrier (RC executes in order). */
static int step_many_writes(struct lynx_tconn *tc) {
  uint32_t v = 0, last = 0;
  uint8_t b[8];
  for (uint32_t i = 1; i <= 20000; i++) {
    struct iovec iov = {&v, 4};
    uint64_t id;
    int rc;
    v = i;
    while ((rc = tc->ops->writev(tc, lynx_fctrl_off(&geom, 0), &iov, 1,
                                 LYNX_WR_PUBLISH)) == -ENOBUFS)
      if ((rc = tc->ops->poll(tc, &id, 1)) < 0)
        break;
    if (rc)
      FAIL("write %u: %s", i, strerror(-rc));
    last = i;
    if (i % 100 == 0 && (rc = tc->ops->flush(tc)) != 0 && rc != -ENOBUFS)
      FAIL("flush after write %u: %s", i, strerror(-rc));
  }
  if (tc->ops->flush(tc) || sync_read(tc, 0, b, sizeof(b), 21))
    FAIL("barrier read after the writes");
  if (fctrl_value(0) != last)
    FAIL("fctrl[0] is %u after the run, want %u", fctrl_value(0), last);
  return 0;
}

/* A sleeping worker's fd: readable once a read completes, quiet when
 * there is nothing (else the worker would spin). */
static int step_wait_fd(struct lynx_tconn *tc) {
  struct pollfd p = {-1, POLLIN, 0};
  uint8_t b[8];
  int rc;
  p.fd = tc->ops->wait_fd(tc);
  if (p.fd < 0)
    FAIL("wait_fd: %s", strerror(-p.fd));
  rc = tc->ops->read(tc, 0, b, sizeof(b), 31);
  if (!rc)
    rc = tc->ops->flush(tc);
  if (rc)
    FAIL("read: %s", strerror(-rc));
  p.fd = tc->ops->wait_fd(tc);
  if (p.fd < 0 || poll(&p, 1, 2000) != 1)
    FAIL("the wait fd did not turn readable for a completed read");
  rc = wait_read(tc, 31);
  if (rc)
    FAIL("the read's id: %s", strerror(-rc));
  p.fd = tc->ops->wait_fd(tc);
  if (p.fd < 0 || poll(&p, 1, 50) != 0)
    FAIL("the wait fd is readable with nothing to do");
  return 0;
}

static int step_local_refusals(struct lynx_tconn *tc) {
  uint8_t b[8] = {0};
  struct iovec iov = {b, 8};
  uint64_t tx = lynx_tx_ring_off(&geom, 0), rx = lynx_rx_ring_off(&geom, 0);
  if (tc->ops->writev(tc, tx, &iov, 1, 0) != -EFAULT ||
      tc->ops->writev(tc, 0, &iov, 1, 0) != -EFAULT ||
      tc->ops->read(tc, rx, b, 8, 1) != -EFAULT ||
      tc->ops->read(tc, geom.region_size - 4, b, 8, 1) != -EFAULT)
    FAIL("an access outside its class was not refused with -EFAULT");
  return 0;
}

static int step_notify(struct lynx_tconn *tc) {
  uint32_t *sleeping = (uint32_t *)(region.base + LYNX_OFF_SLEEPING);
  uint32_t *bell = (uint32_t *)(region.base + LYNX_OFF_DOORBELL);
  uint32_t before = __atomic_load_n(bell, __ATOMIC_SEQ_CST);
  uint64_t deadline = lynx_now_ns() + WAIT_NS;
  int rc;
  __atomic_store_n(sleeping, 1, __ATOMIC_SEQ_CST);
  rc = tc->ops->notify(tc);
  if (rc)
    FAIL("notify: %s", strerror(-rc));
  while (__atomic_load_n(bell, __ATOMIC_SEQ_CST) == before) {
    uint64_t id;
    if (tc->ops->poll(tc, &id, 1) < 0 || lynx_now_ns() > deadline) {
      __atomic_store_n(sleeping, 0, __ATOMIC_SEQ_CST);
      FAIL("the agent did not ring the doorbell after a notify SEND");
    }
  }
  __atomic_store_n(sleeping, 0, __ATOMIC_SEQ_CST);
  return 0;
}

/* A connection whose descriptor is shifted so an access the local check
 * allows lands in another class's memory: the device must refuse it. */
static int step_device_enforces(int is_write) {
  struct lynx_tconn *tc = NULL;
  uint64_t tx = lynx_tx_ring_off(&geom, 0), rx = lynx_rx_ring_off(&geom, 0);
  uint32_t v = 0xBAD;
  struct iovec iov = {&v, 4};
  uint8_t b[8];
  int rc = ops->connect(&desc, &tc);
  if (rc)
    FAIL("second connection: %s", strerror(-rc));
  if (is_write) {
    /* fctrl offset, WRITE rkey, but the bytes would land in TX ring 0 */
    tc->desc.remote_addr += tx - geom.fctrl_off;
    rc = tc->ops->writev(tc, geom.fctrl_off, &iov, 1, 0);
  } else {
    /* header offset, CTL rkey, but the bytes would come from RX ring 0 */
    tc->desc.remote_addr += rx;
    rc = tc->ops->read(tc, 0, b, sizeof(b), 1);
  }
  if (!rc)
    rc = tc->ops->flush(tc);
  if (!rc)
    rc = wait_error(tc);
  tc->ops->close(tc);
  if (rc != -EIO)
    FAIL("a %s outside its registration gave %d, want -EIO",
         is_write ? "write" : "read", rc);
  if (is_write && lynx_load_acquire32((uint32_t *)(region.base + tx)) == 0xBAD)
    FAIL("the refused write reached the TX ring");
  return 0;
}

static int step_refused(uint64_t key_xor, uint64_t epoch_add) {
  struct lynx_region_desc d = desc;
  struct lynx_tconn *tc = NULL;
  int rc;
  d.key ^= key_xor;
  d.epoch += epoch_add;
  rc = ops->connect(&d, &tc);
  if (rc == 0) {
    tc->ops->close(tc);
    FAIL("a connection with a %s was accepted",
         key_xor ? "wrong key" : "stale epoch");
  }
  return 0;
}

static int step_free_disconnects(struct lynx_tconn *tc) {
  int rc;
  ops->region_free(&region);
  rc = wait_error(tc);
  if (rc != -ECONNRESET && rc != -EIO)
    FAIL("after region_free the frontend saw %d, want -ECONNRESET or -EIO", rc);
  return 0;
}

/* ---- main ---------------------------------------------------------------- */

static int setup_region(const char *bound) {
  uint64_t epoch;
  int rc;
  if (getrandom(&epoch, sizeof(epoch), 0) != sizeof(epoch))
    epoch = (uint64_t)time(NULL);
  if (lynx_geom_init(&geom, Q, S, Z, 0))
    FAIL("geometry");
  rc = ops->region_alloc(agent, &region, "conformance", geom.region_size);
  if (rc)
    FAIL("region_alloc: %s", strerror(-rc));
  rc = lynx_region_format(&region, Q, S, Z, 0, LYNX_ORDER_COALESCED, epoch, 0);
  if (!rc)
    rc = ops->region_export(&region);
  if (rc)
    FAIL("format/export: %s", strerror(-rc));
  memset(&desc, 0, sizeof(desc));
  snprintf(desc.transport, sizeof(desc.transport), "rdma");
  snprintf(desc.locator, sizeof(desc.locator), "%s", bound);
  desc.region_size = geom.region_size;
  desc.epoch = epoch;
  desc.n_mqueues = Q;
  desc.slots = S;
  desc.slot_size = Z;
  desc.ordering = LYNX_ORDER_COALESCED;
  desc.key = region.key;
  desc.remote_addr = region.remote_addr;
  memcpy(desc.rkeys, region.rkeys, sizeof(desc.rkeys));
  printf("rdma_conformance: region at %s, rkeys %#x %#x %#x\n", bound,
         desc.rkeys[0], desc.rkeys[1], desc.rkeys[2]);
  return 0;
}

int main(int argc, char **argv) {
  char host[128], listen[160], err[512];
  struct lynx_tconn *tc = NULL;
  int rc = find_device(argc, argv, host, sizeof(host));
  if (rc)
    return rc;
  snprintf(listen, sizeof(listen), strchr(host, ':') ? "[%s]:0" : "%s:0", host);
  step_no = 1;
  rc = ops->agent_create(&(struct lynx_transport_opts){.listen = listen},
                         &agent, err, sizeof(err));
  if (rc) {
    fprintf(stderr, "rdma_conformance: agent_create(%s): %s\n", listen, err);
    return 1;
  }
  memset(&region, 0, sizeof(region));
  rc = setup_region(agent->bound);
#define STEP(expr)                                                             \
  do {                                                                         \
    step_no++;                                                                 \
    if (!rc) {                                                                 \
      rc = (expr);                                                             \
      if (!rc)                                                                 \
        printf("rdma_conformance: step %d ok: %s\n", step_no, #expr);          \
    }                                                                          \
  } while (0)
  STEP(step_connect(&tc));
  STEP(step_request(tc));
  STEP(step_response(tc));
  STEP(step_many_writes(tc));
  STEP(step_wait_fd(tc));
  STEP(step_local_refusals(tc));
  STEP(step_notify(tc));
  STEP(step_device_enforces(1));
  STEP(step_device_enforces(0));
  STEP(step_refused(1, 0));
  STEP(step_refused(0, 1));
  STEP(step_free_disconnects(tc));
#undef STEP
  if (tc)
    tc->ops->close(tc);
  ops->region_free(&region); /* a no-op after step_free_disconnects */
  ops->agent_destroy(agent);
  printf("rdma_conformance: %s\n", rc ? "FAILED" : "all steps passed");
  return rc ? 1 : 0;
}
