/*
 * gen_seeds.c - writes the seed corpora of tests/fuzz/corpus/: for each
 * harness a few small, valid inputs (and some just off valid), built with
 * the project's own encoders (proto/frame.h, lynx_region_format) so they
 * stay what the daemons send. Run it after a wire format changes and
 * commit what changed:
 *
 *   build/bin/fuzz_seeds tests/fuzz/corpus models/lenet-fashion.bin
 *
 * Files are named seed-*; reproducers of crashes (crash-*, docs/fuzzing.md)
 * sit beside them and are never written here.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "app_logic.h"
#include "desc.h"
#include "face.h"
#include "frame.h"
#include "lenet_model.h"
#include "tcp_fuzz.h"
#include "transport.h"

static const char *out_dir;
static int failed;

/* A growing byte string. */
struct bs {
  uint8_t *p;
  size_t n, cap;
};

static void put(struct bs *b, const void *p, size_t n) {
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + n)
      cap *= 2;
    b->p = realloc(b->p, cap);
    if (!b->p) {
      perror("gen_seeds");
      exit(1);
    }
    b->cap = cap;
  }
  memcpy(b->p + b->n, p, n);
  b->n += n;
}

static void put_u8(struct bs *b, uint8_t v) { put(b, &v, 1); }
static void put_be16(struct bs *b, uint16_t v) {
  uint8_t x[2] = {(uint8_t)(v >> 8), (uint8_t)v};
  put(b, x, 2);
}
static void put_be32(struct bs *b, uint32_t v) {
  put_be16(b, (uint16_t)(v >> 16));
  put_be16(b, (uint16_t)v);
}
static void put_str(struct bs *b, const char *s) { put(b, s, strlen(s)); }

/* Writes b as out_dir/harness/seed-name and empties b. */
static void emit(struct bs *b, const char *harness, const char *name) {
  char path[4096];
  FILE *f;
  snprintf(path, sizeof(path), "%s/%s", out_dir, harness);
  mkdir(path, 0755);
  snprintf(path, sizeof(path), "%s/%s/seed-%s", out_dir, harness, name);
  f = fopen(path, "wb");
  if (!f || fwrite(b->p, 1, b->n, f) != b->n || fclose(f)) {
    fprintf(stderr, "gen_seeds: %s: %s\n", path, strerror(errno));
    failed = 1;
  }
  b->n = 0;
}

/* ---- back-end replies and TCP services --------------------------------- */

static void beframe(void) {
  struct bs b = {0};
  static const char *const mc[][2] = {
      {"end", "END\r\n"},
      {"hit", "VALUE k 0 5\r\nhello\r\nEND\r\n"},
      {"two", "VALUE a 0 1\r\nx\r\nVALUE b 7 2\r\nyz\r\nEND\r\nSTORED\r\n"},
      {"crlf", "VALUE k 7 4 99\r\n\r\n\r\n\r\nEND\r\n"},
      {"errors", "SERVER_ERROR out of memory\r\nERROR\r\nCLIENT_ERROR x\r\n"},
      {"partial", "VALUE key 0 10\r\nhel"},
  };
  for (size_t i = 0; i < sizeof(mc) / sizeof(mc[0]); i++) {
    put_u8(&b, 0);
    put_str(&b, mc[i][1]);
    emit(&b, "beframe", mc[i][0]);
  }
  put_u8(&b, 1);
  put_be32(&b, 5);
  put_str(&b, "hello");
  put_be32(&b, 0);
  put_be32(&b, 3);
  put_str(&b, "ab");
  emit(&b, "beframe", "len32");
  free(b.p);
}

static void tcpsvc_seed(const char *name, uint16_t fixed, uint32_t cap,
                        uint8_t step, const char *const *msgs, size_t n) {
  struct bs b = {0};
  put_be16(&b, fixed);
  put_be32(&b, cap);
  put_u8(&b, step);
  for (size_t i = 0; i < n; i++) {
    if (!fixed)
      put_be32(&b, (uint32_t)strlen(msgs[i]));
    put_str(&b, msgs[i]);
  }
  emit(&b, "tcpsvc", name);
  free(b.p);
}

static void tcpsvc(void) {
  static const char *const m[] = {"hello", "", "a longer request of a client"};
  static const char *const f16[] = {"0123456789abcdef", "fedcba9876543210",
                                    "partial"};
  tcpsvc_seed("len32", 0, 0, 0, m, 3);
  tcpsvc_seed("len32-bytewise", 0, 2032, 1, m, 3);
  tcpsvc_seed("len32-oversize", 0, 8, 0, m + 2, 1);
  tcpsvc_seed("fixed16", 16, 0, 7, f16, 3);
}

/* ---- control connections ----------------------------------------------- */

static void frame(struct bs *b, const Lynx__Envelope *env) {
  uint8_t *p;
  size_t n;
  if (lynx_frame_encode(env, SIZE_MAX, &p, &n)) {
    fprintf(stderr, "gen_seeds: cannot encode\n");
    exit(1);
  }
  put(b, p, n);
  free(p);
}

/* A descriptor of the ctl_coordinator harness's service: 2 mqueues of 16
 * slots of 2 KiB. */
static void region_pb(Lynx__RegionDesc *pb, struct lynx_region_desc *d,
                      const char *transport, uint32_t accel) {
  struct lynx_geom g;
  lynx_geom_init(&g, 2, 16, 2048, 0);
  memset(d, 0, sizeof(*d));
  d->accel_id = accel;
  snprintf(d->transport, sizeof(d->transport), "%s", transport);
  snprintf(d->locator, sizeof(d->locator), "127.0.0.1:7701");
  d->region_size = g.region_size;
  d->epoch = 1;
  d->n_mqueues = 2;
  d->slots = 16;
  d->slot_size = 2048;
  d->key = 0x1234;
  d->rkeys[0] = 1;
  d->rkeys[1] = 2;
  d->rkeys[2] = 3;
  lynx_desc_to_pb(d, pb);
}

struct msgs {
  Lynx__Hello hello;
  Lynx__InstanceEpoch ie, *ies[1];
  Lynx__HelloReply hello_reply;
  Lynx__RegionDesc rd[2], *rds[2];
  struct lynx_region_desc d[2];
  Lynx__Descriptors descriptors;
  Lynx__Label label, *labels[1];
  char *apps[2];
  Lynx__AccelInfo ai[2], *ais[2];
  Lynx__InstanceInfo ii, *iis[1];
  Lynx__Register reg;
  Lynx__RegisterReply register_reply;
  Lynx__AccelCounters ac, *acs[1];
  Lynx__Heartbeat hb;
  Lynx__HeartbeatReply hb_reply;
  Lynx__Leave leave;
  Lynx__Backend be, *bes[1];
  Lynx__ServiceSpec spec;
  Lynx__StartInstance start;
  Lynx__StopInstance stop;
  Lynx__InstanceReady ready;
  Lynx__InstanceFailed failed;
  Lynx__TableEntry te, *tes[1];
  Lynx__ServiceTable st, *sts[1];
  Lynx__DispatchTable table;
  Lynx__MqueueReport mr, *mrs[1];
  Lynx__ServiceListen sl[2], *sls[2];
  Lynx__FrontendStatus status;
  Lynx__FrontendStatusReply status_reply;
};

/* One of each message, as the daemons fill them. */
static void msgs_init(struct msgs *m) {
  memset(m, 0, sizeof(*m));
  lynx__hello__init(&m->hello);
  m->hello.proto_version = LYNX_PROTO_VERSION;
  m->hello.role = "agent";
  m->hello.id = "node-1";
  m->hello.token = "";
  lynx__instance_epoch__init(&m->ie);
  m->ie.instance_id = 1;
  m->ie.epoch = 3;
  m->ies[0] = &m->ie;
  lynx__hello_reply__init(&m->hello_reply);
  m->hello_reply.proto_version = LYNX_PROTO_VERSION;
  m->hello_reply.ok = 1;
  m->hello_reply.error = "";
  m->hello_reply.id = "coordinator";
  region_pb(&m->rd[0], &m->d[0], "tcp", 0);
  region_pb(&m->rd[1], &m->d[1], "rdma", 1);
  m->rds[0] = &m->rd[0];
  m->rds[1] = &m->rd[1];
  lynx__descriptors__init(&m->descriptors);
  m->descriptors.node_id = "node-1";
  m->descriptors.epoch = 1;
  m->descriptors.app = "sockperf-echo";
  m->descriptors.service = "svc";
  m->descriptors.n_regions = 2;
  m->descriptors.regions = m->rds;
  lynx__label__init(&m->label);
  m->label.key = "zone";
  m->label.value = "a";
  m->labels[0] = &m->label;
  m->apps[0] = "sockperf-echo";
  m->apps[1] = "echo";
  for (int i = 0; i < 2; i++) {
    lynx__accel_info__init(&m->ai[i]);
    m->ai[i].idx = (uint32_t)i;
    m->ai[i].kind = "cpu";
    m->ai[i].model = "cpu-emulated";
    m->ai[i].memory_bytes = 1u << 30;
    m->ai[i].n_apps = 2;
    m->ai[i].apps = m->apps;
    m->ais[i] = &m->ai[i];
  }
  lynx__instance_info__init(&m->ii);
  m->ii.instance_id = 7;
  m->ii.service = "svc";
  m->ii.accel_idx = 0;
  m->ii.region = &m->rd[0];
  m->iis[0] = &m->ii;
  lynx__register__init(&m->reg);
  m->reg.node_id = "node-1";
  m->reg.address = "127.0.0.1";
  m->reg.n_labels = 1;
  m->reg.labels = m->labels;
  m->reg.n_accels = 2;
  m->reg.accels = m->ais;
  lynx__register_reply__init(&m->register_reply);
  m->register_reply.ok = 1;
  m->register_reply.error = "";
  m->register_reply.lease_ms = 3000;
  m->register_reply.fence_ms = 8000;
  m->register_reply.acks_heartbeats = 1;
  m->register_reply.epoch = 1;
  lynx__accel_counters__init(&m->ac);
  m->ac.idx = 0;
  m->ac.requests = 10;
  m->ac.responses = 9;
  m->ac.last_error = "";
  m->ac.window_requests = 9;
  m->ac.queue_p50_ns = 1000;
  m->acs[0] = &m->ac;
  lynx__heartbeat__init(&m->hb);
  m->hb.node_id = "node-1";
  m->hb.epoch = 1;
  m->hb.healthy = 1;
  m->hb.n_counters = 1;
  m->hb.counters = m->acs;
  lynx__heartbeat_reply__init(&m->hb_reply);
  m->hb_reply.epoch = 1;
  lynx__leave__init(&m->leave);
  m->leave.node_id = "node-1";
  m->leave.epoch = 1;
  lynx__backend__init(&m->be);
  m->be.name = "db";
  m->be.address = "127.0.0.1:11211";
  m->be.proto = "memcached";
  m->bes[0] = &m->be;
  lynx__service_spec__init(&m->spec);
  m->spec.name = "svc";
  m->spec.proto = "udp";
  m->spec.port = 7000;
  m->spec.app = "mc-get";
  m->spec.slot_size = 2048;
  m->spec.slots = 16;
  m->spec.mqueues_per_accel = 2;
  m->spec.n_backends = 1;
  m->spec.backends = m->bes;
  m->spec.msg_max = 2032;
  lynx__start_instance__init(&m->start);
  m->start.instance_id = 1;
  m->start.service = &m->spec;
  lynx__stop_instance__init(&m->stop);
  m->stop.instance_id = 1;
  lynx__instance_ready__init(&m->ready);
  m->ready.node_id = "node-1";
  m->ready.epoch = 1;
  m->ready.instance_id = 1;
  m->ready.region = &m->rd[0];
  lynx__instance_failed__init(&m->failed);
  m->failed.node_id = "node-1";
  m->failed.epoch = 1;
  m->failed.instance_id = 2;
  m->failed.error = "cannot map the region";
  lynx__table_entry__init(&m->te);
  m->te.instance_id = 1;
  m->te.node_id = "node-1";
  m->te.region = &m->rd[0];
  m->te.epoch = 2;
  m->tes[0] = &m->te;
  lynx__service_table__init(&m->st);
  m->st.service = &m->spec;
  m->st.n_entries = 1;
  m->st.entries = m->tes;
  m->sts[0] = &m->st;
  lynx__dispatch_table__init(&m->table);
  m->table.version = 2;
  m->table.n_services = 1;
  m->table.services = m->sts;
  m->table.frontend_epoch = 2;
  lynx__mqueue_report__init(&m->mr);
  m->mr.instance_id = 1;
  m->mr.q = 1;
  m->mr.outstanding = 3;
  m->mr.dispatched = 10;
  m->mr.responded = 7;
  m->mrs[0] = &m->mr;
  for (int i = 0; i < 2; i++) {
    lynx__service_listen__init(&m->sl[i]);
    m->sl[i].service = i ? "svc2" : "svc";
    m->sl[i].listening = !i;
    m->sl[i].error = i ? "cannot bind UDP 0.0.0.0:7000: Address in use" : "";
    m->sls[i] = &m->sl[i];
  }
  lynx__frontend_status__init(&m->status);
  m->status.frontend_id = "fe-1";
  m->status.table_version = 2;
  m->status.n_mqueues = 1;
  m->status.mqueues = m->mrs;
  m->status.n_services = 2;
  m->status.services = m->sls;
  lynx__frontend_status_reply__init(&m->status_reply);
  m->status_reply.table_version = 2;
}

/* Appends to b the frame of an Envelope carrying msg in field. */
#define FRAME(b, field, kase, msg)                                             \
  do {                                                                         \
    Lynx__Envelope e_ = LYNX__ENVELOPE__INIT;                                  \
    e_.msg_case = LYNX__ENVELOPE__MSG_##kase;                                  \
    e_.field = (msg);                                                          \
    frame((b), &e_);                                                           \
  } while (0)

/* An agent's first three messages: Hello, Register, Heartbeat. */
static void agent_start(struct bs *b, struct msgs *m) {
  FRAME(b, hello, HELLO, &m->hello);
  FRAME(b, register_, REGISTER, &m->reg);
  FRAME(b, heartbeat, HEARTBEAT, &m->hb);
}

static void ctl(void) {
  struct msgs m;
  struct bs b = {0};
  msgs_init(&m);
  /* ctl_frame: every message alone, after a byte of flags (trusted) */
#define ONE(name, field, kase, msg)                                            \
  do {                                                                         \
    put_u8(&b, 16);                                                            \
    FRAME(&b, field, kase, msg);                                               \
    emit(&b, "ctl_frame", name);                                               \
  } while (0)
  ONE("hello", hello, HELLO, &m.hello);
  ONE("hello-reply", hello_reply, HELLO_REPLY, &m.hello_reply);
  ONE("descriptors", descriptors, DESCRIPTORS, &m.descriptors);
  ONE("register", register_, REGISTER, &m.reg);
  ONE("register-reply", register_reply, REGISTER_REPLY, &m.register_reply);
  ONE("heartbeat", heartbeat, HEARTBEAT, &m.hb);
  ONE("leave", leave, LEAVE, &m.leave);
  ONE("start-instance", start_instance, START_INSTANCE, &m.start);
  ONE("stop-instance", stop_instance, STOP_INSTANCE, &m.stop);
  ONE("instance-ready", instance_ready, INSTANCE_READY, &m.ready);
  ONE("instance-failed", instance_failed, INSTANCE_FAILED, &m.failed);
  ONE("dispatch-table", dispatch_table, DISPATCH_TABLE, &m.table);
  ONE("frontend-status", frontend_status, FRONTEND_STATUS, &m.status);
  ONE("heartbeat-reply", heartbeat_reply, HEARTBEAT_REPLY, &m.hb_reply);
  ONE("frontend-status-reply", frontend_status_reply, FRONTEND_STATUS_REPLY,
      &m.status_reply);
#undef ONE
  /* the agent's side of a link, untrusted until the Hello, read bytewise */
  put_u8(&b, 1);
  agent_start(&b, &m);
  emit(&b, "ctl_frame", "agent-session-bytewise");

  /* ctl_coordinator: flags, clock step, then an agent's whole session:
   * instance 1 ready, 2 failed, then placed again as 3 and ready */
  put_u8(&b, 0);
  put_u8(&b, 10);
  agent_start(&b, &m);
  FRAME(&b, instance_ready, INSTANCE_READY, &m.ready);
  FRAME(&b, instance_failed, INSTANCE_FAILED, &m.failed);
  m.ready.instance_id = 3;
  m.ready.region = &m.rd[1];
  FRAME(&b, instance_ready, INSTANCE_READY, &m.ready);
  m.ac.device_lost = 1;
  m.ac.last_error = "Xid 79: fell off the bus";
  FRAME(&b, heartbeat, HEARTBEAT, &m.hb);
  FRAME(&b, leave, LEAVE, &m.leave);
  emit(&b, "ctl_coordinator", "agent-session");
  msgs_init(&m);
  /* an agent the coordinator restarted under: its epoch, its instances */
  put_u8(&b, 16);
  put_u8(&b, 100);
  m.hello.token = "fuzz-token";
  m.reg.epoch = 5;
  m.reg.n_instances = 1;
  m.reg.instances = m.iis;
  m.hb.epoch = 5;
  agent_start(&b, &m);
  emit(&b, "ctl_coordinator", "agent-adopts");
  msgs_init(&m);
  /* an agent that stops: it drains to leave, heartbeats meanwhile, then
   * leaves */
  put_u8(&b, 0);
  put_u8(&b, 10);
  agent_start(&b, &m);
  FRAME(&b, instance_ready, INSTANCE_READY, &m.ready);
  m.leave.drain = 1;
  FRAME(&b, leave, LEAVE, &m.leave);
  FRAME(&b, heartbeat, HEARTBEAT, &m.hb);
  m.leave.drain = 0;
  FRAME(&b, leave, LEAVE, &m.leave);
  emit(&b, "ctl_coordinator", "agent-drains-to-leave");
  msgs_init(&m);
  /* a frontend: what it produced into, then its status twice */
  put_u8(&b, 2);
  put_u8(&b, 1);
  m.hello.role = "frontend";
  m.hello.id = "fe-1";
  m.hello.n_produces = 1;
  m.hello.produces = m.ies;
  FRAME(&b, hello, HELLO, &m.hello);
  FRAME(&b, frontend_status, FRONTEND_STATUS, &m.status);
  FRAME(&b, frontend_status, FRONTEND_STATUS, &m.status);
  emit(&b, "ctl_coordinator", "frontend-session");
  free(b.p);
}

/* ---- the tcp transport --------------------------------------------------- */

static void tcp_put_hdr(struct bs *b, uint8_t op, uint8_t flags, uint32_t len,
                        uint64_t off, uint64_t wr_id) {
  uint8_t h[TCP_HDR];
  fz_tcp_hdr(h, op, flags, len, off, wr_id);
  put(b, h, sizeof(h));
}

static void put_le32(struct bs *b, uint32_t v) {
  uint8_t x[4];
  fz_le(x, v, 4);
  put(b, x, 4);
}

static void tcp_agent(void) {
  struct bs b = {0};
  struct lynx_geom g;
  uint32_t ordering;
  uint8_t slot[64];
  const uint8_t sel = 0x05; /* 2 mqueues of 4 slots of 128 bytes */
  fz_tcp_geom(sel, &g, &ordering);
  memset(slot, 'x', sizeof(slot));
  /* a frontend's first moves: fctrl, a request published, reads */
  put_u8(&b, sel);
  put_u8(&b, 1);
  tcp_put_hdr(&b, OP_WRITE, 0, 8, g.fctrl_off, 0);
  put(&b, slot, 8);
  tcp_put_hdr(&b, OP_WRITE, 1, g.slot_size, lynx_rx_ring_off(&g, 0), 0);
  for (uint32_t i = 0; i < g.slot_size; i += sizeof(slot))
    put(&b, slot, sizeof(slot));
  tcp_put_hdr(&b, OP_READ, 0, 64, 0, 1);
  tcp_put_hdr(&b, OP_READ_TX, 0, 8 + 2 * 16, 0, 2);
  put_le32(&b, 2);
  put_le32(&b, 0);
  for (uint32_t q = 0; q < 2; q++) {
    put_le32(&b, q);
    put_le32(&b, 0);
    put_le32(&b, g.slots);
    put_le32(&b, 0);
  }
  tcp_put_hdr(&b, OP_READ, 0, 16, g.region_size - 8, 3); /* past the end */
  emit(&b, "tcp_agent", "session");
  /* a newer frontend epoch, sent a byte at a time */
  put_u8(&b, sel | 0x80);
  put_u8(&b, 3 | (1 << 2));
  put(&b, "\0\0\0\0\0\0\0\5", 8);
  tcp_put_hdr(&b, OP_READ, 0, 8, g.actrl_off, 1);
  tcp_put_hdr(&b, OP_WRITE, 0, 8, 0, 0); /* the header: refused */
  put(&b, slot, 8);
  emit(&b, "tcp_agent", "fenced-bytewise");
  /* a stranger: its own HELLO, naming no region this agent has */
  put_u8(&b, 0x40);
  put_u8(&b, 0);
  {
    uint8_t h[TCP_HDR + FZ_TCP_HELLO];
    fz_tcp_hello(h, 42, 0, 0);
    put(&b, h, sizeof(h));
  }
  emit(&b, "tcp_agent", "wrong-key");
  /* the region's HELLO (flag bit 6), then a PROOF made without the nonce:
   * refused, and the read after it never served */
  put_u8(&b, sel);
  put_u8(&b, 0x40);
  tcp_put_hdr(&b, OP_PROOF, 0, LYNX_TCP_PROOF, 0, 0);
  put(&b, slot, LYNX_TCP_PROOF);
  tcp_put_hdr(&b, OP_READ, 0, 64, 0, 1);
  emit(&b, "tcp_agent", "wrong-proof");
  /* a subscription of both mqueues (the second's rx_cons eager), then a
   * request published: the agent answers and pushes */
  put_u8(&b, sel);
  put_u8(&b, 1);
  tcp_put_hdr(&b, OP_SUBSCRIBE, 0, 8 + 2 * 16, 0, 1);
  put_le32(&b, 2);
  put_le32(&b, 0);
  for (uint32_t q = 0; q < 2; q++) {
    put_le32(&b, q);
    put_le32(&b, 0);
    put_le32(&b, 0);
    put_le32(&b, q);
  }
  tcp_put_hdr(&b, OP_WRITE, 1, g.slot_size, lynx_rx_ring_off(&g, 0), 0);
  for (uint32_t i = 0; i < g.slot_size; i += sizeof(slot))
    put(&b, slot, sizeof(slot));
  tcp_put_hdr(&b, OP_READ, 0, 64, 0, 2);
  emit(&b, "tcp_agent", "subscribe");
  free(b.p);
}

/* A frontend session against the fake agent (which challenges it first):
 * HELLO_REPLY, the header the
 * handshake reads, then answers to op 1 (a read of len bytes at 0) and op
 * 2 (a compound read of every mqueue from 0, with txp slots published on
 * mqueue 0). */
static void tcp_frontend_seed(const char *name, uint8_t sel, uint16_t len,
                              uint32_t txp, int fenced) {
  struct bs b = {0};
  struct lynx_geom g;
  struct lynx_region r;
  uint32_t ordering;
  fz_tcp_geom(sel, &g, &ordering);
  memset(&r, 0, sizeof(r));
  r.fd = -1;
  r.size = g.region_size;
  r.base = calloc(1, g.region_size);
  if (!r.base ||
      lynx_region_format(&r, g.n_mqueues, g.slots, g.slot_size, g.large_bytes,
                         ordering, FZ_TCP_EPOCH, FZ_TCP_ACCEL)) {
    fprintf(stderr, "gen_seeds: cannot format a region\n");
    exit(1);
  }
  put_u8(&b, sel);
  put_u8(&b, 2);
  put_u8(&b, 0); /* a read at 0 of len bytes */
  put_be16(&b, 0);
  put_be16(&b, len - 1);
  put_u8(&b, 1); /* a compound read from 0 */
  put_u8(&b, 0);
  tcp_put_hdr(&b, OP_HELLO_REPLY, 0, 0, 0, 0);
  tcp_put_hdr(&b, OP_READ_RESP, 0, sizeof(struct lynx_region_hdr), 0, 0);
  put(&b, r.base, sizeof(struct lynx_region_hdr));
  tcp_put_hdr(&b, OP_READ_RESP, 0, len, 0, 1);
  put(&b, r.base, len);
  if (fenced) {
    static const char why[] = "fenced: frontend epoch 9 took this region over";
    tcp_put_hdr(&b, OP_FENCED, 0, sizeof(why) - 1, ESTALE, 0);
    put_str(&b, why);
  } else {
    uint32_t tl = 8 * g.n_mqueues + 4 * g.n_mqueues + txp * g.slot_size;
    tcp_put_hdr(&b, OP_READ_TX_RESP, 0, tl, 0, 2);
    for (uint32_t q = 0; q < g.n_mqueues; q++) {
      put_le32(&b, q ? 0 : txp); /* tx_prod */
      put_le32(&b, 0);
    }
    for (uint32_t q = 0; q < g.n_mqueues; q++) {
      put_le32(&b, q ? 0 : txp);
      for (uint32_t k = 0; !q && k < txp; k++)
        put(&b, r.base + lynx_tx_ring_off(&g, 0) + k * g.slot_size,
            g.slot_size);
    }
  }
  emit(&b, "tcp_frontend", name);
  free(r.base);
  free(b.p);
}

/* A subscription (op 1: every mqueue from 0) accepted, then a push of one
 * slot on mqueue 0 (no large message) with its rx_cons. */
static void tcp_frontend_push_seed(void) {
  struct bs b = {0};
  struct lynx_geom g;
  uint32_t ordering;
  uint8_t *hdr, *slot;
  const uint8_t sel = 0x05;
  struct lynx_region r;
  fz_tcp_geom(sel, &g, &ordering);
  memset(&r, 0, sizeof(r));
  r.fd = -1;
  r.size = g.region_size;
  r.base = calloc(1, g.region_size);
  slot = calloc(1, g.slot_size);
  if (!r.base || !slot ||
      lynx_region_format(&r, g.n_mqueues, g.slots, g.slot_size, g.large_bytes,
                         ordering, FZ_TCP_EPOCH, FZ_TCP_ACCEL)) {
    fprintf(stderr, "gen_seeds: cannot format a region\n");
    exit(1);
  }
  hdr = r.base;
  put_u8(&b, sel);
  put_u8(&b, 1);
  put_u8(&b, 3); /* a subscription from 0 */
  put_u8(&b, 0);
  tcp_put_hdr(&b, OP_HELLO_REPLY, 0, 0, 0, 0);
  tcp_put_hdr(&b, OP_READ_RESP, 0, sizeof(struct lynx_region_hdr), 0, 0);
  put(&b, hdr, sizeof(struct lynx_region_hdr));
  tcp_put_hdr(&b, OP_SUBSCRIBE_RESP, 0, 0, 0, 1);
  tcp_put_hdr(&b, OP_PUSH, 0, 8 + FZ_PUSH_ENT + FZ_PUSH_REC + g.slot_size, 0,
              0);
  put_le32(&b, 1);
  put_le32(&b, 0);
  put_le32(&b, 0); /* q */
  put_le32(&b, 1); /* rx_cons */
  put_le32(&b, 0); /* from */
  put_le32(&b, 1); /* n */
  put_le32(&b, 0); /* llen */
  put_le32(&b, 0); /* loff */
  put(&b, slot, g.slot_size);
  emit(&b, "tcp_frontend", "pushed");
  free(slot);
  free(r.base);
  free(b.p);
}

static void tcp_frontend(void) {
  struct bs b = {0};
  tcp_frontend_seed("session", 0x05, 64, 0, 0);
  tcp_frontend_seed("tx-slots", 0x45, 64, 2, 0);
  tcp_frontend_seed("fenced", 0x81, 64, 0, 1);
  /* more than the 4 KiB AddressSanitizer fills a new buffer with */
  tcp_frontend_seed("long-read", 0x3f, 6000, 0, 0);
  /* refused after the PROOF */
  put_u8(&b, 0x05);
  put_u8(&b, 0);
  tcp_put_hdr(&b, OP_HELLO_REPLY, 0, 26, ESTALE, 0);
  put_str(&b, "epoch 1, the region's is 2");
  emit(&b, "tcp_frontend", "refused");
  /* refused at the HELLO, unchallenged (bit 3): a region the agent lost */
  put_u8(&b, 0x05);
  put_u8(&b, 8);
  tcp_put_hdr(&b, OP_HELLO_REPLY, 0, 22, ENOENT, 0);
  put_str(&b, "no region with this id");
  emit(&b, "tcp_frontend", "refused-unchallenged");
  tcp_frontend_push_seed();
  free(b.p);
}

/* ---- the API and the state file ------------------------------------------ */

static const char *const specs[][2] = {
    {"minimal", "{\"name\":\"echo\",\"port\":7000,\"app\":\"echo\"}"},
    {"full",
     "{\"name\":\"kv\",\"proto\":\"tcp\",\"port\":7100,\"app\":\"mc-get\","
     "\"framing\":\"len32\",\"slot_size\":4096,\"slots\":64,"
     "\"mqueues_per_accel\":2,\"work_us\":5,\"msg_max\":65536,"
     "\"placement\":{\"replicas\":2,\"selector\":{\"zone\":\"a\","
     "\"gpu\":\"yes\"}},\"backends\":[{\"name\":\"db\",\"address\":"
     "\"127.0.0.1:11211\",\"proto\":\"memcached\"}]}"},
    {"fixed", "{\"name\":\"f\",\"proto\":\"tcp\",\"port\":7200,\"app\":"
              "\"sockperf-echo\",\"framing\":{\"fixed\":64},"
              "\"placement\":\"all\"}"},
    {"unicode", "{\"name\":\"caf\\u00e9-\xe2\x82\xac\",\"port\":7300,"
                "\"app\":\"relay\",\"backends\":[{\"name\":\"next\","
                "\"address\":\"[::1]:7000\"}]}"},
    {"duplicate-key", "{\"name\":\"a\",\"port\":1,\"app\":\"echo\","
                      "\"port\":2}"},
    {"bad-types", "{\"name\":7,\"port\":-1,\"app\":[\"echo\"]}\n"},
    {"nul-in-key", "{\"name\":\"a\",\"port\":1,\"app\":\"echo\","
                   "\"name\\u0000\":\"b\"}"},
};

static void api(void) {
  struct bs b = {0};
  for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++) {
    put_str(&b, specs[i][1]);
    emit(&b, "http_body", specs[i][0]);
  }
  put_str(&b, "{\"version\":1,\"services\":[");
  put_str(&b, specs[0][1]);
  put_str(&b, ",");
  put_str(&b, specs[1][1]);
  put_str(&b, ",");
  put_str(&b, specs[2][1]);
  put_str(&b, "],\"drained\":[\"node-1\",\"gpu-7\"],\"epoch\":12,"
              "\"frontend_epoch\":9}\n");
  emit(&b, "store", "full");
  put_str(&b, "{\"version\":1,\"services\":[],\"drained\":[]}");
  emit(&b, "store", "empty");
  put_str(&b, "{\"version\":2}");
  emit(&b, "store", "version-2");
  put_str(&b, "{\"version\":1,\"services\":[");
  put_str(&b, specs[0][1]);
  put_str(&b, ",");
  put_str(&b, specs[0][1]);
  put_str(&b, "]}");
  emit(&b, "store", "same-service-twice");
  free(b.p);
}

/* ---- applications and the lenet weights ---------------------------------- */

static void app_seed(const char *name, uint8_t app, uint8_t flags,
                     const void *req, uint16_t len, const char *reply) {
  struct bs b = {0};
  put_u8(&b, app);
  put_u8(&b, flags);
  put_be16(&b, len);
  put(&b, req, len);
  put_str(&b, reply);
  emit(&b, "apps", name);
  free(b.p);
}

static void apps(void) {
  /* lynx_app_at: echo, sockperf-echo, sockperf-fault, mc-get, face-verify,
   * relay, lenet */
  uint8_t sp[32] = {0}, face[FACE_REQ_LEN], img[LENET_PIXELS];
  struct bs b = {0};
  char rep[2048];
  sp[7] = 1;                                             /* sequence 1 */
  sp[9] = LYNX_SOCKPERF_PONG_REQ | LYNX_SOCKPERF_CLIENT; /* a ping */
  sp[13] = sizeof(sp);
  app_seed("echo", 0, 0, "hello", 5, "");
  app_seed("sockperf-ping", 1, 0, sp, sizeof(sp), "");
  sp[9] = LYNX_SOCKPERF_CLIENT; /* no answer wanted */
  app_seed("sockperf-under-load", 2, 0, sp, sizeof(sp), "");
  app_seed("sockperf-fault-hang", 2, 0, "LYNX-HANG 5\n", 12, "");
  app_seed("mc-get-hit", 3, 0, "k1", 2, "VALUE k1 0 5\r\nhello\r\nEND\r\n");
  app_seed("mc-get-miss", 3, 0, "k1", 2, "END\r\n");
  app_seed("mc-get-down", 3, 2, "k1", 2, "");
  memset(face, 0x80, sizeof(face));
  memcpy(face, "alice\0\0\0\0\0\0\0", FACE_LABEL_LEN);
  snprintf(rep, sizeof(rep), "VALUE face:alice 0 %u\r\n", FACE_PIXELS);
  put_str(&b, rep);
  for (int i = 0; i < FACE_PIXELS; i++)
    put_u8(&b, (uint8_t)(i * 7));
  put_str(&b, "\r\nEND\r\n");
  put_u8(&b, 0);
  {
    struct bs s = {0};
    put_u8(&s, 4);
    put_u8(&s, 0);
    put_be16(&s, FACE_REQ_LEN);
    put(&s, face, sizeof(face));
    put(&s, b.p, b.n - 1);
    emit(&s, "apps", "face-verify");
    free(s.p);
  }
  app_seed("relay", 5, 0, "question", 8, "answer");
  memset(img, 0x33, sizeof(img));
  app_seed("lenet", 6, 0, img, sizeof(img), "");
  /* three raw slots (1 KiB, fuzz_apps.c): a request, a large one in the
   * area's first 100 bytes, a large reference past the 16 KiB area */
  b.n = 0;
  put_u8(&b, 0);
  put_u8(&b, 1);
  put_u8(&b, 2);
  {
    static const struct lynx_large_ref refs[2] = {{0, 100, 128, 0},
                                                  {16384 - 64, 128, 16448, 0}};
    uint8_t slot[1024] = {0};
    struct lynx_slot_meta m = {5, 9, LYNX_ST_OK, 0, 0};
    memcpy(slot, "hello", 5);
    memcpy(slot + sizeof(slot) - LYNX_META_SIZE, &m, sizeof(m));
    put(&b, slot, sizeof(slot));
    for (int i = 0; i < 2; i++) {
      m = (struct lynx_slot_meta){sizeof(refs[i]), 10u + (uint32_t)i,
                                  LYNX_ST_OK | LYNX_ST_LARGE, 0, 0};
      memset(slot, 0, sizeof(slot));
      memcpy(slot, &refs[i], sizeof(refs[i]));
      memcpy(slot + sizeof(slot) - LYNX_META_SIZE, &m, sizeof(m));
      put(&b, slot, sizeof(slot));
    }
  }
  put_be32(&b, 0);   /* tx_cons */
  put_be16(&b, 100); /* the large area's first bytes */
  for (int i = 0; i < 100; i++)
    put_u8(&b, (uint8_t)i);
  emit(&b, "apps", "raw-slots");
  /* sockperf-echo, raw: a request it drops (its TX slot frees the tag),
   * then a ping it answers in the next TX slot */
  put_u8(&b, 1);
  put_u8(&b, 1);
  put_u8(&b, 1);
  for (uint32_t k = 0; k < 2; k++) {
    uint8_t slot[1024] = {0};
    struct lynx_slot_meta m = {sizeof(sp), 20u + k, LYNX_ST_OK, 0, 0};
    memcpy(slot, sp, sizeof(sp));
    slot[9] =
        (uint8_t)(LYNX_SOCKPERF_CLIENT | (k ? LYNX_SOCKPERF_PONG_REQ : 0));
    memcpy(slot + sizeof(slot) - LYNX_META_SIZE, &m, sizeof(m));
    put(&b, slot, sizeof(slot));
  }
  put_be32(&b, 0);
  put_be16(&b, 0);
  emit(&b, "apps", "sockperf-drop-then-answer");
  free(b.p);
}

static void lenet(const char *model) {
  struct bs b = {0};
  uint8_t hdr[LENET_FILE_HDR];
  float w = 0.01f;
  FILE *f = fopen(model, "rb");
  if (!f || fread(hdr, 1, sizeof(hdr), f) != sizeof(hdr)) {
    fprintf(stderr, "gen_seeds: %s: cannot read its header\n", model);
    failed = 1;
    if (f)
      fclose(f);
    return;
  }
  fclose(f);
  put_u8(&b, 2); /* the header, 0.01 everywhere, the CRC made right */
  put(&b, hdr, sizeof(hdr));
  put(&b, &w, sizeof(w));
  emit(&b, "lenet_model", "constant-weights");
  put_u8(&b, 0); /* the same with the real file's CRC: refused */
  put(&b, hdr, sizeof(hdr));
  put(&b, &w, sizeof(w));
  emit(&b, "lenet_model", "wrong-crc");
  put_u8(&b, 1); /* the header alone, as a file: truncated */
  put(&b, hdr, sizeof(hdr));
  emit(&b, "lenet_model", "truncated");
  free(b.p);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s CORPUS_DIR LENET_MODEL\n", argv[0]);
    return 2;
  }
  out_dir = argv[1];
  beframe();
  tcpsvc();
  ctl();
  tcp_agent();
  tcp_frontend();
  api();
  apps();
  lenet(argv[2]);
  return failed;
}
