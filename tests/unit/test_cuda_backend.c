/*
 * test_cuda_backend.c - the CUDA backend (accel/cuda/cuda_*.c) run
 * against a fake CUDA runtime (fake_cuda.c), the way unit_transport_rdma
 * runs the rdma code against a fake NIC: no GPU, no driver.
 *
 * Discovery (names, memory, PCI bus id, GPUDirect ordering -> fenced or
 * coalesced, the refusals); an instance served over the real tcp transport
 * whose region is in fake device memory, reached only through copies on
 * the instance's copy stream, with a fake persistent kernel (a thread
 * running the real ring code) echoing a frontend's request; stop, the
 * per-device free list (no cudaFree while the agent runs, reuse, one
 * cudaFree per chunk at shutdown); a hung kernel (-ETIMEDOUT, its memory
 * kept, never freed); health (sticky, lost, non-sticky); no device-wide
 * synchronisation while another kernel runs; the RDMA registration of GPU
 * memory (dma-buf with offset/iova of the class, the nvidia-peermem
 * fallback, both reasons when both fail); clean-up on every failure; and
 * the tcp transport's pinned staging with copies that stay in flight as on
 * a GPU (writes never wait, a batch's reads wait once, order, merging, the
 * ring's wraps and waits, what it cannot take, every failure).
 *
 * The tcp agent side is process-wide: started once for the whole file.
 * The backend's state (free list, per-device error record) is too, so the
 * tests use separate fake GPUs where health is asserted.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/mempolicy.h>

#include <cmocka.h>
#include <infiniband/verbs.h>

#include "lenet_model.h"
#include "face.h"
#include "fake_cuda.h"
#include "cuda_internal.h"
#include "gpu.h"
#include "mqueue.h"
#include "transport.h"
#include "ut_main.h"
#include "ut_region.h"
#include "ut_ring.h"
#include "ut_tconn.h"
#include "util.h"
#include "vector_sum.h"

#define S 8u
#define Z 256u
#define EPOCH 0x5EED0000C0DAull
#define ACCEL 3u
#define GPUS 5
/* GPU 0 as discovery describes it, for runs_app */
static const struct lynx_accel_dev gpu0 = {.ops = &lynx_accel_cuda,
                                           .device = 0};

#ifndef STOP_WAIT_MS
#define STOP_WAIT_MS 3000u
#endif

static const struct lynx_transport_ops *T;
static char g_bound[LYNX_LOCATOR_MAX];
static struct lynx_transport_agent *g_ta; /* the agent side's handle */
/* The hung instances' handles: the backend keeps them (and their memory)
 * until the process exits, by design; reachable here so LeakSanitizer
 * agrees. */
struct gpu_instance
    *volatile ut_hung_gi[2]; /* test_hung_kernel, the host one */

#define assert_contains(hay, needle)                                           \
  do {                                                                         \
    if (!strstr((hay), (needle)))                                              \
      fail_msg("'%s' does not contain '%s'", (hay), (needle));                 \
  } while (0)

/* ---- the process-wide tcp agent side -------------------------------- */

static int group_setup(void **state) {
  (void)state;
  fake_cuda_gpus(GPUS);
  fake_cuda_reset();
  return ut_tcp_agent(&T, &g_ta, g_bound, sizeof(g_bound));
}

static const struct lynx_transport_ops *c_shm;
static struct lynx_transport_agent *c_ta;
static void *c_app_data; /* what the app's start gave the agent */

static int group_teardown(void **state) {
  (void)state;
  T->agent_destroy(g_ta);
  if (c_ta)
    c_shm->agent_destroy(c_ta);
  gpu_shutdown();
  fake_cuda_reap();
  return 0;
}

/* ---- a fake transport: captures the region memory it is given ------- */

static const struct lynx_region_mem *fk_mem;
static int fk_attaches, fk_releases, fk_export_rc;

static int fk_attach(struct lynx_transport_agent *a, struct lynx_region *r,
                     const char *name, uint64_t size,
                     const struct lynx_region_mem *mem);

static int fk_export(struct lynx_region *r) {
  (void)r;
  return fk_export_rc;
}

static void fk_free(struct lynx_region *r) {
  if (r->mem) {
    fk_releases++;
    r->mem->release(r->mem->ctx);
  }
  r->mem = NULL;
}

static const struct lynx_transport_ops fake_tops = {
    .name = "fake",
    .region_attach = fk_attach,
    .region_export = fk_export,
    .region_free = fk_free,
};

static int fk_attach(struct lynx_transport_agent *a, struct lynx_region *r,
                     const char *name, uint64_t size,
                     const struct lynx_region_mem *mem) {
  (void)a;
  (void)name;
  fk_attaches++;
  r->fd = -1;
  r->base = NULL;
  r->priv = NULL;
  r->ops = &fake_tops;
  r->mem = mem;
  r->size = size;
  snprintf(r->locator, sizeof(r->locator), "fake:1");
  fk_mem = mem;
  return 0;
}

/* ---- instances --------------------------------------------------------- */

struct inst {
  struct gpu_info gpu;       /* for gpu_health */
  struct lynx_accel_dev dev; /* the same GPU as discovery describes it */
  struct lynx_region r;
  struct lynx_geom g;
  struct gpu_instance *gi;
  struct fake_kernel *k;
  struct lynx_tconn *c;
  uint64_t epoch;
  char err[512];
};

/* The lease fence instances start with (UINT64_MAX: none, static mode). */
static uint64_t start_serve_until = UINT64_MAX;
/* --gpu-blocks they start with (0: auto). */
static uint32_t start_blocks;
static uint32_t start_idle_ns = 500; /* the agent's --gpu-idle-ns default */
/* The GPU's NUMA node they start with (-1: none known). */
static int start_numa = -1;
/* Set: instances start as the agent starts them with --region-mem host
 * (the transport allocates, formats and exports the region in host memory,
 * then the backend maps it into the GPU); agent-side handle start_ta. */
static int start_host;
static struct lynx_transport_agent *start_ta;
/* The application they run, its configuration and threads per block. */
static const char *start_app = "echo";
static const char *start_config;
static uint32_t start_threads = 64;

static int inst_start(struct inst *in, int dev,
                      const struct lynx_transport_ops *ops, uint32_t q,
                      uint32_t n_server, uint64_t epoch) {
  struct lynx_accel_launch l;
  const struct lynx_app *echo_app = lynx_app_find(start_app);
  int n0 = fake_cuda_kernels(), rc;
  assert_non_null(echo_app);
  assert_true(echo_app->module || echo_app->cuda_app == LYNX_CUDA_APP_ECHO);
  memset(in, 0, sizeof(*in));
  in->gpu.device = dev;
  snprintf(in->gpu.name, sizeof(in->gpu.name), "Fake GPU %d", dev);
  in->gpu.rdma_writes_ordering = cudaGPUDirectRDMAWritesOrderingOwner;
  in->gpu.ordering = LYNX_ORDER_COALESCED;
  in->dev = (struct lynx_accel_dev){.ops = &lynx_accel_cuda,
                                    .own_memory = !start_host,
                                    .device = dev,
                                    .rdma_writes_ordering =
                                        cudaGPUDirectRDMAWritesOrderingOwner,
                                    .ordering = LYNX_ORDER_COALESCED,
                                    .numa_node = start_numa};
  snprintf(in->dev.model, sizeof(in->dev.model), "%s", in->gpu.name);
  in->epoch = epoch;
  in->r.fd = -1;
  if (lynx_geom_init(&in->g, q, S, Z, 0))
    in->g.region_size = 0;
  if (start_host) {
    static int n_host;
    char name[32];
    snprintf(name, sizeof(name), "ut-gpu-host-%d-%d", (int)getpid(), n_host++);
    rc = ops->region_alloc(start_ta, &in->r, name, in->g.region_size);
    if (!rc)
      rc = lynx_region_format(&in->r, q, S, Z, 0, LYNX_ORDER_FENCED, epoch,
                              ACCEL);
    if (!rc)
      rc = ops->region_export(&in->r);
    if (rc) {
      ops->region_free(&in->r);
      return rc;
    }
  }
  l = (struct lynx_accel_launch){.acc = &in->dev,
                                 .name = "ut-gpu",
                                 .region = in->r.base,
                                 .tops = ops,
                                 .tagent = start_host ? start_ta
                                           : ops == T ? g_ta
                                                      : NULL,
                                 .app = echo_app,
                                 .app_config = start_config,
                                 .n_mqueues = q,
                                 .n_server = n_server,
                                 .slots = S,
                                 .slot_size = Z,
                                 .ordering = LYNX_ORDER_FENCED,
                                 .accel_id = ACCEL,
                                 .epoch = epoch,
                                 .work_us = 7,
                                 .gpu_threads = start_threads,
                                 .gpu_blocks = start_blocks,
                                 .gpu_idle_ns = start_idle_ns,
                                 .serve_until = &start_serve_until};
  rc = gpu_instance_start(&l, &in->r, &in->gi, in->err, sizeof(in->err));
  if (rc && start_host)
    ops->region_free(&in->r); /* the agent's, as instance.c does */
  if (!rc && fake_cuda_kernels() > n0)
    in->k = fake_cuda_kernel(fake_cuda_kernels() - 1);
  if (rc)
    fprintf(stderr, "(expected?) gpu_instance_start: %d %s\n", rc, in->err);
  return rc;
}

static uint8_t *dev_base(const struct inst *in) {
  return (uint8_t *)(uintptr_t)in->r.mem->dev_addr;
}

static void inst_connect(struct inst *in) {
  struct lynx_region_desc d;
  memset(&d, 0, sizeof(d));
  d.accel_id = ACCEL;
  snprintf(d.transport, sizeof(d.transport), "tcp");
  snprintf(d.locator, sizeof(d.locator), "%s", in->r.locator);
  d.region_size = in->g.region_size;
  d.epoch = in->epoch;
  d.n_mqueues = in->g.n_mqueues;
  d.slots = S;
  d.slot_size = Z;
  d.ordering = LYNX_ORDER_FENCED;
  d.key = in->r.key;
  assert_int_equal(T->connect(&d, &in->c), 0);
}

/* The frontend's request at RX position pos of mqueue q (one publishing
 * gather write), rung. */
static void request_bytes(struct inst *in, uint32_t q, uint32_t pos,
                          const void *msg, uint32_t len, uint32_t tag) {
  uint32_t poff = lynx_payload_off(Z, len);
  struct lynx_slot_meta meta = {len, tag, LYNX_ST_OK, (uint16_t)(poff / 16u),
                                lynx_seq_for(pos)};
  static const uint8_t zeros[Z];
  struct iovec iov[3] = {{(void *)msg, len},
                         {(void *)zeros, lynx_slot_cap(Z) - poff - len},
                         {&meta, sizeof(meta)}};
  uint64_t rx = lynx_slot_off(&in->g, lynx_rx_ring_off(&in->g, q), pos);
  assert_int_equal(
      in->c->ops->writev(in->c, rx + poff, iov, 3, LYNX_WR_PUBLISH), 0);
  assert_int_equal(in->c->ops->flush(in->c), 0);
}

static void request_at(struct inst *in, uint32_t q, uint32_t pos,
                       const char *msg, uint32_t tag) {
  request_bytes(in, q, pos, msg, (uint32_t)strlen(msg) + 1, tag);
}

/* The kernel's echo of msg under tag in TX slot bytes slot, position pos. */
static void echoed(const uint8_t *slot, uint32_t pos, const char *msg,
                   uint32_t tag) {
  struct lynx_slot_meta got;
  uint32_t len = (uint32_t)strlen(msg) + 1;
  memcpy(&got, slot + Z - LYNX_META_SIZE, sizeof(got));
  assert_int_equal(got.seq, lynx_seq_for(pos));
  assert_int_equal(got.tag, tag);
  assert_int_equal(got.len, len);
  assert_int_equal(got.status, LYNX_ST_OK);
  assert_memory_equal(slot + got.off16 * 16u, msg, len);
}

/* Waits (reads, up to 2 s) until TX slot pos of mqueue q is published for
 * pos: its bytes into slot (Z of them). */
static void tx_wait(struct inst *in, uint32_t q, uint32_t pos, uint8_t *slot) {
  uint64_t tx = lynx_slot_off(&in->g, lynx_tx_ring_off(&in->g, q), pos);
  uint64_t end = lynx_now_ns() + 2000000000ull, id;
  struct lynx_slot_meta got;
  do {
    assert_int_equal(in->c->ops->read(in->c, tx, slot, Z, 9), 0);
    assert_int_equal(in->c->ops->flush(in->c), 0);
    assert_int_equal(ut_poll_n(in->c, &id, 1), 1);
    memcpy(&got, slot + Z - LYNX_META_SIZE, sizeof(got));
    if (got.seq == lynx_seq_for(pos))
      break;
    usleep(500);
  } while (lynx_now_ns() < end);
}

/* request_at, then waits for the kernel's echo in the TX ring (reads). */
static void echo(struct inst *in, uint32_t q, uint32_t pos, const char *msg,
                 uint32_t tag) {
  uint8_t slot[Z];
  request_at(in, q, pos, msg, tag);
  tx_wait(in, q, pos, slot);
  echoed(slot, pos, msg, tag);
}

/* Waits until the fake counted want stream destructions (the transport's
 * server thread releases the memory after its last connection), then a
 * little longer for the chunks to reach the free list right after. */
static void wait_destroys(int want) {
  uint64_t end = lynx_now_ns() + 2000000000ull;
  while (__atomic_load_n(&fake.stream_destroys, __ATOMIC_SEQ_CST) < want &&
         lynx_now_ns() < end)
    usleep(1000);
  assert_int_equal(__atomic_load_n(&fake.stream_destroys, __ATOMIC_SEQ_CST),
                   want);
  usleep(50000);
}

/* Until the calls thread (cuda_calls.c) has made every call queued, as the
 * unregistration a stop queues, or 2 s. */
static void calls_settle(void) {
  uint64_t end = lynx_now_ns() + 2000000000ull;
  while (lynx__cuda_calls_pending() && lynx_now_ns() < end)
    usleep(1000);
  assert_int_equal(lynx__cuda_calls_pending(), 0);
}

static void counters(struct inst *in, uint64_t c[4]) {
  assert_int_equal(gpu_instance_counters(in->gi, &c[0], &c[1], &c[2], &c[3]),
                   0);
}

/* Counters until requests reach want (the kernel stores them right after
 * the response it published), or 2 s. */
static void counters_until(struct inst *in, uint64_t want, uint64_t c[4]) {
  uint64_t end = lynx_now_ns() + 2000000000ull;
  do {
    counters(in, c);
    if (c[0] >= want && c[1] >= want)
      return;
    usleep(1000);
  } while (lynx_now_ns() < end);
}

/* Closes the frontend, frees the region at the transport and drops the
 * agent's handle. */
static void inst_drop(struct inst *in) {
  ut_tconn_close(&in->c);
  in->r.ops->region_free(&in->r);
  gpu_instance_put(in->gi);
  in->gi = NULL;
}

/* stderr into a memfd while a call runs (the backend logs there). */
static int cap_fd = -1, cap_saved = -1;

static void cap_begin(void) {
  fflush(stderr);
  cap_fd = memfd_create("ut-stderr", 0);
  cap_saved = dup(2);
  assert_true(cap_fd >= 0 && cap_saved >= 0);
  dup2(cap_fd, 2);
}

static char *cap_end(void) {
  off_t n;
  char *s;
  fflush(stderr);
  dup2(cap_saved, 2);
  close(cap_saved);
  n = lseek(cap_fd, 0, SEEK_END);
  s = calloc(1, (size_t)n + 1);
  assert_non_null(s);
  assert_int_equal(pread(cap_fd, s, (size_t)n, 0), n);
  close(cap_fd);
  fputs(s, stderr);
  return s;
}

/* ---- 1. discovery ------------------------------------------------------ */

static void refused(const char *spec, int want, const char *why) {
  struct gpu_info *g = (void *)1;
  uint32_t n = 7;
  char err[256] = "";
  assert_int_equal(gpu_discover(spec, &g, &n, err, sizeof(err)), want);
  assert_null(g);
  assert_int_equal(n, 0);
  assert_contains(err, why);
}

static void test_discovery(void **state) {
  struct gpu_info *g = NULL;
  uint32_t n = 0;
  char err[256] = "";
  (void)state;
  fake_cuda_reset();
  fake_cuda_gpus(2);
  snprintf(fake.gpu[0].name, sizeof(fake.gpu[0].name), "NVIDIA A100-SXM4-80GB");
  snprintf(fake.gpu[0].pci_bus_id, sizeof(fake.gpu[0].pci_bus_id),
           "0000:17:00.0");
  fake.gpu[0].memory = 85899345920ull;
  fake.gpu[0].major = 8;
  fake.gpu[0].sms = 108;
  fake.gpu[0].gpudirect_rdma = 0;
  fake.gpu[0].writes_ordering = cudaGPUDirectRDMAWritesOrderingNone;
  /* as CUDA writes it, upper case; sysfs (PCI_SYSFS) says NUMA node 1 */
  snprintf(fake.gpu[1].pci_bus_id, sizeof(fake.gpu[1].pci_bus_id),
           "0000:C1:00.0");
  fake.gpu[1].memory = 85520809984ull;
  fake.gpu[1].writes_ordering = cudaGPUDirectRDMAWritesOrderingAllDevices;

  assert_int_equal(gpu_discover("all", &g, &n, err, sizeof(err)), 0);
  assert_int_equal(n, 2);
  assert_int_equal(g[0].device, 0);
  assert_string_equal(g[0].name, "NVIDIA A100-SXM4-80GB");
  assert_string_equal(g[0].pci_bus_id, "0000:17:00.0");
  assert_int_equal(g[0].memory, 85899345920ull);
  assert_int_equal(g[0].cc_major, 8);
  assert_int_equal(g[0].sms, 108);
  assert_int_equal(g[0].gpudirect_rdma, 0);
  assert_int_equal(g[0].rdma_writes_ordering,
                   cudaGPUDirectRDMAWritesOrderingNone);
  assert_int_equal(g[0].ordering, LYNX_ORDER_FENCED);
  assert_int_equal(g[1].device, 1);
  assert_string_equal(g[1].name, "Fake GPU 1");
  assert_string_equal(g[1].pci_bus_id, "0000:C1:00.0");
  /* the NUMA node of the GPU's PCI device, -1 where sysfs has none */
  assert_int_equal(g[0].numa_node, -1);
  assert_int_equal(g[1].numa_node, 1);
  assert_int_equal(g[1].memory, 85520809984ull);
  assert_int_equal(g[1].cc_major, 9);
  assert_int_equal(g[1].sms, 132);
  assert_int_equal(g[1].gpudirect_rdma, 1);
  assert_int_equal(g[1].rdma_writes_ordering,
                   cudaGPUDirectRDMAWritesOrderingAllDevices);
  assert_int_equal(g[1].ordering, LYNX_ORDER_COALESCED);
  free(g);

  /* "1" is GPU 1 alone; owner ordering is native ordering too */
  fake.gpu[1].writes_ordering = cudaGPUDirectRDMAWritesOrderingOwner;
  assert_int_equal(gpu_discover("1", &g, &n, err, sizeof(err)), 0);
  assert_int_equal(n, 1);
  assert_int_equal(g[0].device, 1);
  assert_string_equal(g[0].pci_bus_id, "0000:C1:00.0");
  assert_int_equal(g[0].ordering, LYNX_ORDER_COALESCED);
  free(g);
  assert_int_equal(gpu_discover("1,0", &g, &n, err, sizeof(err)), 0);
  assert_int_equal(n, 2);
  assert_int_equal(g[0].device, 1);
  assert_int_equal(g[1].device, 0);
  free(g);

  refused("0,0", -EINVAL, "GPU 0 named twice");
  refused("x", -EINVAL, "'x': expected 'all' or GPU ordinals");
  refused("", -EINVAL, "empty list");
  refused("0,", -EINVAL, "expected 'all' or GPU ordinals");
  refused("0,,1", -EINVAL, "expected 'all' or GPU ordinals");
  refused("-1", -EINVAL, "expected 'all' or GPU ordinals");
  refused("5", -ENODEV, "CUDA GPU 5 does not exist (this host has 2)");
  refused("0,2", -ENODEV, "CUDA GPU 2 does not exist");

  fake.err_properties = cudaErrorInvalidDevice;
  refused("0", -ENODEV, "CUDA GPU 0: cannot read its properties");
  fake.err_properties = cudaSuccess;

  /* modules load eagerly unless the operator said otherwise */
  unsetenv("CUDA_MODULE_LOADING");
  assert_int_equal(gpu_discover("0", &g, &n, err, sizeof(err)), 0);
  free(g);
  assert_string_equal(getenv("CUDA_MODULE_LOADING"), "EAGER");
  setenv("CUDA_MODULE_LOADING", "LAZY", 1);
  assert_int_equal(gpu_discover("0", &g, &n, err, sizeof(err)), 0);
  free(g);
  assert_string_equal(getenv("CUDA_MODULE_LOADING"), "LAZY");
  unsetenv("CUDA_MODULE_LOADING");

  /* below the build's lowest architecture (sm_80): refused at discovery,
   * not at the first launch, naming both */
  fake.gpu[0].major = 7;
  fake.gpu[0].minor = 5;
  refused("all", -ENODEV, "compute capability 7.5");
  refused("0", -ENODEV, "sm_80");
  fake.gpu[0].major = 8;
  fake.gpu[0].minor = 0;

  /* no driver, or one too old for the static runtime: the runtime says so
   * at the first call, and the message gives both CUDA versions */
  fake.err_device_count = cudaErrorInsufficientDriver;
  fake.driver_version = 12040;
  refused("all", -ENODEV, "no usable CUDA GPU");
  refused("all", -ENODEV, "cudaErrorInsufficientDriver");
  refused("all", -ENODEV, "the driver supports CUDA 12.4");
  refused("all", -ENODEV, "this build's runtime is CUDA 13.0");
  fake.driver_version = 0;
  refused("all", -ENODEV, "no NVIDIA driver answers, this build's");
  fake.err_device_count = cudaSuccess;
  fake_cuda_gpus(0);
  refused("all", -ENODEV, "no CUDA GPU on this host");
  refused("0", -ENODEV, "no CUDA GPU on this host");
  fake_cuda_gpus(GPUS);
}

/* ---- 2. an instance over tcp ------------------------------------------- */

static void test_instance_over_tcp(void **state) {
  struct inst in;
  const struct lynx_region_hdr *h;
  struct lynx_cuda_kctl *kc;
  cudaStream_t cs;
  int live0, magic_at = -1, ops0;
  uint64_t c[4];
  char *log;
  (void)state;
  fake_cuda_reset();
  live0 = fake_cuda_live();
  assert_int_equal(inst_start(&in, 0, T, 3, 2, EPOCH), 0);
  assert_non_null(in.gi);
  assert_non_null(in.k);
  /* the region is device memory: the transport reaches it only through
   * the instance's memory, never through r->base */
  assert_null(in.r.base);
  assert_non_null(in.r.mem);
  assert_string_equal(in.r.mem->kind, "cuda");
  assert_int_equal(in.r.mem->dev_addr % (64u * 1024u), 0);
  assert_int_equal(in.r.size, in.g.region_size);
  assert_int_equal(fake.mallocs, 2); /* region, control block */
  assert_int_equal(fake_cuda_live(), live0 + 2);
  assert_true(fake_cuda_is_live(dev_base(&in)));
  assert_true(fake_cuda_is_live(dev_base(&in) + in.g.region_size - 1));
  assert_int_equal(fake.sync_memops_ptr, in.r.mem->dev_addr);

  /* launched with blocks = min(n_server, resident) and what it was given */
  assert_int_equal(fake.launches, 1);
  assert_ptr_equal(in.k->l.region, dev_base(&in));
  assert_int_equal(in.k->l.n_mqueues, 3);
  assert_int_equal(in.k->l.n_server, 2);
  assert_int_equal(in.k->l.slots, S);
  assert_int_equal(in.k->l.slot_size, Z);
  assert_int_equal(in.k->l.blocks, 2);
  assert_int_equal(in.k->l.threads, 64);
  assert_int_equal(in.k->l.app, LYNX_CUDA_APP_ECHO);
  assert_int_equal(in.k->l.work_us, 7);
  assert_int_equal(in.k->device, 0);
  assert_true(fake_cuda_is_live(in.k->l.kctl));
  assert_false(fake_cuda_is_live(dev_base(&in)) &&
               (uint8_t *)in.k->l.kctl >= dev_base(&in) &&
               (uint8_t *)in.k->l.kctl < dev_base(&in) + in.g.region_size);

  /* the header, formatted in device memory */
  h = (const struct lynx_region_hdr *)dev_base(&in);
  assert_int_equal(h->magic, LYNX_REGION_MAGIC);
  assert_int_equal(h->layout_version, LYNX_LAYOUT_VERSION);
  assert_int_equal(h->ordering, LYNX_ORDER_FENCED);
  assert_int_equal(h->epoch, EPOCH);
  assert_int_equal(h->region_size, in.g.region_size);
  assert_int_equal(h->n_mqueues, 3);
  assert_int_equal(h->accel_id, ACCEL);

  /* zeroed, then the header, its magic last; everything on one stream,
   * the copy stream, which is not the kernel's */
  cs = fake.ops[0].stream;
  assert_non_null(cs);
  assert_ptr_not_equal(cs, in.k->stream);
  assert_true(fake.ops[0].memset);
  assert_true((const uint8_t *)fake.ops[0].dev <= dev_base(&in));
  assert_true((const uint8_t *)fake.ops[0].dev + fake.ops[0].len >=
              dev_base(&in) + in.g.region_size);
  for (int i = 0; i < fake.n_ops; i++) {
    const uint8_t *d = fake.ops[i].dev;
    assert_ptr_equal(fake.ops[i].stream, cs);
    if (fake.ops[i].memset || fake.ops[i].kind != cudaMemcpyHostToDevice ||
        d >= dev_base(&in) + sizeof(*h) || d + fake.ops[i].len <= dev_base(&in))
      continue;
    assert_int_equal(magic_at, -1); /* nothing touches the header after */
    if (d == dev_base(&in) && fake.ops[i].len == 4 &&
        fake.ops[i].word == LYNX_REGION_MAGIC)
      magic_at = i;
    else
      assert_ptr_equal(d, dev_base(&in) + 4);
  }
  assert_true(magic_at > 0);

  /* a frontend's requests through the real tcp transport, answered by the
   * kernel in device memory; each access a copy on the copy stream */
  inst_connect(&in);
  ops0 = fake.n_ops;
  echo(&in, 1, 0, "hello, GPU", 0xABCD0001u);
  echo(&in, 0, 0, "on mqueue 0", 0xABCD0002u);
  echo(&in, 1, 1, "again on 1", 0xABCD0003u);
  assert_true(fake_cuda_copies(ops0, NULL) >= 6);
  assert_int_equal(fake_cuda_copies(ops0, cs), fake_cuda_copies(ops0, NULL));
  assert_int_equal(fake_cuda_copies(0, in.k->stream), 0);
  assert_int_equal(fake.bad_copies, 0);
  assert_null(in.r.base);

  /* counters: per block, summed */
  counters_until(&in, 3, c);
  assert_int_equal(c[0], 3);
  assert_int_equal(c[1], 3);
  kc = in.k->l.kctl;
  assert_int_equal(kc->blocks[0].requests, 1);
  assert_int_equal(kc->blocks[1].requests, 2);
  kc->blocks[0].drops = 3;
  kc->blocks[1].drops = 4;
  kc->blocks[0].bad = 5;
  kc->blocks[1].bad = 6;
  counters(&in, c);
  assert_int_equal(c[2], 7);
  assert_int_equal(c[3], 11);

  /* GPU-stamped latency: every request in both histograms, summed over
   * the blocks; service includes the 7 us of emulated work */
  {
    struct lynx_lat lat;
    const struct lynx_lat *kl =
        (const struct lynx_lat *)((const uint8_t *)kc +
                                  lynx_cuda_kctl_lat_off(2));
    uint64_t end = lynx_now_ns() + 2000000000ull;
    do { /* the service stamp follows the counters' store */
      assert_int_equal(gpu_instance_latency(in.gi, &lat), 0);
    } while (lynx_lat_count(&lat.service) < 3 && lynx_now_ns() < end &&
             usleep(1000) == 0);
    assert_int_equal(lynx_lat_count(&lat.queue), 3);
    assert_int_equal(lynx_lat_count(&lat.service), 3);
    assert_int_equal(lynx_lat_count(&kl[0].service), 1);
    assert_int_equal(lynx_lat_count(&kl[1].service), 2);
    assert_true(lat.service.sum_ns >= 3 * 7000ull);
    assert_true(lynx_lat_quantile(&lat.service, NULL, 0.5, NULL) >= 7000);
  }
  assert_int_equal(fake.frees, 0);
  assert_int_equal(fake.blocking_calls, 0);
  assert_int_equal(fake.device_syncs, 0);

  /* a stop that works is not reported as a kernel that exited by itself */
  cap_begin();
  assert_int_equal(gpu_instance_stop(in.gi), 0);
  log = cap_end();
  assert_null(strstr(log, "exited without being asked"));
  free(log);

  inst_drop(&in);
  wait_destroys(2);
  assert_int_equal(fake.frees, 0);
  gpu_shutdown();
  assert_int_equal(fake.frees, 2);
  assert_int_equal(fake.bad_frees, 0);
  assert_int_equal(fake_cuda_live(), live0);
}

/* ---- 3. stop, the free list, shutdown -------------------------------- */

static void test_stop_reuse_shutdown(void **state) {
  struct inst a, b;
  uint8_t *region;
  void *kctl;
  int live0, ops0, stop_at = -1;
  uint64_t c[4], t0;
  (void)state;
  fake_cuda_reset();
  live0 = fake_cuda_live();
  assert_int_equal(inst_start(&a, 0, T, 2, 2, EPOCH), 0);
  region = dev_base(&a);
  kctl = a.k->l.kctl;
  inst_connect(&a);
  echo(&a, 0, 0, "before the stop", 7);
  counters_until(&a, 1, c);

  ops0 = fake.n_ops;
  t0 = lynx_now_ns();
  assert_int_equal(gpu_instance_stop(a.gi), 0);
  assert_true(lynx_now_ns() - t0 < ut_scaled(1000000000ull));
  /* the stop word went with a copy on the copy stream */
  for (int i = ops0; i < fake.n_ops; i++)
    if (!fake.ops[i].memset && fake.ops[i].kind == cudaMemcpyHostToDevice &&
        fake.ops[i].dev == &a.k->l.kctl->stop && fake.ops[i].len == 4 &&
        fake.ops[i].word == 1)
      stop_at = i;
  assert_true(stop_at >= 0);
  assert_ptr_equal(fake.ops[stop_at].stream, fake.ops[0].stream);
  assert_int_equal(a.k->l.kctl->stop, 1);
  assert_false(a.k->running);
  assert_int_equal(a.k->l.kctl->exited, a.k->l.kctl->started);
  /* final counters stay readable, without touching the device again */
  ops0 = fake.n_ops;
  counters(&a, c);
  assert_int_equal(c[0], 1);
  assert_int_equal(c[1], 1);
  assert_int_equal(fake.n_ops, ops0);
  assert_int_equal(gpu_instance_stop(a.gi), 0); /* twice: no-op */

  /* freed: memory to the free list, not cudaFree */
  inst_drop(&a);
  wait_destroys(2);
  assert_int_equal(fake.frees, 0);
  assert_true(fake_cuda_is_live(region));
  assert_true(fake_cuda_is_live(kctl));

  /* the next instance of that size reuses it, zeroed again */
  assert_int_equal(inst_start(&b, 0, T, 2, 2, EPOCH + 1), 0);
  assert_int_equal(fake.mallocs, 2);
  assert_ptr_equal(dev_base(&b), region);
  assert_ptr_equal(b.k->l.kctl, kctl);
  assert_int_equal(((struct lynx_region_hdr *)region)->epoch, EPOCH + 1);
  inst_connect(&b);
  echo(&b, 0, 0, "reused memory", 8);
  echo(&b, 1, 0, "reused memory 2", 9);
  counters_until(&b, 2, c);
  assert_int_equal(c[0], 2); /* nothing left from the first instance */
  assert_int_equal(gpu_instance_stop(b.gi), 0);
  inst_drop(&b);
  wait_destroys(4);
  assert_int_equal(fake.frees, 0);
  assert_int_equal(fake.blocking_calls, 0);

  /* at exit: every chunk freed exactly once */
  gpu_shutdown();
  assert_int_equal(fake.frees, 2);
  assert_int_equal(fake.bad_frees, 0);
  assert_false(fake_cuda_is_live(region));
  assert_false(fake_cuda_is_live(kctl));
  assert_int_equal(fake_cuda_live(), live0);
  gpu_shutdown();
  assert_int_equal(fake.frees, 2);
}

/* ---- 4. a hung kernel -------------------------------------------------- */

static void test_hung_kernel(void **state) {
  struct inst a, b;
  int lost = -1, failed = -1;
  char err[256];
  uint64_t t0, ms, c[4];
  uint8_t *region;
  void *kctl;
  (void)state;
  fake_cuda_reset();
  fake.hang_next = 1;
  assert_int_equal(inst_start(&a, 1, T, 2, 2, EPOCH), 0);
  assert_true(a.k->hang);
  region = dev_base(&a);
  kctl = a.k->l.kctl;
  t0 = lynx_now_ns();
  assert_int_equal(gpu_instance_stop(a.gi), -ETIMEDOUT);
  ms = (lynx_now_ns() - t0) / 1000000u;
  assert_true(ms >= STOP_WAIT_MS - 10);
  assert_true(ms < STOP_WAIT_MS + 2000);
  assert_true(a.k->running);
  gpu_health(&a.gpu, &lost, &failed, err, sizeof(err));
  assert_int_equal(lost, 0);
  assert_int_equal(failed, 1); /* only a context reset clears a hung kernel */
  assert_contains(err, "did not stop");
  t0 = lynx_now_ns();
  assert_int_equal(gpu_instance_stop(a.gi), -ETIMEDOUT); /* no second wait */
  assert_true(lynx_now_ns() - t0 < ut_scaled(100000000ull));
  counters(&a, c); /* still readable */

  /* its memory is kept: not freed, not reused */
  ut_hung_gi[0] = a.gi;
  inst_drop(&a);
  assert_int_equal(fake.frees, 0);
  assert_true(fake_cuda_is_live(region));
  assert_true(fake_cuda_is_live(kctl));
  assert_int_equal(inst_start(&b, 1, T, 2, 2, EPOCH), 0);
  assert_int_equal(fake.mallocs, 4);
  assert_ptr_not_equal(dev_base(&b), region);
  assert_ptr_not_equal(b.k->l.kctl, kctl);
  assert_int_equal(gpu_instance_stop(b.gi), 0);
  inst_drop(&b);
  wait_destroys(2);

  /* at exit: never a cudaFree there (it would wait for the hung kernel
   * forever), neither of the hung region nor of what is on the list */
  gpu_shutdown();
  assert_int_equal(fake.blocking_calls, 0);
  assert_int_equal(fake.frees, 0);
  assert_true(fake_cuda_is_live(region));
  assert_true(fake_cuda_is_live(kctl));
  assert_int_equal(fake.bad_frees, 0);
}

/* ---- host memory mapped into the GPU (--region-mem host) ------------ */

/* A frontend over shm reaches the GPU's region (host memory mapped into
 * the GPU) and the kernel answers in place; stop unmaps it from the GPU
 * before the agent frees it. */
static void test_host_region_shm(void **state) {
  const struct lynx_transport_ops *shm = lynx_transport_find("shm");
  struct lynx_transport_agent *ta = NULL;
  struct lynx_region_desc d;
  struct inst in;
  char err[128];
  uint64_t c[4];
  int live0;
  (void)state;
  fake_cuda_reset();
  live0 = fake_cuda_live();
  assert_int_equal(shm->agent_create(&(struct lynx_transport_opts){0}, &ta, err,
                                     sizeof(err)),
                   0);
  start_host = 1;
  start_ta = ta;
  start_numa = 0; /* this machine's one node */
  assert_int_equal(inst_start(&in, 0, shm, 3, 3, EPOCH), 0);
  start_numa = -1;
  /* what the GPU maps is placed on its NUMA node (a preference) */
  {
    int mode = -1;
    unsigned long mask[16] = {0};
    assert_int_equal(syscall(SYS_get_mempolicy, &mode, mask, 8 * sizeof(mask),
                             in.k->l.region, MPOL_F_ADDR),
                     0);
    assert_int_equal(mode, MPOL_PREFERRED);
    assert_int_equal(mask[0], 1);
  }
  /* registered once, mapped, portable; the kernel polls it in place; only
   * the control block is GPU memory */
  assert_int_equal(fake.host_registers, 1);
  assert_int_equal(fake.host_register_flags,
                   cudaHostRegisterMapped | cudaHostRegisterPortable);
  assert_int_equal(fake_cuda_host_registered(), 1);
  /* what the GPU maps is the backend's own mapping of the region's pages,
   * so its unregistration may come after the transport unmapped its own */
  assert_ptr_not_equal(in.k->l.region, in.r.base);
  /* its readers are CPU threads: a publish is the I/O thread's release,
   * no writer's system fence (lynx_dev.cuh lynx_block_commit) */
  assert_int_equal(in.k->l.thread_readers, 1);
  assert_memory_equal(in.k->l.region, in.r.base, in.g.region_size);
  in.r.base[in.g.region_size - 1] = 0x5c;
  assert_int_equal(((uint8_t *)in.k->l.region)[in.g.region_size - 1], 0x5c);
  in.r.base[in.g.region_size - 1] = 0;
  assert_null(in.r.mem);
  assert_int_equal(fake.mallocs, 1);
  assert_int_equal(fake_cuda_live(), live0 + 1);
  /* no copy moves requests: the frontend's stores are the kernel's input */
  memset(&d, 0, sizeof(d));
  d.accel_id = ACCEL;
  snprintf(d.transport, sizeof(d.transport), "shm");
  snprintf(d.locator, sizeof(d.locator), "%s", in.r.locator);
  d.region_size = in.g.region_size;
  d.epoch = EPOCH;
  d.n_mqueues = 3;
  d.slots = S;
  d.slot_size = Z;
  d.ordering = LYNX_ORDER_FENCED;
  assert_int_equal(shm->connect(&d, &in.c), 0);
  {
    int copies0 = fake_cuda_copies(0, NULL);
    echo(&in, 0, 0, "host-mapped", 11);
    echo(&in, 2, 0, "third mqueue", 12);
    echo(&in, 0, 1, "again", 13);
    assert_int_equal(fake_cuda_copies(0, NULL), copies0);
  }
  counters_until(&in, 3, c);
  assert_int_equal(c[0], 3);
  assert_int_equal(c[1], 3);
  /* stop: the kernel is gone before its memory leaves the GPU */
  assert_int_equal(gpu_instance_stop(in.gi), 0);
  calls_settle();
  assert_int_equal(fake.host_unregisters, 1);
  assert_int_equal(fake_cuda_host_registered(), 0);
  assert_int_equal(fake.unmapped_live, 0);
  inst_drop(&in);
  assert_int_equal(fake.host_unregisters, 1); /* not twice */
  assert_int_equal(fake.bad_unregisters, 0);
  assert_int_equal(fake.blocking_calls, 0);
  assert_int_equal(fake.bad_copies, 0);
  start_host = 0;
  start_ta = NULL;
  shm->agent_destroy(ta);
}

/* Over tcp the agent's server thread serves the host region with plain
 * loads and stores: no copy per request either. A registration the GPU
 * refuses, a device pointer it will not give, a device lost while the
 * kernel runs and a kernel that does not stop each leave nothing mapped
 * that should not be, and free nothing the kernel may still touch. */
static void test_host_region_tcp_failures(void **state) {
  struct inst in;
  uint64_t c[4];
  int ops0, n0;
  (void)state;
  fake_cuda_reset();
  start_host = 1;
  start_ta = g_ta;
  assert_int_equal(inst_start(&in, 1, T, 2, 2, EPOCH), 0);
  assert_non_null(in.r.base);
  inst_connect(&in);
  ops0 = fake.n_ops;
  echo(&in, 1, 0, "over tcp", 21);
  assert_int_equal(fake_cuda_copies(ops0, NULL), 0);
  assert_int_equal(gpu_instance_stop(in.gi), 0);
  inst_drop(&in);
  calls_settle();
  assert_int_equal(fake_cuda_host_registered(), 0);

  /* the GPU refuses the registration: nothing launched, nothing left */
  fake_cuda_reset();
  n0 = fake_cuda_kernels();
  fake.err_host_register = cudaErrorHostMemoryAlreadyRegistered;
  assert_int_equal(inst_start(&in, 1, T, 2, 2, EPOCH), -EIO);
  assert_contains(in.err, "cannot map a");
  assert_contains(in.err, "host region into the GPU");
  assert_int_equal(fake_cuda_kernels(), n0);
  assert_int_equal(fake.stream_creates, fake.stream_destroys);
  assert_int_equal(fake_cuda_host_registered(), 0);
  fake.err_host_register = cudaSuccess;
  /* registered, but no device address: registration undone */
  fake.err_host_devptr = cudaErrorInvalidValue;
  assert_int_equal(inst_start(&in, 1, T, 2, 2, EPOCH), -EIO);
  calls_settle();
  assert_int_equal(fake.host_registers, 1);
  assert_int_equal(fake.host_unregisters, 1);
  assert_int_equal(fake_cuda_host_registered(), 0);
  assert_int_equal(fake_cuda_kernels(), n0);
  fake.err_host_devptr = cudaSuccess;

  /* the device is lost mid-run: stop finds the kernel gone, unmaps */
  assert_int_equal(inst_start(&in, 1, T, 2, 2, EPOCH), 0);
  fake_cuda_crash(in.k, cudaErrorDevicesUnavailable);
  counters(&in, c);
  assert_int_equal(gpu_instance_stop(in.gi), 0);
  calls_settle();
  assert_int_equal(fake_cuda_host_registered(), 0);
  assert_int_equal(fake.unmapped_live, 0);
  inst_drop(&in);

  /* a kernel that does not stop keeps its host region mapped (and its
   * pages pinned) for good: unmapping it would fault the kernel */
  fake.hang_next = 1;
  assert_int_equal(inst_start(&in, 1, T, 2, 2, EPOCH), 0);
  assert_int_equal(gpu_instance_stop(in.gi), -ETIMEDOUT);
  assert_int_equal(fake_cuda_host_registered(), 1);
  ut_hung_gi[1] = in.gi;
  gpu_instance_put(in.gi);
  assert_int_equal(fake_cuda_host_registered(), 1);
  assert_int_equal(fake.unmapped_live, 0);
  /* here the fake kernel thread would touch freed memory once the region
   * goes: end it first (a real GPU keeps the pinned pages) */
  fake_cuda_crash(in.k, cudaErrorLaunchFailure);
  ut_tconn_close(&in.c);
  in.r.ops->region_free(&in.r);
  assert_int_equal(fake.bad_unregisters, 0);
  start_host = 0;
  start_ta = NULL;
}

/* A driver that makes page-locking and allocation wait for the device
 * (fake.block_calls; make gpu-prove's probe says whether a real one does)
 * never holds up the agent's thread: a stop returns at once with its
 * unregistration queued, a start that needs such a call while another
 * instance's kernel runs fails within CALL_WAIT_MS saying why, and once
 * the GPU is free every queued call is made, the late ones undone (nothing
 * left registered; memory to the pool, reused). */
struct stop_arg {
  struct gpu_instance *gi;
  int rc, done;
};

static void *stop_thread(void *arg) {
  struct stop_arg *a = arg;
  a->rc = gpu_instance_stop(a->gi);
  __atomic_store_n(&a->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

static void test_calls_off_agent_thread(void **state) {
  const struct lynx_transport_ops *shm = lynx_transport_find("shm");
  struct lynx_transport_agent *ta = NULL;
  struct inst a, b, c, d;
  struct stop_arg sa;
  pthread_t t;
  uint64_t t0, end;
  char err[128];
  size_t bytes;
  int n0;
  (void)state;
  fake_cuda_reset();
  n0 = fake_cuda_kernels();
  assert_int_equal(shm->agent_create(&(struct lynx_transport_opts){0}, &ta, err,
                                     sizeof(err)),
                   0);
  start_host = 1;
  start_ta = ta;
  assert_int_equal(inst_start(&a, 0, shm, 2, 2, EPOCH), 0);
  assert_int_equal(inst_start(&b, 0, shm, 2, 2, EPOCH), 0);
  __atomic_store_n(&fake.block_calls, 1, __ATOMIC_RELEASE);

  /* stop a while b's kernel runs: a's unregistration would wait for b */
  sa = (struct stop_arg){.gi = a.gi};
  assert_int_equal(pthread_create(&t, NULL, stop_thread, &sa), 0);
  end = lynx_now_ns() + 2000000000ull;
  while (!__atomic_load_n(&sa.done, __ATOMIC_ACQUIRE) && lynx_now_ns() < end)
    usleep(1000);
  if (!__atomic_load_n(&sa.done, __ATOMIC_ACQUIRE)) {
    __atomic_store_n(&fake.block_calls, 0, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    fail_msg("gpu_instance_stop waited for another instance's kernel");
  }
  pthread_join(t, NULL);
  assert_int_equal(sa.rc, 0);
  assert_int_equal(fake_cuda_host_registered(), 2); /* a's, queued */
  assert_int_equal(lynx__cuda_calls_pending(), 1);
  inst_drop(&a); /* the transport unmaps its mapping; ours stays */

  /* a start that needs a registration now fails, in bounded time */
  t0 = lynx_now_ns();
  assert_int_equal(inst_start(&c, 0, shm, 2, 2, EPOCH), -EBUSY);
  assert_true(lynx_now_ns() - t0 < 1500000000ull);
  assert_contains(c.err, "cudaHostRegister");
  assert_contains(c.err, "did not return within 200 ms");
  /* and one that needs device memory the pool lacks */
  start_host = 0;
  start_ta = NULL;
  t0 = lynx_now_ns();
  /* 1,000 mqueues: a region no earlier case left in the pool */
  assert_int_equal(inst_start(&d, 0, T, 1000, 8, EPOCH), -EBUSY);
  assert_true(lynx_now_ns() - t0 < 1500000000ull);
  assert_contains(d.err, "cannot allocate a");
  assert_contains(d.err, "did not return within 200 ms");
  assert_int_equal(fake_cuda_kernels(), n0 + 2); /* neither launched */

  /* b stops: every queued call is made; the late ones undone */
  assert_int_equal(gpu_instance_stop(b.gi), 0);
  calls_settle();
  assert_true(fake.blocked_calls >= 1);
  assert_int_equal(fake_cuda_host_registered(), 0);
  assert_int_equal(fake.bad_unregisters, 0);
  assert_int_equal(fake.unmapped_live, 0);
  b.r.ops->region_free(&b.r);
  gpu_instance_put(b.gi);
  /* the late region allocation went to the pool: the same start takes it
   * from there (cudaMalloc gives no more than a control block) */
  bytes = fake.malloc_bytes;
  assert_int_equal(inst_start(&d, 0, T, 1000, 8, EPOCH), 0);
  assert_true(fake.malloc_bytes - bytes < d.g.region_size);
  assert_int_equal(gpu_instance_stop(d.gi), 0);
  d.r.ops->region_free(&d.r);
  gpu_instance_put(d.gi);
  __atomic_store_n(&fake.block_calls, 0, __ATOMIC_RELEASE);
  assert_int_equal(fake.blocking_calls, 0);
  shm->agent_destroy(ta);
}

/* ---- 5. health --------------------------------------------------------- */

/* How many blocks the kernel gets: one per mqueue up to one per SM (132
 * on the fake GPU), never fewer than 64 mqueues a block, never more than
 * stay resident; --gpu-blocks overrides within those bounds. */
static uint32_t blocks_for(uint32_t n_server, uint32_t blocks, int want_rc) {
  struct inst in;
  uint32_t got = 0;
  start_blocks = blocks;
  assert_int_equal(inst_start(&in, 0, T, n_server, n_server, 1), want_rc);
  start_blocks = 0;
  if (want_rc)
    return 0;
  got = in.k->l.blocks;
  assert_int_equal(gpu_instance_stop(in.gi), 0);
  inst_drop(&in);
  return got;
}

static void test_blocks(void **state) {
  (void)state;
  fake.resident = 2000;
  assert_int_equal(blocks_for(4, 0, 0), 4);          /* a block each */
  assert_int_equal(blocks_for(200, 0, 0), 132);      /* one per SM */
  assert_int_equal(blocks_for(1024, 0, 0), 132);     /* 8 mqueues a block */
  assert_int_equal(blocks_for(200, 4, 0), 4);        /* 50 a block */
  assert_int_equal(blocks_for(4, 16, 0), 4);         /* none idles */
  assert_int_equal(blocks_for(200, 3, -EINVAL), 0);  /* 67 a block */
  fake.resident = 8;                                 /* 8 blocks resident */
  assert_int_equal(blocks_for(200, 0, 0), 8);        /* as many as fit */
  assert_int_equal(blocks_for(1024, 0, -EINVAL), 0); /* 16 needed */
  assert_int_equal(blocks_for(200, 9, -EINVAL), 0);
}

/* Residency is confirmed after the launch: blocks the occupancy query
 * promised but the GPU cannot hold beside the kernels it already runs
 * (fake.capacity below fake.resident: another process's kernels, a
 * smaller carveout) do not start, and a start whose blocks do not all
 * begin within RESIDENT_WAIT_MS fails, saying how many did, while the
 * instance already there keeps serving. The failed kernel is told to
 * stop: its waiting blocks start as SMs free up (its own that ran, or
 * another kernel's), see the stop and return. */
static void test_residency(void **state) {
  struct inst a, b;
  uint64_t c[4];
  char *log;
  int rc, n0;
  (void)state;
  fake_cuda_reset();
  n0 = fake_cuda_kernels(); /* earlier cases' (all cases in one process) */
  fake.resident = 8;        /* what the query says of an empty GPU */
  fake.capacity = 6;        /* what it holds */
  start_blocks = 4;
  assert_int_equal(inst_start(&a, 0, T, 8, 8, EPOCH), 0);
  assert_int_equal(a.k->resident, 4);
  assert_int_equal(a.k->l.kctl->started, 4);
  inst_connect(&a);
  echo(&a, 0, 0, "first instance", 5);

  /* 4 more asked, 2 fit: refused, with the count; once its 2 blocks
   * return, the 2 waiting ones run and return too */
  cap_begin();
  rc = inst_start(&b, 0, T, 8, 8, EPOCH + 1);
  log = cap_end();
  assert_int_equal(rc, -EBUSY);
  assert_contains(b.err, "only 2 of the 4 blocks");
  assert_contains(b.err, "GPU 0");
  assert_contains(log, "only 2 of the 4 blocks");
  free(log);
  assert_int_equal(fake_cuda_kernels(), n0 + 2);
  assert_int_equal(fake_cuda_kernel(n0 + 1)->l.kctl->stop, 1);
  assert_false(fake_cuda_kernel(n0 + 1)->running);
  assert_int_equal(fake_cuda_kernel(n0 + 1)->l.kctl->exited, 4);

  /* none fits beside the first: refused; its kernel waits for SMs, so
   * its memory is kept (a warning says so), and it ends once the first
   * instance stops */
  fake.capacity = 4;
  cap_begin();
  rc = inst_start(&b, 0, T, 8, 8, EPOCH + 2);
  log = cap_end();
  start_blocks = 0;
  assert_int_equal(rc, -EBUSY);
  assert_contains(b.err, "only 0 of the 4 blocks");
  assert_contains(log, "memory is kept");
  free(log);
  assert_int_equal(fake_cuda_kernels(), n0 + 3);
  assert_true(fake_cuda_kernel(n0 + 2)->running);

  /* the first instance is untouched */
  echo(&a, 1, 0, "still served", 6);
  counters_until(&a, 2, c);
  assert_int_equal(c[1], 2);
  assert_int_equal(gpu_instance_stop(a.gi), 0);
  for (int i = 0; i < 2000 && fake_cuda_kernel(n0 + 2)->running; i++)
    usleep(1000);
  assert_false(fake_cuda_kernel(n0 + 2)->running);
  inst_drop(&a);
}

/* The budget: the occupancy query speaks of an empty GPU, so the blocks
 * of this agent's running kernels are taken from it before the next
 * start picks its blocks; one that asks for more than is left is refused
 * before any launch, saying what the instances there hold, auto takes what
 * is left, and a stopped kernel's blocks come back. */
static void test_block_budget(void **state) {
  struct inst a, b, c;
  int launches;
  (void)state;
  fake_cuda_reset();
  fake.resident = 8;
  start_blocks = 6;
  assert_int_equal(inst_start(&a, 0, T, 8, 8, EPOCH), 0);
  /* 4 asked, 2 left: refused before a launch */
  launches = fake.launches;
  start_blocks = 4;
  assert_int_equal(inst_start(&b, 0, T, 8, 8, EPOCH + 1), -EINVAL);
  assert_contains(b.err, "6 of GPU 0's 8 resident blocks are held");
  assert_int_equal(fake.launches, launches);
  /* auto takes the 2 left */
  start_blocks = 0;
  assert_int_equal(inst_start(&b, 0, T, 8, 8, EPOCH + 2), 0);
  assert_int_equal(b.k->l.blocks, 2);
  assert_int_equal(b.k->resident, 2);
  /* what the agent registers and reports in every heartbeat (accel.h
   * blocks: AccelInfo.resident_blocks, AccelCounters.blocks_held) */
  {
    uint32_t resident = 0, held = 0;
    assert_int_equal(lynx_accel_cuda.blocks(&a.dev, 64, &resident, &held), 0);
    assert_int_equal(resident, 8);
    assert_int_equal(held, 8);
  }
  /* none left: refused */
  assert_int_equal(inst_start(&c, 0, T, 8, 8, EPOCH + 3), -EINVAL);
  assert_contains(c.err, "8 of GPU 0's 8 resident blocks are held");
  /* another GPU's budget is its own */
  assert_int_equal(inst_start(&c, 1, T, 8, 8, EPOCH + 4), 0);
  assert_int_equal(c.k->l.blocks, 8);
  /* the first stops: its 6 come back */
  assert_int_equal(gpu_instance_stop(a.gi), 0);
  inst_drop(&a);
  {
    uint32_t resident = 0, held = 0;
    assert_int_equal(lynx_accel_cuda.blocks(&b.dev, 64, &resident, &held), 0);
    assert_int_equal(held, 2);
  }
  start_blocks = 6;
  assert_int_equal(inst_start(&a, 0, T, 8, 8, EPOCH + 5), 0);
  start_blocks = 0;
  for (struct inst *in = &a; in; in = in == &a ? &b : in == &b ? &c : NULL) {
    assert_int_equal(gpu_instance_stop(in->gi), 0);
    inst_drop(in);
  }
}

/* The clock offset a deadline is converted with: the largest (tightest)
 * lower bound of a 10 s window, less 100 ppm of the time since that
 * sample, so a GPU clock running slow against the host's cannot make a
 * converted deadline pass late. */
static void test_clock_drift(void **state) {
  struct gpu_instance gi;
  const uint64_t t0 = 1000000000000ull, s = 1000000000ull;
  (void)state;
  memset(&gi, 0, sizeof(gi));
  lynx__cuda_clock_sample(&gi, t0 + 5000, t0); /* offset 5,000 ns */
  assert_int_equal(gi.gt_off, 5000);
  /* less one step of the timer: 1 us while its step is not known */
  assert_int_equal(lynx__cuda_clock_offset(&gi, t0), 5000 - 1000);
  /* a smaller sample within the window: the largest is kept */
  lynx__cuda_clock_sample(&gi, t0 + s + 4000, t0 + s);
  assert_int_equal(gi.gt_off, 5000);
  /* 5 s on: 500 us of allowance (100 ppm) */
  assert_int_equal(lynx__cuda_clock_offset(&gi, t0 + 5 * s),
                   5000 - 500000 - 1000);
  /* past the window a new sample replaces the kept one */
  lynx__cuda_clock_sample(&gi, t0 + 11 * s + 3000, t0 + 11 * s);
  assert_int_equal(gi.gt_off, 3000);
  assert_int_equal(lynx__cuda_clock_offset(&gi, t0 + 11 * s), 3000 - 1000);
}

/* %globaltimer's step, from the readings' differences (their greatest
 * common divisor once 3 are seen): a coarse timer's readings lag the true
 * time by up to a step, which the lease fence gives up; a fine timer's
 * step costs it next to nothing. The fake's timer moves in 1 us steps as
 * some GPUs' do (fake.timer_step_ns). */
static void test_clock_step(void **state) {
  struct gpu_instance gi;
  const uint64_t t0 = 1000000000000ull;
  const uint64_t fine[] = {t0 + 32, t0 + 32 * 3001, t0 + 32 * 9000,
                           t0 + 32 * 9017};
  struct inst in;
  struct lynx_cuda_kctl h;
  uint64_t step;
  (void)state;
  memset(&gi, 0, sizeof(gi));
  for (int i = 0; i < 4; i++) {
    lynx__cuda_clock_sample(&gi, fine[i] + 5000, fine[i]);
    if (i < 3)
      assert_int_equal(lynx__cuda_clock_step(&gi), 0); /* not yet known */
  }
  assert_int_equal(lynx__cuda_clock_step(&gi), 32);
  assert_int_equal(lynx__cuda_clock_offset(&gi, fine[0]), 5000 - 32);
  /* a running kernel's readings on a coarse timer */
  fake_cuda_reset();
  fake.timer_step_ns = 1000;
  start_serve_until = lynx_now_ns() + 60000000000ull;
  assert_int_equal(inst_start(&in, 0, T, 2, 2, EPOCH), 0);
  for (int i = 0; i < 6; i++) {
    usleep(2000);
    pthread_mutex_lock(&in.gi->lock);
    assert_int_equal(lynx__cuda_kctl_header(in.gi, &h), cudaSuccess);
    pthread_mutex_unlock(&in.gi->lock);
    assert_int_equal(h.now_gt % 1000, 0);
  }
  step = lynx__cuda_clock_step(in.gi);
  assert_true(step >= 1000 && step % 1000 == 0);
  start_serve_until = UINT64_MAX;
  fake.timer_step_ns = 0;
  assert_int_equal(gpu_instance_stop(in.gi), 0);
  inst_drop(&in);
}

/* An idle block's longest sleep is the agent's --gpu-idle-ns (500 ns by
 * default: at most about 1 us added to a request that finds its block
 * asleep; it was a fixed 20 us), and 0 (never sleeps) goes through. */
static void test_idle_backoff(void **state) {
  struct inst a;
  (void)state;
  fake_cuda_reset();
  for (int i = 0; i < 3; i++) {
    static const uint32_t v[] = {500, 0, 1000000};
    start_idle_ns = v[i];
    assert_int_equal(inst_start(&a, 0, T, 2, 2, EPOCH + (uint64_t)i), 0);
    assert_int_equal(a.k->l.idle_ns, v[i]);
    assert_int_equal(gpu_instance_stop(a.gi), 0);
    inst_drop(&a);
  }
  start_idle_ns = 500;
}

static void test_health(void **state) {
  struct inst a;
  struct gpu_info g = {.device = 3};
  int lost = -1, failed = -1;
  char err[256];
  uint64_t c[4];
  (void)state;
  fake_cuda_reset();

  /* sticky: the kernel died of an illegal address */
  assert_int_equal(inst_start(&a, 2, T, 2, 2, EPOCH), 0);
  gpu_health(&a.gpu, &lost, &failed, err, sizeof(err));
  assert_int_equal(lost, 0);
  assert_int_equal(failed, 0);
  assert_string_equal(err, "");
  fake_cuda_crash(a.k, cudaErrorIllegalAddress);
  counters(&a, c);
  gpu_health(&a.gpu, &lost, &failed, err, sizeof(err));
  assert_int_equal(lost, 0);
  assert_int_equal(failed, 1);
  assert_contains(err, "persistent kernel: cudaErrorIllegalAddress");
  assert_int_equal(gpu_instance_stop(a.gi), 0); /* dead, not hung */
  inst_drop(&a);
  wait_destroys(2);

  /* lost: the device query says there is no device */
  fake.err_attr[3] = cudaErrorNoDevice;
  gpu_health(&g, &lost, &failed, err, sizeof(err));
  assert_int_equal(lost, 1);
  assert_int_equal(failed, 0);
  assert_contains(err, "device query: cudaErrorNoDevice");
  fake.err_attr[3] = cudaSuccess;

  /* not sticky: recorded, the device is fine */
  assert_int_equal(inst_start(&a, 4, T, 2, 2, EPOCH), 0);
  fake.err_memcpy_once = cudaErrorInvalidValue;
  assert_int_equal(gpu_instance_counters(a.gi, &c[0], &c[1], &c[2], &c[3]),
                   -EIO);
  gpu_health(&a.gpu, &lost, &failed, err, sizeof(err));
  assert_int_equal(lost, 0);
  assert_int_equal(failed, 0);
  assert_contains(err, "reading counters: cudaErrorInvalidValue");
  counters(&a, c);
  assert_int_equal(gpu_instance_stop(a.gi), 0);
  inst_drop(&a);
  wait_destroys(4);
  assert_int_equal(fake.blocking_calls, 0);
  gpu_shutdown();
  assert_int_equal(fake.bad_frees, 0);
}

/* ---- 6. never a device-wide synchronisation -------------------------- */

static void test_no_device_sync(void **state) {
  struct inst a, b, c;
  int live0;
  uint8_t *b_region;
  (void)state;
  fake_cuda_reset();
  fake.resident = 1; /* blocks = min(n_server, resident) */
  live0 = fake_cuda_live();
  assert_int_equal(inst_start(&a, 0, T, 2, 2, EPOCH), 0);
  assert_int_equal(a.k->l.blocks, 1);
  inst_connect(&a);
  echo(&a, 1, 0, "a runs", 1);

  fake.resident = 8;
  assert_int_equal(inst_start(&b, 0, T, 1, 1, EPOCH), 0);
  b_region = dev_base(&b);
  assert_int_equal(gpu_instance_stop(b.gi), 0);
  inst_drop(&b);
  wait_destroys(2);
  assert_int_equal(inst_start(&c, 0, T, 1, 1, EPOCH), 0);
  assert_ptr_equal(dev_base(&c), b_region);
  inst_connect(&c);
  echo(&c, 0, 0, "c runs", 2);
  echo(&a, 0, 0, "a still runs", 3);
  assert_int_equal(gpu_instance_stop(c.gi), 0);
  inst_drop(&c);
  wait_destroys(4);
  assert_true(a.k->running);
  echo(&a, 1, 1, "a runs on", 4);
  /* while a's kernel ran: no cudaFree, no cudaDeviceSynchronize, no wait
   * on its stream */
  assert_int_equal(fake.frees, 0);
  assert_int_equal(fake.device_syncs, 0);
  assert_int_equal(fake.blocking_calls, 0);
  assert_int_equal(fake.mallocs, 4);

  assert_int_equal(gpu_instance_stop(a.gi), 0);
  inst_drop(&a);
  wait_destroys(6);
  gpu_shutdown();
  assert_int_equal(fake.frees, 4);
  assert_int_equal(fake.bad_frees, 0);
  assert_int_equal(fake.blocking_calls, 0);
  assert_int_equal(fake_cuda_live(), live0);
}

/* ---- 7. RDMA registration of GPU memory ------------------------------- */

struct classes {
  uint64_t from[LYNX_MR_COUNT], len[LYNX_MR_COUNT];
};

static void classes_of(const struct lynx_geom *g, struct classes *k) {
  uint64_t tx = g->rings_off + (uint64_t)g->n_mqueues * g->ring_bytes;
  k->from[0] = 0;
  k->len[0] = g->fctrl_off;
  k->from[1] = g->fctrl_off;
  k->len[1] = tx - g->fctrl_off;
  k->from[2] = tx;
  k->len[2] = g->region_size - tx;
}

static int reg(uint64_t off, uint64_t len, int access, struct ibv_mr **mr,
               char *err, size_t errlen) {
  void *m = NULL;
  int rc;
  err[0] = 0;
  rc = fk_mem->reg_mr(fk_mem->ctx, (void *)0x5D, off, len, access, &m, err,
                      errlen);
  *mr = m;
  return rc;
}

static void test_rdma_registration(void **state) {
  struct inst a;
  struct classes k;
  struct ibv_mr *mr;
  char err[512];
  const int acc[LYNX_MR_COUNT] = {
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ,
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ};
  int fd, releases0;
  (void)state;

  /* dma-buf: one fd over the whole allocation, one MR per class at the
   * class's offset in it and iova = device address of the class */
  fake_cuda_reset();
  releases0 = fk_releases;
  assert_int_equal(inst_start(&a, 0, &fake_tops, 3, 2, EPOCH), 0);
  assert_ptr_equal(fk_mem, a.r.mem);
  classes_of(&a.g, &k);
  for (int i = 0; i < LYNX_MR_COUNT; i++) {
    assert_int_equal(reg(k.from[i], k.len[i], acc[i], &mr, err, sizeof(err)),
                     0);
    assert_non_null(mr);
    assert_int_equal(fake.dmabuf_mrs, i + 1);
    assert_ptr_equal(fake.dmabuf.pd, (void *)0x5D);
    assert_int_equal(fake.dmabuf.offset, k.from[i]);
    assert_int_equal(fake.dmabuf.length, k.len[i]);
    assert_int_equal(fake.dmabuf.iova, a.r.mem->dev_addr + k.from[i]);
    assert_int_equal(fake.dmabuf.fd, fake.handle_fd);
    assert_int_equal(fake.dmabuf.access, acc[i]);
    assert_ptr_equal(mr->addr, (void *)(uintptr_t)fake.dmabuf.iova);
  }
  assert_int_equal(fake.get_handles, 1);
  assert_int_equal(fake.handle_ptr, a.r.mem->dev_addr);
  assert_int_equal(fake.handle_size % (64u * 1024u), 0);
  assert_true(fake.handle_size >= a.g.region_size);
  assert_int_equal(fake.reg_mrs, 0);
  assert_int_equal(
      reg(a.g.region_size + 65536, 64, acc[0], &mr, err, sizeof(err)), -EFAULT);
  fd = fake.handle_fd;
  assert_true(fd >= 0 && fcntl(fd, F_GETFD) >= 0);
  assert_int_equal(gpu_instance_stop(a.gi), 0);
  inst_drop(&a);
  assert_int_equal(fk_releases, releases0 + 1);
  assert_int_equal(fcntl(fd, F_GETFD), -1); /* closed with the instance */

  /* no dma-buf export: nvidia-peermem on the device pointer */
  fake_cuda_reset();
  fake.err_get_handle = CUDA_ERROR_NOT_SUPPORTED;
  assert_int_equal(inst_start(&a, 0, &fake_tops, 3, 2, EPOCH), 0);
  classes_of(&a.g, &k);
  assert_int_equal(reg(k.from[1], k.len[1], acc[1], &mr, err, sizeof(err)), 0);
  assert_int_equal(fake.dmabuf_mrs, 0);
  assert_int_equal(fake.reg_mrs, 1);
  assert_ptr_equal(fake.regmr.addr, dev_base(&a) + k.from[1]);
  assert_int_equal(fake.regmr.length, k.len[1]);
  assert_int_equal(fake.regmr.access, acc[1]);
  assert_ptr_equal(mr->addr, dev_base(&a) + k.from[1]);
  /* then peermem fails too: both reasons, also for a later class */
  fake.err_reg_mr = EINVAL;
  assert_int_equal(reg(k.from[2], k.len[2], acc[2], &mr, err, sizeof(err)),
                   -EIO);
  assert_contains(err, "GPU 0");
  assert_contains(err, "cuMemGetHandleForAddressRange: CUresult 801");
  assert_contains(err, "ibv_reg_mr: Invalid argument");
  assert_int_equal(fake.get_handles, 1);
  assert_int_equal(gpu_instance_stop(a.gi), 0);
  inst_drop(&a);

  /* the NIC refuses the dma-buf: peermem; both refuse: both reasons */
  fake_cuda_reset();
  fake.err_dmabuf_mr = EOPNOTSUPP;
  assert_int_equal(inst_start(&a, 0, &fake_tops, 3, 2, EPOCH), 0);
  classes_of(&a.g, &k);
  assert_int_equal(reg(k.from[0], k.len[0], acc[0], &mr, err, sizeof(err)), 0);
  assert_int_equal(fake.dmabuf_mrs, 1);
  assert_int_equal(fake.reg_mrs, 1);
  assert_ptr_equal(fake.regmr.addr, dev_base(&a));
  fake.err_reg_mr = EFAULT;
  assert_int_equal(reg(k.from[2], k.len[2], acc[2], &mr, err, sizeof(err)),
                   -EIO);
  assert_contains(err, "ibv_reg_dmabuf_mr: Operation not supported");
  assert_contains(err, "ibv_reg_mr: Bad address");
  assert_contains(err, "nvidia-peermem");
  assert_int_equal(gpu_instance_stop(a.gi), 0);
  inst_drop(&a);

  /* a driver without the entry point */
  fake_cuda_reset();
  fake.no_get_handle = 1;
  fake.err_reg_mr = ENODEV;
  assert_int_equal(inst_start(&a, 0, &fake_tops, 3, 2, EPOCH), 0);
  assert_int_equal(reg(0, 64, acc[0], &mr, err, sizeof(err)), -EIO);
  assert_contains(err, "cuMemGetHandleForAddressRange: not in this driver");
  assert_contains(err, "ibv_reg_mr: No such device");
  assert_int_equal(gpu_instance_stop(a.gi), 0);
  inst_drop(&a);
  gpu_shutdown();
  assert_int_equal(fake.bad_frees, 0);
}

/* ---- 8. failures clean up --------------------------------------------- */

static void test_failures_clean_up(void **state) {
  struct inst a;
  int live0 = fake_cuda_live(), att0, rel0;
  uint8_t *region;
  (void)state;

  /* no device memory: nothing attached, nothing left */
  fake_cuda_reset();
  att0 = fk_attaches;
  rel0 = fk_releases;
  fake.err_malloc = cudaErrorMemoryAllocation;
  assert_int_equal(inst_start(&a, 0, &fake_tops, 3, 2, EPOCH), -ENOMEM);
  assert_null(a.gi);
  assert_contains(a.err, "GPU 0: cannot allocate a ");
  assert_contains(a.err, "out of memory");
  assert_int_equal(fk_attaches, att0);
  assert_int_equal(fk_releases, rel0);
  assert_int_equal(fake.stream_creates, 2);
  assert_int_equal(fake.stream_destroys, 2);
  assert_int_equal(fake.launches, 0);
  assert_int_equal(fake_cuda_live(), live0);
  fake.err_malloc = cudaSuccess;

  /* the launch fails: the transport released the memory once, and it is
   * back on the free list */
  fake_cuda_reset();
  fake.err_launch = cudaErrorNoKernelImageForDevice;
  assert_int_equal(inst_start(&a, 0, &fake_tops, 3, 2, EPOCH), -EIO);
  assert_null(a.gi);
  assert_contains(a.err, "fake launch failure 209");
  assert_int_equal(fk_releases, rel0 + 1);
  assert_int_equal(fake.stream_destroys, 2);
  assert_int_equal(fake.frees, 0);
  assert_int_equal(fake_cuda_live(), live0 + 2);
  fake.err_launch = -EINVAL;
  assert_int_equal(inst_start(&a, 0, &fake_tops, 3, 2, EPOCH), -EINVAL);
  assert_int_equal(fk_releases, rel0 + 2);
  assert_int_equal(fake.mallocs, 2); /* reused */
  fake.err_launch = 0;
  assert_int_equal(inst_start(&a, 0, &fake_tops, 3, 2, EPOCH), 0);
  assert_int_equal(fake.mallocs, 2);
  region = dev_base(&a);
  assert_int_equal(gpu_instance_stop(a.gi), 0);
  inst_drop(&a);
  assert_int_equal(fk_releases, rel0 + 3);

  /* the transport cannot reach GPU memory (shm) */
  assert_int_equal(inst_start(&a, 0, lynx_transport_find("shm"), 3, 2, EPOCH),
                   -ENOTSUP);
  assert_contains(a.err, "the shm transport cannot reach GPU memory (use tcp "
                         "or rdma)");
  /* nor export it */
  fk_export_rc = -EPROTO;
  assert_int_equal(inst_start(&a, 0, &fake_tops, 3, 2, EPOCH), -EPROTO);
  assert_contains(a.err, "cannot export the region in GPU memory over fake");
  assert_int_equal(fk_releases, rel0 + 4);
  fk_export_rc = 0;
  /* no block fits */
  fake.resident = 0;
  assert_int_equal(inst_start(&a, 0, &fake_tops, 3, 2, EPOCH), -EIO);
  assert_contains(a.err, "not one block fits");
  assert_int_equal(fk_releases, rel0 + 5);
  fake.resident = 8;
  /* a bad geometry, before anything is allocated */
  assert_int_equal(inst_start(&a, 0, &fake_tops, 3, 4, EPOCH), -EINVAL);
  assert_int_equal(fake.mallocs, 2);
  assert_int_equal(fake.launches, 3);
  assert_int_equal(fake.stream_creates, fake.stream_destroys);
  assert_int_equal(fake.frees, 0);
  assert_int_equal(fake_cuda_live(), live0 + 2);
  assert_true(fake_cuda_is_live(region));
  gpu_shutdown();
  assert_int_equal(fake.frees, 2);
  assert_int_equal(fake.bad_frees, 0);
  assert_int_equal(fake.bad_copies, 0);
  assert_int_equal(fake_cuda_live(), live0);
}

/* ---- the lease fence --------------------------------------------------- */

/* kctl->serve_until_gt, as the kernel reads it */
static uint64_t fence_gt(const struct inst *in) {
  return __atomic_load_n(&in->k->l.kctl->serve_until_gt, __ATOMIC_ACQUIRE);
}

/* Under a lease an instance is launched fenced, then gets the agent's
 * deadline converted to the GPU's clock (never later than the host's), and
 * serves; a deadline in the past stops new requests without losing them;
 * lifting the fence serves them. */
static void test_lease_fence(void **state) {
  struct inst in;
  uint64_t until, gt, c[4], passes, reads;
  const struct lynx_actrl *actrl;
  (void)state;
  fake_cuda_reset();
  until = lynx_now_ns() + 10ull * 1000000000ull;
  start_serve_until = until;
  assert_int_equal(inst_start(&in, 0, T, 2, 2, EPOCH), 0);
  start_serve_until = UINT64_MAX;
  /* launched fenced, before the deadline could be converted */
  assert_int_equal(fake.launches, 1);
  assert_int_equal(in.k->launch_fence, 1);
  /* converted: the fake GPU clock runs FAKE_GT_OFFSET_NS ahead; the
   * offset is measured from below, so the GPU deadline is no later than
   * the host's, and not much earlier on an idle machine */
  gt = fence_gt(&in);
  assert_true(gt <= until + FAKE_GT_OFFSET_NS);
  assert_true(gt + 1000000000ull > until + FAKE_GT_OFFSET_NS);
  inst_connect(&in);
  echo(&in, 0, 0, "before the fence", 21);

  /* the lease ran out: the kernel takes no new request */
  assert_int_equal(gpu_instance_fence(in.gi, lynx_now_ns() - 1), 0);
  gt = fence_gt(&in);
  assert_true(gt <= fake_cuda_globaltimer());
  passes = __atomic_load_n(&in.k->fenced_passes, __ATOMIC_RELAXED);
  {
    uint32_t len = 6;
    uint32_t poff = lynx_payload_off(Z, len);
    struct lynx_slot_meta meta = {len, 22, LYNX_ST_OK, (uint16_t)(poff / 16u),
                                  lynx_seq_for(1)};
    static const uint8_t zeros[Z];
    struct iovec iov[3] = {{(void *)"fence", len},
                           {(void *)zeros, lynx_slot_cap(Z) - poff - len},
                           {&meta, sizeof(meta)}};
    uint64_t rx = lynx_slot_off(&in.g, lynx_rx_ring_off(&in.g, 0), 1);
    assert_int_equal(
        in.c->ops->writev(in.c, rx + poff, iov, 3, LYNX_WR_PUBLISH), 0);
    assert_int_equal(in.c->ops->flush(in.c), 0);
  }
  reads = lynx_now_ns() + 2000000000ull;
  while (__atomic_load_n(&in.k->fenced_passes, __ATOMIC_RELAXED) <
             passes + 50 &&
         lynx_now_ns() < reads)
    usleep(1000);
  assert_true(__atomic_load_n(&in.k->fenced_passes, __ATOMIC_RELAXED) >=
              passes + 50);
  counters(&in, c);
  assert_int_equal(c[0], 1); /* the request waits, not taken */
  actrl = (const struct lynx_actrl *)(dev_base(&in) + LYNX_OFF_ACTRL);
  assert_int_equal(actrl[0].rx_cons, 1);

  /* renewed: served, nothing lost */
  assert_int_equal(gpu_instance_fence(in.gi, UINT64_MAX), 0);
  assert_int_equal(fence_gt(&in), 0);
  counters_until(&in, 2, c);
  assert_int_equal(c[0], 2);
  assert_int_equal(c[1], 2);

  assert_int_equal(gpu_instance_stop(in.gi), 0);
  inst_drop(&in);
  gpu_shutdown();
}

/* ---- 9. the tcp transport's staging (GPU memory without gdrcopy) ----- */

static void pattern(uint8_t *p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t)(seed * 131u + i * 7u + (i >> 8) + 1u);
}

static struct lynx_accel_copies copy_stats(const struct inst *in) {
  struct lynx_accel_copies st;
  gpu_instance_copy_stats(in->gi, &st);
  return st;
}

/* An instance whose kernel serves mqueue 0 only: the tests copy into the
 * RX rings of the others (from rx_at(in, 2) on), which it never reads. */
static void stage_inst(struct inst *in) {
  assert_int_equal(inst_start(in, 0, &fake_tops, 8, 1, EPOCH), 0);
  assert_non_null(in->r.mem->write_start);
  assert_non_null(in->r.mem->read_start);
  assert_non_null(in->r.mem->flush);
}

static uint64_t rx_at(const struct inst *in, uint32_t q) {
  return lynx_rx_ring_off(&in->g, q);
}

/* Every write starts a copy and none waits; a batch of reads waits once;
 * reads see the writes before them, in order, within a batch too; adjacent
 * writes share a copy, the publishing word never; single calls still
 * work beside batches. Copies from pinned memory stay in flight until the
 * stream gets there (defer_copies), as on a GPU. */
static void test_staging_batches(void **state) {
  const struct lynx_region_mem *m;
  struct lynx_accel_copies st0, st;
  struct inst a;
  uint8_t w[16][200], x[64], y[64], p[128], back[128];
  const void *bytes[16], *b1, *b2;
  int syncs0, esyncs0, copies0, ops0, pinned0;
  (void)state;
  fake_cuda_reset();
  pinned0 = fake_cuda_pinned_live();
  stage_inst(&a);
  m = a.r.mem;
  st0 = copy_stats(&a);
  assert_int_equal(st0.staging_bytes, 4u << 20);
  assert_true(fake.event_creates > 0);
  if (fake.host_allocs) { /* not reused from an earlier test */
    assert_int_equal(fake.host_allocs, 1);
    assert_true(fake.host_alloc_flags & cudaHostAllocPortable);
    assert_int_equal(fake_cuda_pinned_live(), pinned0 + 1);
  }
  fake.defer_copies = 1;

  /* 16 writes, every other one publishing: copies started, no wait */
  syncs0 = fake.stream_syncs;
  esyncs0 = fake.event_syncs;
  copies0 = fake.memcpys;
  ops0 = fake.n_ops;
  for (int i = 0; i < 16; i++) {
    pattern(w[i], sizeof(w[i]), (uint32_t)i);
    assert_int_equal(m->write_start(m->ctx, rx_at(&a, 2) + (uint64_t)i * 256,
                                    w[i], sizeof(w[i]),
                                    i % 2 ? LYNX_WR_PUBLISH : 0),
                     0);
  }
  assert_int_equal(m->flush(m->ctx), 0);
  assert_int_equal(fake.stream_syncs, syncs0);
  assert_int_equal(fake.event_syncs, esyncs0);
  assert_int_equal(fake.memcpys - copies0, 16 + 8);
  assert_int_equal(fake_cuda_inflight(), 16 + 8); /* nothing waited */
  assert_true(fake.event_records > 0);
  /* a publishing write: its body, then its last word alone */
  for (int i = ops0; i < fake.n_ops; i++) {
    const uint8_t *d = fake.ops[i].dev;
    if (d == dev_base(&a) + rx_at(&a, 2) + 256 + 196) {
      assert_int_equal(fake.ops[i].len, 4);
      assert_ptr_equal(fake.ops[i - 1].dev, dev_base(&a) + rx_at(&a, 2) + 256);
      assert_int_equal(fake.ops[i - 1].len, 196);
    }
  }

  /* 16 reads: one stream synchronisation for all of them */
  for (int i = 0; i < 16; i++)
    assert_int_equal(m->read_start(m->ctx, rx_at(&a, 2) + (uint64_t)i * 256,
                                   sizeof(w[i]), &bytes[i]),
                     0);
  assert_int_equal(fake.stream_syncs, syncs0);
  assert_int_equal(m->flush(m->ctx), 0);
  assert_int_equal(fake.stream_syncs, syncs0 + 1);
  assert_int_equal(fake.event_syncs, esyncs0);
  assert_int_equal(fake_cuda_inflight(), 0);
  for (int i = 0; i < 16; i++) {
    assert_memory_equal(bytes[i], w[i], sizeof(w[i]));
    assert_memory_equal(dev_base(&a) + rx_at(&a, 2) + (uint64_t)i * 256, w[i],
                        sizeof(w[i]));
  }
  st = copy_stats(&a);
  assert_int_equal(st.writes - st0.writes, 16);
  assert_int_equal(st.reads - st0.reads, 16);
  assert_int_equal(st.syncs - st0.syncs, 1);
  assert_int_equal(st.staging_waits, 0);
  assert_int_equal(st.unstaged, 0);

  /* in one batch: write x, read, write y, read: each read sees the
   * writes before it and no later one */
  memset(x, 0x11, sizeof(x));
  memset(y, 0x22, sizeof(y));
  syncs0 = fake.stream_syncs;
  assert_int_equal(m->write_start(m->ctx, rx_at(&a, 3), x, sizeof(x), 0), 0);
  assert_int_equal(m->read_start(m->ctx, rx_at(&a, 3), sizeof(x), &b1), 0);
  assert_int_equal(
      m->write_start(m->ctx, rx_at(&a, 3), y, sizeof(y), LYNX_WR_PUBLISH), 0);
  assert_int_equal(m->read_start(m->ctx, rx_at(&a, 3), sizeof(y), &b2), 0);
  assert_int_equal(m->flush(m->ctx), 0);
  assert_int_equal(fake.stream_syncs, syncs0 + 1);
  assert_memory_equal(b1, x, sizeof(x));
  assert_memory_equal(b2, y, sizeof(y));

  /* adjacent writes: 0..32, 32..64 and the body of a publishing 64..96
   * share one copy; its word is a copy of its own, and 96..128 does not
   * join it */
  pattern(p, sizeof(p), 99);
  st0 = copy_stats(&a);
  ops0 = fake.n_ops;
  assert_int_equal(m->write_start(m->ctx, rx_at(&a, 4), p, 32, 0), 0);
  assert_int_equal(m->write_start(m->ctx, rx_at(&a, 4) + 32, p + 32, 32, 0), 0);
  assert_int_equal(
      m->write_start(m->ctx, rx_at(&a, 4) + 64, p + 64, 32, LYNX_WR_PUBLISH),
      0);
  assert_int_equal(m->write_start(m->ctx, rx_at(&a, 4) + 96, p + 96, 32, 0), 0);
  assert_int_equal(m->flush(m->ctx), 0);
  st = copy_stats(&a);
  assert_int_equal(st.merged - st0.merged, 2);
  assert_int_equal(st.copies - st0.copies, 3);
  assert_int_equal(fake.n_ops - ops0, 3);
  assert_ptr_equal(fake.ops[ops0].dev, dev_base(&a) + rx_at(&a, 4));
  assert_int_equal(fake.ops[ops0].len, 92);
  assert_ptr_equal(fake.ops[ops0 + 1].dev, dev_base(&a) + rx_at(&a, 4) + 92);
  assert_int_equal(fake.ops[ops0 + 1].len, 4);
  assert_ptr_equal(fake.ops[ops0 + 2].dev, dev_base(&a) + rx_at(&a, 4) + 96);
  assert_int_equal(fake.ops[ops0 + 2].len, 32);
  for (int i = ops0; i < fake.n_ops; i++) {
    assert_int_equal(fake.ops[i].kind, cudaMemcpyHostToDevice);
    assert_ptr_equal(fake.ops[i].stream, fake.ops[0].stream);
  }

  /* single calls beside batches: a write staged, a read waits for it */
  syncs0 = fake.stream_syncs;
  assert_int_equal(m->write(m->ctx, rx_at(&a, 5), p, sizeof(p)), 0);
  assert_int_equal(fake.stream_syncs, syncs0);
  assert_int_equal(m->read(m->ctx, rx_at(&a, 4), back, sizeof(back)), 0);
  assert_memory_equal(back, p, sizeof(p));
  assert_int_equal(m->read(m->ctx, rx_at(&a, 5), back, sizeof(back)), 0);
  assert_memory_equal(back, p, sizeof(p));
  assert_int_equal(fake.stream_syncs, syncs0 + 2);
  /* bounds, and a publishing write shorter than its word */
  assert_int_equal(m->write_start(m->ctx, a.r.size - 8, p, 16, 0), -EFAULT);
  assert_int_equal(m->read_start(m->ctx, a.r.size, 1, &b1), -EFAULT);
  assert_int_equal(m->write_start(m->ctx, rx_at(&a, 5), p, 3, LYNX_WR_PUBLISH),
                   -EINVAL);
  assert_int_equal(fake.src_races, 0);
  assert_int_equal(fake.bad_copies, 0);

  /* the staging outlives the instance in a pool: the next instance of
   * the GPU reuses it, and it is freed at exit, never under a kernel */
  assert_int_equal(gpu_instance_stop(a.gi), 0);
  inst_drop(&a);
  assert_int_equal(fake.host_frees, 0);
  pinned0 = fake.host_allocs;
  stage_inst(&a);
  assert_int_equal(fake.host_allocs, pinned0);
  assert_int_equal(gpu_instance_stop(a.gi), 0);
  inst_drop(&a);
  gpu_shutdown();
  assert_true(fake.host_frees >= 1);
  assert_int_equal(fake.blocking_calls, 0);
  assert_int_equal(fake.bad_frees, 0);
  assert_int_equal(fake.event_creates, fake.event_destroys);
}

/* Writes only, many times the ring: space comes back as copies complete
 * (queried), and only where the ring wrapped onto a copy still in flight
 * does a write wait (counted); no staged byte is reused before the copy
 * that reads it completed (src_races), and the data survives the wraps. */
static void test_staging_wrap(void **state) {
  const struct lynx_region_mem *m;
  struct lynx_accel_copies st0, st;
  struct inst a;
  static uint8_t buf[4000];
  uint8_t last[2][4000];
  const void *bytes[2];
  uint64_t off[2];
  int syncs0, esyncs0, flushes = 0;
  (void)state;
  fake_cuda_reset();
  stage_inst(&a);
  m = a.r.mem;
  off[0] = rx_at(&a, 2);
  off[1] = rx_at(&a, 4);
  fake.defer_copies = 1; /* queries never complete a copy: it waits */
  st0 = copy_stats(&a);
  syncs0 = fake.stream_syncs;
  esyncs0 = fake.event_syncs;
  for (uint32_t batch = 0; batch < 200; batch++) {
    for (uint32_t j = 0; j < 40; j++) {
      pattern(buf, sizeof(buf), batch * 40 + j);
      assert_int_equal(m->write_start(m->ctx, off[j % 2], buf, sizeof(buf),
                                      j % 4 == 3 ? LYNX_WR_PUBLISH : 0),
                       0);
      memcpy(last[j % 2], buf, sizeof(buf));
    }
    if (batch % 50 == 49) { /* read both back: one wait */
      for (int k = 0; k < 2; k++)
        assert_int_equal(m->read_start(m->ctx, off[k], sizeof(buf), &bytes[k]),
                         0);
      flushes++;
    }
    assert_int_equal(m->flush(m->ctx), 0);
    if (batch % 50 == 49)
      for (int k = 0; k < 2; k++)
        assert_memory_equal(bytes[k], last[k], sizeof(buf));
  }
  assert_int_equal(fake.src_races, 0); /* nothing staged over in flight */
  st = copy_stats(&a);
  assert_true(st.staging_waits - st0.staging_waits > 0);
  assert_int_equal(fake.event_syncs - esyncs0,
                   (int)(st.staging_waits - st0.staging_waits));
  assert_int_equal(fake.stream_syncs - syncs0, flushes);
  assert_int_equal(st.syncs - st0.syncs, (uint64_t)flushes);
  assert_int_equal(st.unstaged, 0);
  assert_int_equal(st.writes - st0.writes, 8000);
  fprintf(stderr, "200 batches of 40 x 4000 B: %llu staging waits\n",
          (unsigned long long)(st.staging_waits - st0.staging_waits));

  /* copies that completed are reclaimed by query, without a wait */
  fake.query_completes = 1;
  st0 = copy_stats(&a);
  esyncs0 = fake.event_syncs;
  for (uint32_t batch = 0; batch < 100; batch++) {
    for (uint32_t j = 0; j < 40; j++) {
      pattern(buf, sizeof(buf), 7 + batch * 40 + j);
      assert_int_equal(m->write_start(m->ctx, off[j % 2], buf, sizeof(buf), 0),
                       0);
      memcpy(last[j % 2], buf, sizeof(buf));
    }
    assert_int_equal(m->flush(m->ctx), 0);
  }
  st = copy_stats(&a);
  assert_int_equal(st.staging_waits, st0.staging_waits);
  assert_int_equal(fake.event_syncs, esyncs0);
  assert_true(fake.event_queries > 0);
  assert_int_equal(m->read(m->ctx, off[0], buf, sizeof(buf)), 0);
  assert_memory_equal(buf, last[0], sizeof(buf));
  assert_int_equal(m->read(m->ctx, off[1], buf, sizeof(buf)), 0);
  assert_memory_equal(buf, last[1], sizeof(buf));
  assert_int_equal(fake.src_races, 0);
  assert_int_equal(gpu_instance_stop(a.gi), 0);
  inst_drop(&a);
  gpu_shutdown();
  assert_int_equal(fake.blocking_calls, 0);
}

/* What the ring cannot take, and every failure: a batch whose reads fill
 * the ring says so (-ENOBUFS) and its reads stay intact; a write then goes
 * unstaged; a failed copy, stream synchronisation or wait returns -EIO,
 * recorded for health, and the writes and reads around it are not lost;
 * pinned memory or events the GPU will not give fail the instance with
 * the reason, leaving nothing behind. */
static void test_staging_limits_failures(void **state) {
  const struct lynx_region_mem *m;
  struct lynx_accel_copies st0, st;
  struct inst a;
  static uint8_t buf[4000], cur[2][4000];
  static const void *bytes[1200];
  uint8_t x[100], y[100], back[100];
  const void *b1;
  uint64_t off[2];
  int n, lost, failed, live0, att0, rel0, allocs0;
  char err[256];
  (void)state;
  fake_cuda_reset();
  stage_inst(&a);
  m = a.r.mem;
  off[0] = rx_at(&a, 2);
  off[1] = rx_at(&a, 4);
  fake.defer_copies = 1;
  for (int k = 0; k < 2; k++) {
    pattern(cur[k], sizeof(cur[k]), 1000u + (uint32_t)k);
    assert_int_equal(m->write_start(m->ctx, off[k], cur[k], sizeof(cur[k]), 0),
                     0);
  }
  /* reads until the ring is full of them */
  for (n = 0; n < 1200; n++) {
    int rc = m->read_start(m->ctx, off[n % 2], sizeof(buf), &bytes[n]);
    if (rc == -ENOBUFS)
      break;
    assert_int_equal(rc, 0);
  }
  assert_true(n > 1000 && n < 1200); /* 4 MiB of 4000-byte reads */
  /* a write now cannot be staged: it is copied from the caller's memory,
   * after the reads (they do not see it) */
  st0 = copy_stats(&a);
  pattern(buf, sizeof(buf), 2000);
  assert_int_equal(m->write_start(m->ctx, off[0], buf, sizeof(buf), 0), 0);
  st = copy_stats(&a);
  assert_int_equal(st.unstaged - st0.unstaged, 1);
  assert_int_equal(m->flush(m->ctx), 0);
  for (int i = 0; i < n; i++)
    assert_memory_equal(bytes[i], cur[i % 2], sizeof(buf));
  memcpy(cur[0], buf, sizeof(buf));
  /* the next batch has the ring again */
  assert_int_equal(m->read_start(m->ctx, off[0], sizeof(buf), &bytes[0]), 0);
  assert_int_equal(m->flush(m->ctx), 0);
  assert_memory_equal(bytes[0], cur[0], sizeof(buf));

  /* a copy fails: -EIO, health has it; the write after it lands */
  memset(x, 0x33, sizeof(x));
  memset(y, 0x44, sizeof(y));
  fake.err_memcpy_once = cudaErrorInvalidValue;
  assert_int_equal(
      m->write_start(m->ctx, off[1], x, sizeof(x), LYNX_WR_PUBLISH), -EIO);
  assert_int_equal(
      m->write_start(m->ctx, off[1] + 200, y, sizeof(y), LYNX_WR_PUBLISH), 0);
  assert_int_equal(m->read_start(m->ctx, off[1] + 200, sizeof(y), &b1), 0);
  assert_int_equal(m->flush(m->ctx), 0);
  assert_memory_equal(b1, y, sizeof(y));
  gpu_health(&a.gpu, &lost, &failed, err, sizeof(err));
  assert_int_equal(lost, 0);
  assert_int_equal(failed, 0);
  assert_contains(err, "copy into the region: cudaErrorInvalidValue");
  /* a read's copy fails: the reads beside it are answered */
  assert_int_equal(m->read_start(m->ctx, off[0], sizeof(x), &bytes[0]), 0);
  fake.err_memcpy_once = cudaErrorInvalidValue;
  assert_int_equal(m->read_start(m->ctx, off[1], sizeof(x), &b1), -EIO);
  assert_int_equal(m->read_start(m->ctx, off[1] + 200, sizeof(y), &bytes[1]),
                   0);
  assert_int_equal(m->flush(m->ctx), 0);
  assert_memory_equal(bytes[0], cur[0], sizeof(x));
  assert_memory_equal(bytes[1], y, sizeof(y));
  gpu_health(&a.gpu, &lost, &failed, err, sizeof(err));
  assert_contains(err, "copy out of the region: cudaErrorInvalidValue");
  /* the batch's wait fails: -EIO; the next batch is whole */
  assert_int_equal(m->write_start(m->ctx, off[0], y, sizeof(y), 0), 0);
  assert_int_equal(m->read_start(m->ctx, off[0], sizeof(y), &b1), 0);
  fake.err_stream_sync_once = cudaErrorInvalidResourceHandle;
  assert_int_equal(m->flush(m->ctx), -EIO);
  assert_int_equal(m->read_start(m->ctx, off[0], sizeof(y), &b1), 0);
  assert_int_equal(m->flush(m->ctx), 0);
  assert_memory_equal(b1, y, sizeof(y));
  /* a wait for a copy the ring wrapped onto fails: that write says so,
   * the ones after it are staged again */
  fake.err_event_sync_once = cudaErrorInvalidValue;
  st0 = copy_stats(&a);
  n = 0;
  for (int i = 0; i < 4000 && !n; i++) {
    pattern(buf, sizeof(buf), (uint32_t)i);
    n = m->write_start(m->ctx, off[1], buf, sizeof(buf), 0);
    if (!n)
      memcpy(cur[1], buf, sizeof(buf));
    if (i % 40 == 39)
      assert_int_equal(m->flush(m->ctx), 0);
  }
  assert_int_equal(n, -EIO);
  st = copy_stats(&a);
  assert_int_equal(st.staging_waits - st0.staging_waits, 1);
  for (int i = 0; i < 100; i++) {
    pattern(buf, sizeof(buf), 5000u + (uint32_t)i);
    assert_int_equal(m->write_start(m->ctx, off[1], buf, sizeof(buf), 0), 0);
  }
  assert_int_equal(m->read_start(m->ctx, off[1], sizeof(buf), &b1), 0);
  assert_int_equal(m->flush(m->ctx), 0);
  assert_memory_equal(b1, buf, sizeof(buf));
  assert_int_equal(m->read(m->ctx, off[0], back, sizeof(back)), 0);
  assert_memory_equal(back, y, sizeof(back));
  assert_int_equal(fake.src_races, 0);
  assert_int_equal(gpu_instance_stop(a.gi), 0);
  inst_drop(&a);
  gpu_shutdown();

  /* no pinned memory: the instance fails with the reason, nothing left */
  fake_cuda_reset();
  live0 = fake_cuda_live();
  att0 = fk_attaches;
  rel0 = fk_releases;
  fake.err_host_alloc = cudaErrorMemoryAllocation;
  assert_int_equal(inst_start(&a, 0, &fake_tops, 8, 1, EPOCH), -ENOMEM);
  assert_null(a.gi);
  assert_contains(a.err, "GPU 0: cannot set up the tcp transport's 4096 KiB "
                         "of pinned staging");
  assert_contains(a.err, "out of memory");
  assert_int_equal(fk_attaches, att0);
  assert_int_equal(fk_releases, rel0);
  assert_int_equal(fake.launches, 0);
  assert_int_equal(fake.stream_creates, fake.stream_destroys);
  assert_int_equal(fake.event_creates, fake.event_destroys);
  fake.err_host_alloc = cudaSuccess;
  /* no events: the same; the pinned memory is back for the next one */
  fake.err_event_create = cudaErrorMemoryAllocation;
  assert_int_equal(inst_start(&a, 0, &fake_tops, 8, 1, EPOCH), -ENOMEM);
  assert_contains(a.err, "(staging events): out of memory");
  assert_int_equal(fake.stream_creates, fake.stream_destroys);
  assert_int_equal(fake.event_creates, fake.event_destroys);
  fake.err_event_create = cudaSuccess;
  allocs0 = fake.host_allocs;
  assert_int_equal(allocs0, 1);
  stage_inst(&a);
  assert_int_equal(fake.host_allocs, allocs0);
  assert_int_equal(gpu_instance_stop(a.gi), 0);
  inst_drop(&a);
  /* rdma needs no staging: the NIC reaches the memory itself */
  n = fake.event_creates;
  assert_int_equal(inst_start(&a, 0, lynx_transport_find("rdma"), 8, 1, EPOCH),
                   -ENOTCONN); /* no rdma agent here: refused at attach */
  assert_int_equal(fake.event_creates, n);
  gpu_shutdown();
  assert_int_equal(fake.bad_frees, 0);
  assert_int_equal(fake.blocking_calls, 0);
  assert_int_equal(fake.bad_copies, 0);
  assert_int_equal(fake_cuda_live(), live0);
}

/* Over the real tcp transport: what one frontend flush sends is one batch:
 * its reads cost one stream synchronisation, its writes none, replies come
 * in order, each read after the writes before it. */
/* Answers pushed from GPU memory (issue 36): the region has no host
 * mapping and its kernel rings no bell, so the agent's thread watches the
 * kernel's copy of its control words in pinned host memory while answers
 * are owed, and pushes each echo, the slot copied out with the batch; the
 * frontend finds them in the ring's copy with no read posted, over two
 * laps of the ring (its consumer index written back in between). */
static void test_push_from_gpu_memory(void **state) {
  struct lynx_accel_copies st0, st;
  struct inst in;
  uint8_t *ring = calloc(S, Z);
  struct lynx_tx_sub sub = {.q = 0, .ring = ring};
  struct lynx_push p = {&sub, 1, 0};
  uint64_t ids[4];
  (void)state;
  assert_non_null(ring);
  fake_cuda_reset();
  assert_int_equal(inst_start(&in, 0, T, 8, 1, EPOCH), 0);
  assert_null(in.r.base);
  assert_non_null(in.r.mem->ctrl_mirror);
  inst_connect(&in);
  assert_int_equal(in.c->ops->subscribe(in.c, &p, 7), 0);
  assert_int_equal(in.c->ops->flush(in.c), 0);
  assert_int_equal(ut_poll_n(in.c, ids, 1), 1);
  assert_int_equal(ids[0], 7);
  assert_int_equal(p.state, 1);
  st0 = copy_stats(&in);
  for (uint32_t pos = 0; pos < 2 * S; pos++) {
    char msg[32];
    uint64_t end = lynx_now_ns() + 2000000000ull, id;
    uint32_t cons = pos + 1;
    struct iovec iov = {&cons, sizeof(cons)};
    snprintf(msg, sizeof(msg), "pushed %u", pos);
    request_at(&in, 0, pos, msg, 0x700 + pos);
    while (sub.prod != pos + 1) {
      assert_true(in.c->ops->poll(in.c, &id, 1) == 0);
      assert_true(lynx_now_ns() < end);
      usleep(200);
    }
    echoed(ring + (size_t)(pos & (S - 1)) * Z, pos, msg, 0x700 + pos);
    assert_int_equal(in.c->ops->writev(in.c, lynx_fctrl_off(&in.g, 0), &iov, 1,
                                       LYNX_WR_PUBLISH),
                     0);
    assert_int_equal(in.c->ops->flush(in.c), 0);
  }
  st = copy_stats(&in);
  /* each answer was copied out of GPU memory once, by the push */
  assert_true(st.reads - st0.reads >= 2 * S);
  assert_int_equal(fake.bad_copies, 0);
  assert_int_equal(gpu_instance_stop(in.gi), 0);
  inst_drop(&in);
  wait_destroys(2);
  gpu_shutdown();
  free(ring);
}

static void test_staging_over_tcp(void **state) {
  struct lynx_accel_copies st0, st;
  struct inst in;
  uint8_t rd[32][64], x[64], y[64], bx[64], by[64];
  uint64_t ids[32], end;
  int syncs0;
  (void)state;
  fake_cuda_reset();
  assert_int_equal(inst_start(&in, 0, T, 8, 1, EPOCH), 0);
  assert_non_null(in.r.mem->flush);
  /* GPU memory, read by copy engines: every writer fences first */
  assert_int_equal(in.k->l.thread_readers, 0);
  inst_connect(&in);
  echo(&in, 0, 0, "staged", 31);
  fake.defer_copies = 1;

  /* 16 writes, one flush: no synchronisation */
  st0 = copy_stats(&in);
  syncs0 = fake.stream_syncs;
  for (int i = 0; i < 16; i++) {
    struct iovec iov = {x, sizeof(x)};
    pattern(x, sizeof(x), 300u + (uint32_t)i);
    assert_int_equal(in.c->ops->writev(in.c, rx_at(&in, 2) + (uint64_t)i * 64,
                                       &iov, 1, LYNX_WR_PUBLISH),
                     0);
  }
  assert_int_equal(in.c->ops->flush(in.c), 0);
  end = lynx_now_ns() + 2000000000ull;
  do {
    st = copy_stats(&in);
    if (st.writes - st0.writes >= 16)
      break;
    usleep(1000);
  } while (lynx_now_ns() < end);
  assert_int_equal(st.writes - st0.writes, 16);
  assert_int_equal(fake.stream_syncs, syncs0);
  assert_int_equal(st.syncs, st0.syncs);

  /* 32 reads, one flush: one synchronisation, replies in order */
  st0 = st;
  for (int i = 0; i < 32; i++)
    assert_int_equal(in.c->ops->read(in.c, rx_at(&in, 2) + (uint64_t)i * 32,
                                     rd[i], sizeof(rd[i]), 500u + (uint64_t)i),
                     0);
  assert_int_equal(in.c->ops->flush(in.c), 0);
  assert_int_equal(ut_poll_n(in.c, ids, 32), 32);
  st = copy_stats(&in);
  assert_int_equal(st.reads - st0.reads, 32);
  assert_int_equal(st.syncs - st0.syncs, 1);
  assert_int_equal(fake.stream_syncs, syncs0 + 1);
  for (int i = 0; i < 32; i++) {
    assert_int_equal(ids[i], 500u + (uint64_t)i);
    pattern(x, sizeof(x), 300u + (uint32_t)(i / 2));
    assert_memory_equal(rd[i], x + (i % 2) * 32, 32);
    assert_memory_equal(
        rd[i] + 32, dev_base(&in) + rx_at(&in, 2) + (uint64_t)i * 32 + 32, 32);
  }

  /* write x, read, write y, read, in one flush */
  memset(x, 0x55, sizeof(x));
  memset(y, 0x66, sizeof(y));
  {
    struct iovec ix = {x, sizeof(x)}, iy = {y, sizeof(y)};
    assert_int_equal(in.c->ops->writev(in.c, rx_at(&in, 3), &ix, 1, 0), 0);
    assert_int_equal(in.c->ops->read(in.c, rx_at(&in, 3), bx, sizeof(bx), 1),
                     0);
    assert_int_equal(
        in.c->ops->writev(in.c, rx_at(&in, 3), &iy, 1, LYNX_WR_PUBLISH), 0);
    assert_int_equal(in.c->ops->read(in.c, rx_at(&in, 3), by, sizeof(by), 2),
                     0);
  }
  assert_int_equal(in.c->ops->flush(in.c), 0);
  assert_int_equal(ut_poll_n(in.c, ids, 2), 2);
  assert_int_equal(ids[0], 1);
  assert_int_equal(ids[1], 2);
  assert_memory_equal(bx, x, sizeof(x));
  assert_memory_equal(by, y, sizeof(y));
  /* the kernel still answers through the staging */
  echo(&in, 0, 1, "still staged", 32);
  /* a compound read (the frontend's poll for answers): the control array
   * from the kernel's own copy in host memory, only the slots staged, so
   * one synchronisation, not two (issue 35, finding 8) */
  {
    struct lynx_actrl snap[8];
    uint8_t slots[4 * Z];
    struct lynx_tx_read tx = {.q = 0, .from = 0, .max = 4, .dst = slots};
    struct lynx_slot_meta m;
    st0 = copy_stats(&in);
    syncs0 = fake.stream_syncs;
    assert_int_equal(in.c->ops->read_tx(in.c, snap, &tx, 1, 77), 0);
    assert_int_equal(in.c->ops->flush(in.c), 0);
    assert_int_equal(ut_poll_n(in.c, ids, 1), 1);
    assert_int_equal(ids[0], 77);
    st = copy_stats(&in);
    assert_int_equal(st.syncs - st0.syncs, 1);
    assert_int_equal(fake.stream_syncs, syncs0 + 1);
    /* the copy says what the array in GPU memory says */
    assert_memory_equal(snap, dev_base(&in) + in.g.actrl_off, sizeof(snap));
    assert_int_equal(snap[0].tx_prod, 2);
    assert_int_equal(tx.got, 2);
    memcpy(&m, slots + 2 * Z - LYNX_META_SIZE, sizeof(m));
    assert_int_equal(m.seq, lynx_seq_for(1));
    assert_int_equal(m.tag, 32);
  }
  assert_int_equal(fake.src_races, 0);
  assert_int_equal(fake.bad_copies, 0);
  assert_int_equal(gpu_instance_stop(in.gi), 0);
  inst_drop(&in);
  wait_destroys(2);
  gpu_shutdown();
  assert_int_equal(fake.blocking_calls, 0);
}

/* ---- client mqueues: mc-get and face-verify on a GPU ----------------- */

#define CS 8u    /* slots of a client-calling instance's mqueues */
#define CZ 2048u /* bytes a slot: a face's stored image fits a reply */

static char cb_names[2][LYNX_BACKEND_NAME_MAX] = {"cache", "db"};

/* An instance of an app that calls back end "db", started the way the
 * agent starts one (agent/instance.c): the backend's client_mqs first,
 * then a region of n_server + per * B mqueues in host memory (shm),
 * formatted and exported, then start through the ops table. The test is
 * the frontend: it writes requests and the back end's replies into the
 * mapped region by hand and reads requests and answers from it (ut_ring.h)
 * with its own producer and consumer positions. */
struct cinst {
  struct lynx_accel_dev dev;
  struct lynx_accel_launch l;
  struct lynx_region r;
  struct ut_region ur; /* r's memory and geometry, for ut_ring.h */
  struct lynx_accel_inst *run;
  struct fake_kernel *k;
  uint32_t per;
  uint32_t rx_prod[64], tx_cons[64]; /* the frontend's, per mqueue */
  char name[64];
  char why[320];
};

static int cinst_start(struct cinst *c, const char *app, uint32_t n_server,
                       uint32_t n_backends, uint32_t blocks) {
  uint32_t n;
  int rc, n0 = fake_cuda_kernels();
  char err[128];
  memset(c, 0, sizeof(*c));
  if (!c_ta) {
    c_shm = lynx_transport_find("shm");
    assert_int_equal(c_shm->agent_create(&(struct lynx_transport_opts){0},
                                         &c_ta, err, sizeof(err)),
                     0);
  }
  c->dev = (struct lynx_accel_dev){.ops = &lynx_accel_cuda,
                                   .own_memory = 0,
                                   .device = 0,
                                   .rdma_writes_ordering =
                                       cudaGPUDirectRDMAWritesOrderingOwner,
                                   .ordering = LYNX_ORDER_COALESCED};
  snprintf(c->dev.model, sizeof(c->dev.model), "Fake GPU 0");
  c->r.fd = -1;
  c->l = (struct lynx_accel_launch){.acc = &c->dev,
                                    .tops = c_shm,
                                    .tagent = c_ta,
                                    .name = "ut-gpu-client",
                                    .app = lynx_app_find(app),
                                    .n_server = n_server,
                                    .slots = CS,
                                    .slot_size = CZ,
                                    .ordering = LYNX_ORDER_COALESCED,
                                    .accel_id = ACCEL,
                                    .backends = cb_names + (2 - n_backends),
                                    .n_backends = n_backends,
                                    .epoch = EPOCH,
                                    .gpu_threads = 64,
                                    .gpu_blocks = blocks,
                                    .serve_until = &start_serve_until,
                                    .app_state = c_app_data};
  assert_non_null(c->l.app);
  rc = lynx_accel_cuda.client_mqs(&c->l, &c->per, c->why, sizeof(c->why));
  if (rc)
    return rc;
  n = n_server + n_backends * c->per;
  assert_int_equal(lynx_geom_init(&c->ur.g, n, CS, CZ, 0), 0);
  /* the process's own name: a run that failed half-way leaves no file
   * that a later one trips over */
  snprintf(c->name, sizeof(c->name), "ut-gpu-client-%d", (int)getpid());
  c->l.name = c->name;
  assert_int_equal(
      c_shm->region_alloc(c_ta, &c->r, c->name, c->ur.g.region_size), 0);
  assert_int_equal(lynx_region_format(&c->r, n, CS, CZ, 0, LYNX_ORDER_COALESCED,
                                      EPOCH, ACCEL),
                   0);
  assert_int_equal(c_shm->region_export(&c->r), 0);
  c->l.n_mqueues = n;
  c->l.region = c->r.base;
  c->ur.mem = c->r.base;
  rc = lynx_accel_cuda.start(&c->l, &c->r, &c->run, c->why, sizeof(c->why));
  if (rc) {
    c_shm->region_free(&c->r); /* the agent's, as instance.c does */
    return rc;
  }
  assert_int_equal(fake_cuda_kernels(), n0 + 1);
  c->k = fake_cuda_kernel(fake_cuda_kernels() - 1);
  return 0;
}

static void cinst_stop(struct cinst *c) {
  assert_int_equal(c->run->ops->stop(c->run), 0);
  c_shm->region_free(&c->r);
  c->run->ops->put(c->run);
  c->run = NULL;
}

/* Block b's client mqueue of back end k, as the kernel was told. */
static uint32_t cq_of(const struct cinst *c, uint32_t b, uint32_t k) {
  return lynx_cuda_client_mq(&c->k->l, b, k);
}

/* The frontend puts a request (server mqueue) or a back end's reply
 * (client mqueue) into q's RX ring. */
static void c_put(struct cinst *c, uint32_t q, uint32_t tag, uint16_t status,
                  const void *data, uint32_t len) {
  uint32_t pos = c->rx_prod[q]++;
  ut_put_raw(&c->ur, q, pos, tag, data, len,
             (uint16_t)(lynx_payload_off(CZ, len) / 16u), status,
             lynx_seq_for(pos));
}

/* The frontend takes the next TX slot of q within ms: 0 with its tag,
 * status and bytes (copied out, then the slot handed back), or -11. */
static int c_take(struct cinst *c, uint32_t q, uint32_t ms, uint32_t *tag,
                  uint16_t *status, uint8_t *buf, uint32_t *len) {
  uint64_t end = lynx_now_ns() + (uint64_t)ms * 1000000u;
  struct lynx_slot_meta m;
  const uint8_t *data;
  int rc;
  while ((rc = ut_get_tx(&c->ur, q, c->tx_cons[q], &m, &data)) == -11 &&
         lynx_now_ns() < end)
    usleep(200);
  if (rc)
    return rc;
  *tag = m.tag;
  *status = m.status;
  *len = m.len;
  memcpy(buf, data, m.len);
  c->tx_cons[q]++;
  lynx_store_release32(&ut_fctrl(&c->ur, q)->tx_cons, c->tx_cons[q]);
  return 0;
}

/* The kernel's request to the back end on client mqueue cq: its bytes must
 * be want; returns its tag. */
static uint32_t backend_sees(struct cinst *c, uint32_t cq, const char *want) {
  uint8_t buf[CZ];
  uint32_t tag = 0, len = 0;
  uint16_t st = 0;
  assert_int_equal(c_take(c, cq, 2000, &tag, &st, buf, &len), 0);
  assert_int_equal(st, LYNX_ST_OK);
  assert_int_equal(len, strlen(want));
  assert_memory_equal(buf, want, len);
  return tag;
}

/* The answer to the request with tag on server mqueue q: its bytes must be
 * want (wlen of them). */
static void answered(struct cinst *c, uint32_t q, uint32_t tag,
                     const void *want, uint32_t wlen, uint32_t ms) {
  uint8_t buf[CZ];
  uint32_t t = 0, len = 0;
  uint16_t st = 0;
  assert_int_equal(c_take(c, q, ms, &t, &st, buf, &len), 0);
  assert_int_equal(t, tag);
  assert_int_equal(st, LYNX_ST_OK);
  assert_int_equal(len, wlen);
  assert_memory_equal(buf, want, wlen);
}

static void nothing_on(struct cinst *c, uint32_t q) {
  uint8_t buf[CZ];
  uint32_t t, len;
  uint16_t st;
  assert_int_equal(c_take(c, q, 0, &t, &st, buf, &len), -11);
}

/* lenet on a GPU: the agent copies the weights it loaded into GPU memory
 * and gives the kernel their device address (none loaded: refused); the
 * kernel's answer (here the fake's, running lenet.h's per-element code as
 * apps.cu does) is the CPU inference's bit for bit, with the cookie; a
 * request of another size is dropped. */
static void test_lenet_gpu(void **state) {
  struct cinst c;
  struct lenet_model *m = NULL;
  uint8_t req[LENET_PIXELS + 4], want[LENET_RESP_MAX], buf[CZ];
  float logits[LENET_CLASSES];
  uint32_t wl, t = 0, len = 0;
  uint16_t st = 0;
  char why[320];
  (void)state;
  assert_int_equal(lenet_model_load(LENET_TEST_MODEL, &m, why, sizeof(why)), 0);
  c_app_data = NULL;
  assert_int_equal(cinst_start(&c, "lenet", 2, 0, 0), -ENOENT);
  assert_non_null(strstr(c.why, "no weights"));
  c_app_data = m;
  assert_int_equal(cinst_start(&c, "lenet", 2, 0, 0), 0);
  c_app_data = NULL;
  assert_int_equal(c.k->l.app, LYNX_CUDA_APP_LENET);
  assert_non_null(c.k->l.app_data);
  assert_true(fake_cuda_is_live(c.k->l.app_data));
  assert_memory_equal(c.k->l.app_data, m->params, sizeof(m->params));
  for (uint32_t i = 0; i < LENET_PIXELS; i++)
    req[i] = (uint8_t)((i * 37u + i / 28u) & 0xffu);
  memcpy(req + LENET_PIXELS, "ABCD", 4);
  wl = lenet_resp_encode(want, lenet_infer(m, req, logits), logits,
                         req + LENET_PIXELS, 4);
  c_put(&c, 1, 7, LYNX_ST_OK, req, sizeof(req));
  answered(&c, 1, 7, want, wl, 2000);
  c_put(&c, 0, 8, LYNX_ST_OK, req, 100);
  assert_int_equal(c_take(&c, 0, 2000, &t, &st, buf, &len), 0);
  assert_int_equal(t, 8);
  assert_int_equal(st, LYNX_ST_DROPPED);
  cinst_stop(&c);
  lenet_model_free(m);
}

#define MC_HELLO "VALUE k1 0 5\r\nhello\r\nEND\r\n"

/* mc-get on a GPU: the layout the agent gives the kernel (a client mqueue
 * of each back end for each block, the app's back end "db" found by name,
 * the call timeout), and the kernel's calls through each block's own
 * client mqueue with the frontend's relay played by hand: a hit, a miss,
 * an invalid key (no call), a back end down, a back end that never answers
 * (ERROR after the timeout, its late reply skipped by the next call), and
 * a stop while a call waits (the kernel stops, the request unanswered). */
static void test_client_mc_get(void **state) {
  struct cinst c;
  uint32_t t;
  uint64_t t0;
  int reg0;
  (void)state;
  fake_cuda_reset();
  fake.resident = 8;
  reg0 = fake_cuda_host_registered(); /* a hung kernel's stays (above) */
  assert_true(lynx_accel_cuda.runs_app(&gpu0, lynx_app_find("mc-get")));
  assert_int_equal(cinst_start(&c, "mc-get", 3, 2, 0), 0);
  /* 3 blocks (one per server mqueue); 3 client mqueues per back end */
  assert_int_equal(c.per, 3);
  assert_int_equal(c.k->l.app, LYNX_CUDA_APP_MC_GET);
  assert_int_equal(c.k->l.n_mqueues, 3 + 2 * 3);
  assert_int_equal(c.k->l.n_server, 3);
  assert_int_equal(c.k->l.blocks, 3);
  assert_int_equal(c.k->l.n_backends, 2);
  assert_int_equal(c.k->l.client_base, 3);
  assert_int_equal(c.k->l.app_backend, 1); /* "db", after "cache" */
  assert_int_equal(c.k->l.call_timeout_ns, LYNX_CALL_TIMEOUT_NS);
  assert_memory_equal(c.k->l.region, c.r.base, 64); /* our own mapping */
  assert_int_equal(cq_of(&c, 0, 1), 4);
  assert_int_equal(cq_of(&c, 1, 1), 6);
  assert_int_equal(cq_of(&c, 2, 1), 8);

  /* a hit on server mqueue 1: block 1 calls through its own client mqueue
   * of "db" (6), no other */
  c_put(&c, 1, 101, LYNX_ST_OK, "k1", 2);
  t = backend_sees(&c, 6, "get k1\r\n");
  for (uint32_t q = 3; q < 9; q++)
    if (q != 6)
      nothing_on(&c, q);
  c_put(&c, 6, t, LYNX_ST_OK, MC_HELLO, sizeof(MC_HELLO) - 1);
  answered(&c, 1, 101, "hello", 5, 2000);
  /* a miss on mqueue 0 (block 0, client mqueue 4): empty */
  c_put(&c, 0, 102, LYNX_ST_OK, "nokey", 5);
  t = backend_sees(&c, 4, "get nokey\r\n");
  c_put(&c, 4, t, LYNX_ST_OK, "END\r\n", 5);
  answered(&c, 0, 102, "", 0, 2000);
  /* an invalid key: ERROR, no call */
  c_put(&c, 2, 103, LYNX_ST_OK, "bad key", 7);
  answered(&c, 2, 103, "ERROR", 5, 2000);
  nothing_on(&c, 8);
  assert_int_equal(c.k->calls, 2);
  /* the back end down: the frontend answers the call BACKEND_DOWN */
  c_put(&c, 2, 104, LYNX_ST_OK, "k1", 2);
  t = backend_sees(&c, 8, "get k1\r\n");
  c_put(&c, 8, t, LYNX_ST_BACKEND_DOWN, NULL, 0);
  answered(&c, 2, 104, "ERROR", 5, 2000);
  assert_int_equal(c.k->last_call_rc, LYNX_CALL_EHOSTDOWN);
  /* an error reply from memcached */
  c_put(&c, 2, 105, LYNX_ST_OK, "k1", 2);
  t = backend_sees(&c, 8, "get k1\r\n");
  c_put(&c, 8, t, LYNX_ST_OK, "SERVER_ERROR busy\r\n", 19);
  answered(&c, 2, 105, "ERROR", 5, 2000);
  /* a back end that does not answer: ERROR after the call timeout */
  t0 = lynx_now_ns();
  c_put(&c, 1, 106, LYNX_ST_OK, "slow", 4);
  t = backend_sees(&c, 6, "get slow\r\n");
  answered(&c, 1, 106, "ERROR", 5, 3000);
  assert_true(lynx_now_ns() - t0 >= LYNX_CALL_TIMEOUT_NS);
  assert_int_equal(c.k->last_call_rc, LYNX_CALL_ETIMEDOUT);
  /* its reply comes late: the next call on that client mqueue skips it by
   * tag and takes its own */
  c_put(&c, 6, t, LYNX_ST_OK, MC_HELLO, sizeof(MC_HELLO) - 1);
  c_put(&c, 1, 107, LYNX_ST_OK, "k2", 2);
  {
    uint32_t t2 = backend_sees(&c, 6, "get k2\r\n");
    assert_int_not_equal(t2, t);
    c_put(&c, 6, t2, LYNX_ST_OK, "VALUE k2 0 3\r\nabc\r\nEND\r\n", 24);
  }
  answered(&c, 1, 107, "abc", 3, 2000);
  /* a reply too long for a slot */
  c_put(&c, 0, 108, LYNX_ST_OK, "big", 3);
  t = backend_sees(&c, 4, "get big\r\n");
  c_put(&c, 4, t, LYNX_ST_TOO_LONG, NULL, 0);
  answered(&c, 0, 108, "ERROR", 5, 2000);
  assert_int_equal(c.k->last_call_rc, LYNX_CALL_EMSGSIZE);
  /* a stop while a call waits: the kernel stops at once, unanswered */
  c_put(&c, 2, 109, LYNX_ST_OK, "k1", 2);
  backend_sees(&c, 8, "get k1\r\n");
  t0 = lynx_now_ns();
  assert_int_equal(c.run->ops->stop(c.run), 0);
  assert_true(lynx_now_ns() - t0 < LYNX_CALL_TIMEOUT_NS / 2);
  assert_int_equal(c.k->last_call_rc, LYNX_CALL_ECANCELED);
  assert_false(c.k->running);
  nothing_on(&c, 2);
  {
    uint64_t cn[4];
    assert_int_equal(
        c.run->ops->counters(c.run, &cn[0], &cn[1], &cn[2], &cn[3]), 0);
    assert_int_equal(cn[0], 9); /* requests taken */
    assert_int_equal(cn[1], 8); /* answered */
  }
  c_shm->region_free(&c.r);
  c.run->ops->put(c.run);
  calls_settle();
  assert_int_equal(fake_cuda_host_registered(), reg0);
  assert_int_equal(fake.unmapped_live, 0);
  assert_int_equal(fake.blocking_calls, 0);
}

/* face-verify on a GPU: the label's key to "db", the stored image from the
 * reply, the answer the CPU's face_verify gives (bit for bit), for a
 * genuine and an impostor probe on two blocks; ERROR for an unknown
 * label, a stored value that is not 1024 bytes, a malformed request (no
 * call) and a back end down. */
static void test_client_face_verify(void **state) {
  struct cinst c;
  uint8_t label[FACE_LABEL_LEN], probe[FACE_PIXELS], stored[FACE_PIXELS];
  uint8_t reqb[FACE_REQ_LEN], reply[CZ], want[FACE_RESP_LEN];
  char key[FACE_KEY_MAX], get[64], hdr[64];
  uint32_t t, n;
  (void)state;
  fake_cuda_reset();
  fake.resident = 8;
  assert_true(lynx_accel_cuda.runs_app(&gpu0, lynx_app_find("face-verify")));
  assert_int_equal(cinst_start(&c, "face-verify", 2, 1, 0), 0);
  assert_int_equal(c.per, 2);
  assert_int_equal(c.k->l.app, LYNX_CUDA_APP_FACE_VERIFY);
  assert_int_equal(c.k->l.n_mqueues, 4);
  assert_int_equal(c.k->l.app_backend, 0);
  for (uint32_t i = 0; i < 4; i++) {
    uint32_t q = i % 2, cq = cq_of(&c, q, 0), id = 40 + i;
    float d;
    /* genuine (even i) or an impostor's probe under id's label */
    face_label(7, id, label);
    face_probe(7, i % 2 ? face_impostor(7, id, 0, 1000) : id, 0, probe);
    face_image(7, id, stored);
    face_req_encode(reqb, label, probe);
    c_put(&c, q, 200 + i, LYNX_ST_OK, reqb, FACE_REQ_LEN);
    assert_true(face_key(label, key) > 0);
    snprintf(get, sizeof(get), "get %s\r\n", key);
    t = backend_sees(&c, cq, get);
    n = (uint32_t)snprintf(hdr, sizeof(hdr), "VALUE %s 0 %u\r\n", key,
                           FACE_PIXELS);
    memcpy(reply, hdr, n);
    memcpy(reply + n, stored, FACE_PIXELS);
    memcpy(reply + n + FACE_PIXELS, "\r\nEND\r\n", 7);
    c_put(&c, cq, t, LYNX_ST_OK, reply, n + FACE_PIXELS + 7);
    int match = face_verify(probe, stored, &d);
    face_resp_encode(want, match, d);
    answered(&c, q, 200 + i, want, FACE_RESP_LEN, 2000);
    assert_int_equal(want[0], i % 2 ? 0 : 1);
  }
  /* an unknown label: memcached's miss */
  c_put(&c, 0, 300, LYNX_ST_OK, reqb, FACE_REQ_LEN);
  t = backend_sees(&c, cq_of(&c, 0, 0), get);
  c_put(&c, cq_of(&c, 0, 0), t, LYNX_ST_OK, "END\r\n", 5);
  answered(&c, 0, 300, "ERROR", 5, 2000);
  /* a stored value of 1000 bytes */
  c_put(&c, 1, 301, LYNX_ST_OK, reqb, FACE_REQ_LEN);
  t = backend_sees(&c, cq_of(&c, 1, 0), get);
  n = (uint32_t)snprintf(hdr, sizeof(hdr), "VALUE %s 0 1000\r\n", key);
  memcpy(reply, hdr, n);
  memcpy(reply + n, stored, 1000);
  memcpy(reply + n + 1000, "\r\nEND\r\n", 7);
  c_put(&c, cq_of(&c, 1, 0), t, LYNX_ST_OK, reply, n + 1000 + 7);
  answered(&c, 1, 301, "ERROR", 5, 2000);
  /* malformed: too short, a label with a space inside; no call */
  n = (uint32_t)c.k->calls;
  c_put(&c, 0, 302, LYNX_ST_OK, reqb, 100);
  answered(&c, 0, 302, "ERROR", 5, 2000);
  reqb[3] = ' ';
  c_put(&c, 1, 303, LYNX_ST_OK, reqb, FACE_REQ_LEN);
  answered(&c, 1, 303, "ERROR", 5, 2000);
  assert_int_equal(c.k->calls, n);
  /* the back end down */
  face_req_encode(reqb, label, probe);
  c_put(&c, 1, 304, LYNX_ST_OK, reqb, FACE_REQ_LEN);
  t = backend_sees(&c, cq_of(&c, 1, 0), get);
  c_put(&c, cq_of(&c, 1, 0), t, LYNX_ST_BACKEND_DOWN, NULL, 0);
  answered(&c, 1, 304, "ERROR", 5, 2000);
  cinst_stop(&c);
}

/* How many client mqueues a GPU instance gets per back end, and the
 * refusals: a kernel's blocks each need one of every back end within a
 * region's 1,024 mqueues (auto takes fewer blocks, --gpu-blocks beyond
 * is refused, fewer than the server mqueues need is refused); an app
 * whose kernel calls nothing gets one (unused); relay has no kernel; a
 * region laid out for other blocks is refused before any launch. */
static void test_client_layout(void **state) {
  struct cinst c;
  struct lynx_accel_launch l;
  uint32_t per = 0;
  int n0;
  (void)state;
  fake_cuda_reset();
  fake.resident = 2000;
  memset(&c, 0, sizeof(c));
  l = (struct lynx_accel_launch){.acc = &c.dev,
                                 .app = lynx_app_find("mc-get"),
                                 .n_server = 900,
                                 .backends = cb_names,
                                 .n_backends = 2,
                                 .slots = CS,
                                 .slot_size = CZ,
                                 .gpu_threads = 64};
  c.dev.device = 0;
  /* 900 + 2 x 62 = 1,024: 62 blocks instead of one per SM (132) */
  assert_int_equal(lynx_accel_cuda.client_mqs(&l, &per, c.why, sizeof(c.why)),
                   0);
  assert_int_equal(per, 62);
  l.gpu_blocks = 63;
  assert_int_equal(lynx_accel_cuda.client_mqs(&l, &per, c.why, sizeof(c.why)),
                   -EINVAL);
  assert_contains(c.why, "exceed a region's 1024 mqueues");
  l.gpu_blocks = 0;
  l.n_server = 1000; /* 16 blocks needed, room for 12 */
  assert_int_equal(lynx_accel_cuda.client_mqs(&l, &per, c.why, sizeof(c.why)),
                   -EINVAL);
  l.n_server = 4; /* one per server mqueue */
  assert_int_equal(lynx_accel_cuda.client_mqs(&l, &per, c.why, sizeof(c.why)),
                   0);
  assert_int_equal(per, 4);
  fake.resident = 2;
  assert_int_equal(lynx_accel_cuda.client_mqs(&l, &per, c.why, sizeof(c.why)),
                   0);
  assert_int_equal(per, 2);
  /* echo calls nothing: one each, and a kernel told of none */
  l.app = lynx_app_find("echo");
  assert_int_equal(lynx_accel_cuda.client_mqs(&l, &per, c.why, sizeof(c.why)),
                   0);
  assert_int_equal(per, 1);
  fake.resident = 8;
  assert_int_equal(cinst_start(&c, "echo", 2, 2, 0), 0);
  assert_int_equal(c.k->l.n_mqueues, 4);
  assert_int_equal(c.k->l.n_backends, 0);
  cinst_stop(&c);
  /* relay's CPU handler calls a back end, it has no kernel */
  assert_false(lynx_accel_cuda.runs_app(&gpu0, lynx_app_find("relay")));
  n0 = fake_cuda_kernels();
  assert_int_equal(cinst_start(&c, "relay", 2, 1, 0), -ENOTSUP);
  assert_contains(c.why, "has no CUDA kernel");
  assert_int_equal(fake_cuda_kernels(), n0);
  /* a region laid out for other blocks: 2 + 3 mqueues with 2 blocks */
  {
    struct inst in;
    struct lynx_region r = {.fd = -1};
    struct gpu_instance *gi = NULL;
    char err[256] = "";
    memset(&in, 0, sizeof(in));
    in.dev = (struct lynx_accel_dev){.ops = &lynx_accel_cuda, .own_memory = 1};
    l = (struct lynx_accel_launch){.acc = &in.dev,
                                   .name = "ut-gpu-bad",
                                   .tops = T,
                                   .tagent = g_ta,
                                   .app = lynx_app_find("mc-get"),
                                   .n_mqueues = 5,
                                   .n_server = 2,
                                   .backends = cb_names + 1,
                                   .n_backends = 1,
                                   .slots = CS,
                                   .slot_size = CZ,
                                   .gpu_threads = 64,
                                   .epoch = EPOCH,
                                   .serve_until = &start_serve_until};
    assert_int_equal(gpu_instance_start(&l, &r, &gi, err, sizeof(err)),
                     -EINVAL);
    assert_contains(err, "client mqueue layout");
    /* "db" is not among its back ends */
    l.n_mqueues = 4;
    l.backends = cb_names;
    assert_int_equal(gpu_instance_start(&l, &r, &gi, err, sizeof(err)),
                     -EINVAL);
    assert_contains(err, "needs a back end named 'db'");
    assert_int_equal(fake_cuda_kernels(), n0);
  }
}

/* Every test starts with GPUS fake GPUs, no injection, no records. */
/* ---- GPU applications as CUDA modules (cuda_module.c) -------------------- */

/* The host twin of the example's handler (examples/vector-sum-gpu), over
 * the same request and answer code, for the fake kernel. */
static int vector_sum_twin(const struct lynx_cuda_launch *l, const uint8_t *req,
                           uint32_t len, uint8_t *out, uint32_t cap) {
  (void)l;
  return cap < VS_ANSWER_LEN ? -1 : (int)vs_reference(req, len, out);
}

/* The module at PLUGINS/file read (as NAME=PATH when name) and offered to
 * the CUDA backend for GPU 0: adopt's result, its reason in why. */
static int module_adopt(const char *name, const char *file, char *why,
                        size_t whylen) {
  struct lynx_accel_dev dev = {.ops = &lynx_accel_cuda, .device = 0};
  char path[512];
  struct lynx_app *app;
  snprintf(path, sizeof(path), "%s/%s", PLUGINS_DIR, file);
  if (lynx_app_load_module(name, path, why, whylen))
    return -1000;
  app = lynx_app_module_at(0);
  assert_non_null(app);
  return lynx_accel_cuda.adopt(&dev, 1, app, why, whylen);
}

/* The answer in TX slot pos of mqueue q, once there: its bytes into out. */
static uint32_t answer_at(struct inst *in, uint32_t q, uint32_t pos,
                          uint32_t tag, uint8_t *out) {
  uint8_t slot[Z];
  struct lynx_slot_meta got;
  tx_wait(in, q, pos, slot);
  memcpy(&got, slot + Z - LYNX_META_SIZE, sizeof(got));
  assert_int_equal(got.seq, lynx_seq_for(pos));
  assert_int_equal(got.tag, tag);
  assert_int_equal(got.status, LYNX_ST_OK);
  memcpy(out, slot + got.off16 * 16u, got.len);
  return got.len;
}

/*
 * The example's fatbin (built by nvcc for sm_80 and sm_90 from
 * examples/vector-sum-gpu, as a user builds it) loaded through the driver
 * API as the agent loads it: its description read from the cubin for this
 * GPU, the name it gives itself, the occupancy of its own kernel, the
 * narrow kernel launched by name for 64 threads a block and the wide one
 * for 1,024, the service's configuration in device memory, and every
 * answer the (twin of the) handler gives.
 */
static void test_gpu_module(void **state) {
  struct inst in;
  const struct lynx_app *app;
  const uint32_t v[4] = {1, 2, 3, 0xFFFFFFFFu};
  uint8_t got[Z], want[VS_ANSWER_LEN];
  char why[512] = "";
  (void)state;
  fake.module_handler = vector_sum_twin;
  assert_int_equal(module_adopt(NULL, "vector-sum.fatbin", why, sizeof(why)),
                   0);
  app = lynx_app_find("vector-sum");
  assert_non_null(app);
  assert_non_null(app->module);
  assert_string_equal(app->help, "the sum of a vector of 32-bit integers");
  assert_null(app->needs_backend);
  assert_string_equal(app->image_code, LYNX_FATBIN_CODE);
  assert_true(lynx_accel_cuda.runs_app(&gpu0, app));
  assert_false(lynx_accel_cpu.runs_app(&gpu0, app));
  assert_int_equal(fake.library_loads, 1);
  assert_int_equal(fake.get_functions, 2); /* both kernels, GPU 0 */

  start_app = "vector-sum";
  start_config = "{\"scale\":2}";
  assert_int_equal(inst_start(&in, 0, T, 2, 2, EPOCH), 0);
  assert_non_null(in.k);
  assert_string_equal(in.k->function, "lynx_gpu_kernel");
  assert_int_equal(in.k->l.app, LYNX_CUDA_APP_NONE);
  assert_int_equal(in.k->l.calls, 0);
  assert_int_equal(fake.module_launches, 1);
  assert_int_equal(fake.launches, 0); /* not the built-in kernel */
  assert_true(fake.occupancy_queries >= 1);
  assert_int_equal(in.k->l.config_len, strlen(start_config));
  assert_true(fake_cuda_is_live(in.k->l.config));
  assert_string_equal(in.k->l.config, start_config);
  inst_connect(&in);
  request_bytes(&in, 1, 0, v, sizeof(v), 0x51);
  assert_int_equal(answer_at(&in, 1, 0, 0x51, got), VS_ANSWER_LEN);
  vs_answer(want, 4, 6ull + 0xFFFFFFFFull);
  assert_memory_equal(got, want, VS_ANSWER_LEN);
  request_bytes(&in, 0, 0, "abc", 3, 0x52); /* not a vector */
  assert_int_equal(answer_at(&in, 0, 0, 0x52, got), VS_ERROR_LEN);
  assert_memory_equal(got, VS_ERROR, VS_ERROR_LEN);
  assert_int_equal(gpu_instance_stop(in.gi), 0);
  inst_drop(&in);

  /* wider blocks run the wide kernel, and the app's default config */
  start_threads = 1024;
  start_config = NULL;
  assert_int_equal(inst_start(&in, 0, T, 2, 2, EPOCH + 1), 0);
  assert_string_equal(in.k->function, "lynx_gpu_kernel_wide");
  assert_string_equal(in.k->l.config, "{}");
  assert_int_equal(gpu_instance_stop(in.gi), 0);
  inst_drop(&in);
  start_threads = 64;

  /* a launch the driver refuses fails the start with its reason */
  fake.err_module_launch = CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
  assert_int_not_equal(inst_start(&in, 0, T, 2, 2, EPOCH + 2), 0);
  assert_contains(in.err, "launch of 'vector-sum''s persistent kernel");
  fake.err_module_launch = CUDA_SUCCESS;
  /* so does a module's kernel that no block of fits an SM */
  fake.module_per_sm = -1;
  assert_int_not_equal(inst_start(&in, 0, T, 2, 2, EPOCH + 3), 0);
  assert_contains(in.err, "cannot run 'vector-sum''s kernel");
  fake.module_per_sm = 0;
  start_app = "echo";
  lynx_accel_cuda.shutdown();
  assert_int_equal(fake.library_unloads, 1);
  lynx_apps_unload();
}

/* GPUs of two kinds, the module with code for one: taken, run and placed
 * on that one only; a start on the other refused with the reason. */
static void test_gpu_module_mixed(void **state) {
  struct lynx_accel_dev devs[2] = {{.ops = &lynx_accel_cuda, .device = 0},
                                   {.ops = &lynx_accel_cuda, .device = 1}};
  char why[512] = "", path[512];
  const struct lynx_app *app;
  struct inst in;
  (void)state;
  fake.module_handler = vector_sum_twin;
  fake.gpu[1].major = 8;
  fake.gpu[1].minor = 6;
  snprintf(path, sizeof(path), "%s/vector-sum.fatbin", PLUGINS_DIR);
  assert_int_equal(lynx_app_load_module(NULL, path, why, sizeof(why)), 0);
  assert_int_equal(
      lynx_accel_cuda.adopt(devs, 2, lynx_app_module_at(0), why, sizeof(why)),
      0);
  app = lynx_app_find("vector-sum");
  assert_non_null(app);
  assert_true(lynx_accel_cuda.runs_app(&devs[0], app));
  assert_false(lynx_accel_cuda.runs_app(&devs[1], app));
  start_app = "vector-sum";
  assert_int_equal(inst_start(&in, 0, T, 2, 2, EPOCH), 0);
  assert_int_equal(gpu_instance_stop(in.gi), 0);
  inst_drop(&in);
  assert_int_equal(inst_start(&in, 1, T, 2, 2, EPOCH + 1), -ENOEXEC);
  assert_contains(in.err, "GPU application 'vector-sum' cannot run on GPU 1: "
                          "no code for GPU 1 (compute 8.6)");
  start_app = "echo";
  fake.gpu[1].major = 9;
  fake.gpu[1].minor = 0;
  lynx_accel_cuda.shutdown();
  lynx_apps_unload();
}

/* Each bad module refused with its reason: another GPU ABI, no Lynx
 * kernel, no code for this GPU, a name other than the one given, a module
 * the driver refuses, a truncated fatbin. */
static void test_gpu_module_refused(void **state) {
  char why[512] = "", path[512], trunc[512];
  uint8_t buf[4096];
  FILE *f;
  size_t n;
  (void)state;
  assert_int_equal(module_adopt(NULL, "gpu-bad-abi.fatbin", why, sizeof(why)),
                   -EPROTO);
  assert_contains(why, "built for GPU ABI version 99; this agent's is 1");
  /* the agent drops it (adopt_modules): gone, its refusal kept */
  lynx_app_drop(lynx_app_module_at(0), why);
  assert_null(lynx_app_find("gpu-bad-abi"));
  assert_null(lynx_app_module_at(0));
  assert_non_null(lynx_app_refusal("gpu-bad-abi"));
  assert_contains(lynx_app_refusal("gpu-bad-abi"), "GPU ABI version 99");
  lynx_apps_unload();
  assert_int_equal(module_adopt(NULL, "gpu-no-info.fatbin", why, sizeof(why)),
                   -ENOENT);
  assert_contains(why, "no kernel lynx_gpu_kernel: not a Lynx GPU module");
  lynx_apps_unload();
  fake.gpu[0].major = 8;
  fake.gpu[0].minor = 6;
  assert_int_equal(module_adopt(NULL, "vector-sum.fatbin", why, sizeof(why)),
                   -ENOEXEC);
  assert_contains(
      why,
      "no code for GPU 0 (compute 8.6): the module holds " LYNX_FATBIN_CODE);
  fake.gpu[0].major = 9;
  fake.gpu[0].minor = 0;
  lynx_apps_unload();
  assert_int_equal(module_adopt("other", "vector-sum.fatbin", why, sizeof(why)),
                   -EINVAL);
  assert_contains(why, "its module's application is 'vector-sum', not 'other'");
  lynx_apps_unload();
  assert_int_equal(module_adopt("echo", "vector-sum.fatbin", why, sizeof(why)),
                   -1000);
  assert_contains(why, "'echo' is the name of a built-in application");
  lynx_apps_unload();
  /* the same module twice: the second clashes with the first */
  assert_int_equal(module_adopt(NULL, "vector-sum.fatbin", why, sizeof(why)),
                   0);
  assert_int_equal(module_adopt(NULL, "vector-sum.fatbin", why, sizeof(why)),
                   -1000);
  assert_contains(why, "application 'vector-sum' is already loaded from ");
  lynx_accel_cuda.shutdown();
  lynx_apps_unload();
  fake.err_library_load = CUDA_ERROR_INVALID_IMAGE;
  assert_int_equal(module_adopt(NULL, "vector-sum.fatbin", why, sizeof(why)),
                   -EIO);
  assert_contains(why, "the CUDA driver refused the module");
  fake.err_library_load = CUDA_SUCCESS;
  lynx_apps_unload();
  /* the first 4 KiB of it: its header says more */
  snprintf(path, sizeof(path), "%s/vector-sum.fatbin", PLUGINS_DIR);
  snprintf(trunc, sizeof(trunc), "%s/ut-truncated-%d.fatbin", PLUGINS_DIR,
           (int)getpid());
  f = fopen(path, "rb");
  assert_non_null(f);
  n = fread(buf, 1, sizeof(buf), f);
  fclose(f);
  f = fopen(trunc, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(buf, 1, n, f), n);
  fclose(f);
  assert_int_equal(lynx_app_load_module(NULL, trunc, why, sizeof(why)),
                   -ENOEXEC);
  assert_contains(why, "a truncated CUDA fatbin");
  unlink(trunc);
  assert_null(lynx_app_module_at(0));
  lynx_apps_unload();
}

static int setup(void **state) {
  (void)state;
  fake_cuda_gpus(GPUS);
  fake_cuda_reset();
  /* a case starts with every GPU's budget whole: blocks an earlier case's
   * hung kernel still holds are its business (all cases in one process) */
  for (int d = 0; d < GPUS; d++)
    lynx__cuda_blocks_hold(d, lynx__cuda_blocks_held(d), 0);
  return 0;
}

#define T_(fn) cmocka_unit_test_setup(fn, setup)

/* PCI_SYSFS (this build's own tree): GPU 1 of test_discovery, bus
 * 0000:c1:00.0, on NUMA node 1; 0000:17:00.0 has no entry. Written whole
 * through a rename: cases run in parallel processes. */
static void make_sysfs(void) {
  char path[512], tmp[560];
  FILE *f;
  snprintf(path, sizeof(path), "%s", PCI_SYSFS);
  mkdir(path, 0755);
  snprintf(path, sizeof(path), "%s/0000:c1:00.0", PCI_SYSFS);
  mkdir(path, 0755);
  snprintf(path, sizeof(path), "%s/0000:c1:00.0/numa_node", PCI_SYSFS);
  snprintf(tmp, sizeof(tmp), "%s.%d", path, (int)getpid());
  f = fopen(tmp, "w");
  if (f) {
    fputs("1\n", f);
    fclose(f);
    rename(tmp, path);
  }
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      T_(test_discovery),
      T_(test_instance_over_tcp),
      T_(test_stop_reuse_shutdown),
      T_(test_hung_kernel),
      T_(test_blocks),
      T_(test_residency),
      T_(test_idle_backoff),
      T_(test_block_budget),
      T_(test_clock_drift),
      T_(test_clock_step),
      T_(test_lenet_gpu),
      T_(test_health),
      T_(test_no_device_sync),
      T_(test_rdma_registration),
      T_(test_failures_clean_up),
      T_(test_lease_fence),
      T_(test_host_region_shm),
      T_(test_calls_off_agent_thread),
      T_(test_host_region_tcp_failures),
      T_(test_staging_batches),
      T_(test_staging_wrap),
      T_(test_staging_limits_failures),
      T_(test_staging_over_tcp),
      T_(test_push_from_gpu_memory),
      T_(test_client_mc_get),
      T_(test_client_face_verify),
      T_(test_client_layout),
      T_(test_gpu_module),
      T_(test_gpu_module_refused),
      T_(test_gpu_module_mixed),
  };
  make_sysfs();
  return LYNX_UT_MAIN(argc, argv, "tests", tests, group_setup, group_teardown);
}
