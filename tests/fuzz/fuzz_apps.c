/*
 * fuzz_apps.c - requests as an accelerator takes them (accel/apps.c):
 * what a frontend wrote into a server mqueue's RX ring (include/lynx/mqueue.h
 * lynx_mq_recv: slot metadata, large-message references), handed to an
 * application (echo, sockperf-echo and sockperf-fault's sockperf header,
 * mc-get's key, face-verify's label and image, relay, lenet's size), and
 * for the applications with a back end, the back end's reply as the
 * frontend puts it in their client mqueue (lynx_call, lynx_mc_parse_get).
 *
 * Input: a byte choosing the application (lynx_app_at, modulo the
 * table); a byte of flags: bit 0 raw slots (else one well-formed request),
 * bits 1-2 the status of the back end's replies (OK, BACKEND_DOWN,
 * TOO_LONG); raw: a byte, the slots written (1-4), then each RX slot's
 * bytes (1 KiB: payload, then metadata; its publish word is set to the
 * slot's position, so the accelerator sees it), the u32 tx_cons the
 * frontend reports, and the RX large area's first bytes; otherwise: a u16
 * length and the request (a large message past a slot's payload). Then
 * the back end's reply, given to every call.
 *
 * Checked besides memory errors: the application consumes every request
 * (a fresh TX ring has room); what it publishes is a well-formed TX slot;
 * echo answers the request's bytes, sockperf-echo the request with the
 * client flag cleared, and only pong requests.
 */
#include <stdio.h>

#include "apps.h"
#include "fuzz.h"
#include "ut_ring.h"

/* small regions (every input zeroes two): 4 slots of 1 KiB, 16 KiB large
 * areas, so a face-verify request (1036 bytes) is a large one */
#define S 4u
#define Z 1024u
#define L 16384u

/* The two regions' memory (45 KiB each): zeroed for every input, so
 * nothing in it outlives one. Static: fresh pages for every input made
 * page faults most of a run's time. */
#define REGION_MAX (64u << 10)
static uint8_t srv_mem[REGION_MAX] __attribute__((aligned(4096)));
static uint8_t cli_mem[REGION_MAX] __attribute__((aligned(4096)));

/* The client mqueue's RX ring holds the back end's reply for the calls
 * the app will make (tags 1..S: lynx_call numbers them from 1). */
static void put_replies(struct ut_region *cr, const uint8_t *rep, uint32_t n,
                        uint16_t status) {
  struct lynx_large_alloc a = {0, 0};
  for (uint32_t pos = 0; pos < S; pos++) {
    if (n > lynx_slot_cap(Z)) {
      if (ut_put_large(cr, 0, pos, pos + 1, rep, n, &a))
        return;
      ut_meta_of(cr, ut_rx_slot(cr, 0, pos))->status |= status;
    } else {
      ut_put_raw(cr, 0, pos, pos + 1, rep, n,
                 (uint16_t)(lynx_payload_off(Z, n) / 16u), status,
                 lynx_seq_for(pos));
    }
  }
}

/* The request(s) of the input into the server mqueue's RX ring. */
static void put_requests(struct ut_region *r, struct fz *f, int raw) {
  size_t len;
  const uint8_t *p;
  if (raw) {
    uint32_t n = 1 + fz_u8(f) % S;
    for (uint32_t pos = 0; pos < n; pos++) {
      uint8_t *slot = ut_rx_slot(r, 0, pos);
      p = fz_bytes(f, Z, &len);
      memcpy(slot, p, len);
      ut_meta_of(r, slot)->seq = lynx_seq_for(pos);
    }
    ut_fctrl(r, 0)->tx_cons = fz_u32(f);
    p = fz_bytes(f, fz_u16(f), &len);
    memcpy(r->mem + lynx_rx_large_off(&r->g, 0), p, len);
  } else {
    struct lynx_large_alloc a = {0, 0};
    p = fz_bytes(f, fz_u16(f), &len);
    if (len > lynx_slot_cap(Z))
      ut_put_large(r, 0, 0, 1, p, (uint32_t)len, &a);
    else
      ut_put(r, 0, 0, 1, p, (uint32_t)len);
  }
}

/* What the app answered to req at TX position pos is a well-formed slot,
 * and for echo and sockperf-echo the answer they promise. */
static void check_answer(struct ut_region *r, const struct lynx_app *app,
                         const struct lynx_msg *req, uint32_t pos,
                         int replied) {
  struct lynx_slot_meta m;
  const uint8_t *data;
  uint32_t len;
  int sp = !strcmp(app->name, "sockperf-echo");
  if (sp)
    FZ_CHECK(replied == lynx_sockperf_wants_reply(req->data, req->len));
  if (!replied)
    return;
  FZ_CHECK(ut_get_tx_msg(r, 0, pos, &m, &data, &len) == 0);
  FZ_CHECK(m.tag == req->tag);
  if (!strcmp(app->name, "echo") || sp) {
    FZ_CHECK(len == req->len);
    for (uint32_t i = 0; i < len; i++)
      FZ_CHECK(data[i] == (sp && i == 9
                               ? (uint8_t)(req->data[9] & ~LYNX_SOCKPERF_CLIENT)
                               : req->data[i]));
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const uint16_t statuses[] = {LYNX_ST_OK, LYNX_ST_BACKEND_DOWN,
                                      LYNX_ST_TOO_LONG, LYNX_ST_OK};
  struct fz f = {data, size};
  const struct lynx_app *app;
  struct ut_region r, cr;
  struct lynx_client cl;
  struct lynx_app_env env;
  struct lynx_mq mq;
  struct lynx_msg m;
  volatile int stop = 1; /* sockperf-fault holds for no "LYNX-HANG" */
  uint8_t sel = fz_u8(&f), flags = fz_u8(&f);
  size_t n, n_apps = 0;
  const uint8_t *rep;
  fz_quiet();
  while (lynx_app_at(n_apps))
    n_apps++;
  app = lynx_app_at(sel % n_apps);
  if (ut_region_at(&r, srv_mem, REGION_MAX, 1, S, Z, L) ||
      ut_region_at(&cr, cli_mem, REGION_MAX, 1, S, Z, L))
    return 0;
  put_requests(&r, &f, flags & 1);
  rep = fz_rest(&f, &n);
  put_replies(&cr, rep, (uint32_t)(n < L ? n : L), statuses[(flags >> 1) & 3]);
  memset(&cl, 0, sizeof(cl));
  snprintf(cl.name, sizeof(cl.name), "%s",
           app->needs_backend ? app->needs_backend : "none");
  pthread_mutex_init(&cl.lock, NULL);
  lynx_mq_bind(&cl.mq, cr.mem, &cr.g, 0);
  /* no state (lenet drops every request); timeout 0: the reply is there,
   * or never comes */
  lynx_app_env_init(&env, app, &cl, 1, NULL, &stop, 0);
  lynx_mq_bind(&mq, r.mem, &r.g, 0);
  while (lynx_mq_recv(&mq, &m) == 0) {
    /* an answer, or a drop that frees the tag, takes the next TX slot */
    uint32_t pos = mq.tx_prod;
    int replied = 0, rc = lynx_app_handle(app, &mq, &m, &replied, &env.ctx);
    if (ut_fctrl(&r, 0)->tx_cons == 0) /* the TX ring has room */
      FZ_CHECK(rc == 0);
    if (rc)
      break;
    check_answer(&r, app, &m, pos, replied);
    lynx_release(&mq);
  }
  pthread_mutex_destroy(&cl.lock);
  return 0;
}
