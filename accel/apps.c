/* apps.c - echo, sockperf-echo, mc-get, face-verify, relay, lenet; client
 * mqueue calls; what apps load before they start. */
#include "apps.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "bell.h"
#include "face.h"
#include "lenet_model.h"
#include "log.h"
#include "util.h"

struct lynx_client *lynx_app_client(const struct lynx_app_ctx *ctx,
                                    const char *name) {
  for (uint32_t i = 0; ctx && i < ctx->n_clients; i++)
    if (!strcmp(ctx->clients[i].name, name))
      return &ctx->clients[i];
  return NULL;
}

/* app_logic.h spells the call results out for device code */
_Static_assert(LYNX_CALL_EHOSTDOWN == -EHOSTDOWN, "EHOSTDOWN");
_Static_assert(LYNX_CALL_EMSGSIZE == -EMSGSIZE, "EMSGSIZE");
_Static_assert(LYNX_CALL_ETIMEDOUT == -ETIMEDOUT, "ETIMEDOUT");
_Static_assert(LYNX_CALL_ECANCELED == -ECANCELED, "ECANCELED");

int lynx_call(struct lynx_client *c, const void *req, uint32_t len,
              uint8_t *reply, uint32_t cap, uint32_t *reply_len,
              uint64_t timeout_ns) {
  uint64_t end = lynx_now_ns() + timeout_ns;
  struct lynx_msg m;
  uint32_t tag;
  int rc;
  pthread_mutex_lock(&c->lock);
  tag = ++c->next_tag;
  while ((rc = lynx_send(&c->mq, tag, req, len)) == -11 /* EAGAIN */) {
    if (lynx_now_ns() >= end) {
      rc = -ETIMEDOUT;
      goto out;
    }
    sched_yield();
  }
  if (rc)
    goto out;
  /* the frontend worker may sleep waiting on this client mqueue */
  lynx_bell_after_publish(&c->mq, "client mqueue");
  /* the reply with our tag; late replies to calls that timed out are
   * skipped (app_logic.h, the GPU's calls take replies the same way) */
  while ((rc = lynx_call_poll(&c->mq, tag, cap, &m)) == -11) {
    if (lynx_now_ns() >= end) {
      rc = -ETIMEDOUT;
      goto out;
    }
    sched_yield();
  }
  if (rc == 0) {
    memcpy(reply, m.data, m.len);
    *reply_len = m.len;
    lynx_release(&c->mq);
  }
out:
  pthread_mutex_unlock(&c->lock);
  return rc;
}

static int echo_handle(struct lynx_mq *mq, const struct lynx_msg *req,
                       int *replied, const struct lynx_app_ctx *ctx) {
  int rc;
  (void)ctx;
  rc = lynx_send(mq, req->tag, req->data, req->len);
  *replied = rc == 0;
  return rc == -EAGAIN ? -EAGAIN : 0;
}

/*
 * sockperf's 14-byte header: u64 sequence, u16 flags, u32 length, network
 * order. Like sockperf's own server: answer only pong requests, and clear
 * the client flag in the answer. Anything else is dropped (the frontend frees
 * its tag at once).
 */
static int sockperf_handle(struct lynx_mq *mq, const struct lynx_msg *req,
                           int *replied, const struct lynx_app_ctx *ctx) {
  uint8_t *buf;
  int rc;
  (void)ctx;
  *replied = 0;
  if (!lynx_sockperf_wants_reply(req->data, req->len))
    return lynx_drop(mq, req->tag) == -EAGAIN ? -EAGAIN : 0;
  rc = lynx_reserve(mq, req->len, &buf);
  if (rc)
    return rc == -EAGAIN ? -EAGAIN : 0;
  memcpy(buf, req->data, req->len);
  lynx_sockperf_make_reply(buf);
  lynx_commit(mq, req->tag, req->len, req->len);
  *replied = 1;
  return 0;
}

/*
 * sockperf-fault: sockperf-echo with fault injection. "LYNX-HANG <ms>"
 * (app_logic.h) holds this accelerator thread for ms milliseconds without
 * consuming the request, what a hung GPU kernel looks like to the agent's
 * liveness check, and is then dropped. A request is held once, even when
 * it must be handled again for lack of TX room.
 */
static int sockperf_fault_handle(struct lynx_mq *mq, const struct lynx_msg *req,
                                 int *replied, const struct lynx_app_ctx *ctx) {
  static __thread const uint8_t *held_data;
  static __thread uint32_t held_tag;
  uint32_t ms = lynx_fault_hang_ms(req->data, req->len);
  if (ms && (held_data != req->data || held_tag != req->tag)) {
    uint64_t end = lynx_now_ns() + (uint64_t)ms * 1000000u;
    held_data = req->data;
    held_tag = req->tag;
    while (lynx_now_ns() < end && !(ctx && ctx->stop && *ctx->stop)) {
      struct timespec ts = {0, 5 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
  }
  return sockperf_handle(mq, req, replied, ctx);
}

/*
 * mc-get: a request is a memcached key (1-250 bytes, no space or control
 * character). The application sends "get KEY\r\n" to back end "db"
 * through its client mqueue and answers with the value's bytes, with an
 * empty payload on a miss, and with the 5 bytes "ERROR" when the key is
 * invalid or the back end is unreachable, errs or does not answer in time.
 * The key check, the command and the reply's parsing are app_logic.h's,
 * which the GPU's mc-get (cuda/apps.cu) runs too.
 */
#define MC_REPLY_MAX (1u << 20)

static int mc_get_handle(struct lynx_mq *mq, const struct lynx_msg *req,
                         int *replied, const struct lynx_app_ctx *ctx) {
  static __thread uint8_t reply[MC_REPLY_MAX];
  uint8_t cmd[LYNX_MC_GET_CMD_MAX];
  struct lynx_client *db = lynx_app_client(ctx, "db");
  const uint8_t *val = (const uint8_t *)"ERROR";
  uint32_t vlen = 5, rlen = 0, voff = 0;
  int rc;
  if (db && lynx_mc_key_ok(req->data, req->len)) {
    uint32_t n = lynx_mc_get_cmd(cmd, req->data, req->len);
    rc = lynx_call(db, cmd, n, reply, sizeof(reply), &rlen,
                   ctx->call_timeout_ns);
    if (rc == 0) {
      rc = lynx_mc_parse_get(reply, rlen, &voff, &vlen);
      if (rc == 0)
        val = reply + voff;
      else if (rc == -ENOENT)
        vlen = 0;
      else
        val = (const uint8_t *)"ERROR", vlen = 5;
    }
  }
  rc = lynx_send(mq, req->tag, val, vlen);
  if (rc == -EAGAIN)
    return -EAGAIN; /* called again: the lookup is repeated */
  *replied = rc == 0;
  return 0;
}

/*
 * face-verify (paper §6.4, docs/face-verify.md): a request is a 12-byte
 * label and a 32x32 image; the stored image of that label comes from
 * memcached back end "db" (key "face:" + label) through the client mqueue;
 * the answer is match/no-match and the chi-square distance of their LBP
 * histograms (8 bytes), or "ERROR" for a malformed request, an unknown
 * label, or a back end that is down or does not answer in time. The CPU
 * work is face.h's, the same code the host-centric baseline and the GPU's
 * face-verify (cuda/apps.cu) run.
 */
static int face_handle(struct lynx_mq *mq, const struct lynx_msg *req,
                       int *replied, const struct lynx_app_ctx *ctx) {
  static __thread uint8_t reply[FACE_PIXELS + 512];
  struct lynx_client *db = lynx_app_client(ctx, "db");
  const uint8_t *label, *probe;
  char key[FACE_KEY_MAX];
  uint8_t cmd[FACE_KEY_MAX + 8];
  uint8_t out[FACE_RESP_LEN];
  const void *ans = FACE_ERROR;
  uint32_t ans_len = FACE_ERROR_LEN, rlen = 0, soff, slen;
  int klen, rc;
  if (db && face_req_parse(req->data, req->len, &label, &probe) == 0 &&
      (klen = face_key(label, key)) > 0) {
    uint32_t n = lynx_mc_get_cmd(cmd, (const uint8_t *)key, (uint32_t)klen);
    rc = lynx_call(db, cmd, n, reply, sizeof(reply), &rlen,
                   ctx->call_timeout_ns);
    if (rc == 0 && lynx_mc_parse_get(reply, rlen, &soff, &slen) == 0 &&
        slen == FACE_PIXELS) {
      float dist;
      int match = face_verify(probe, reply + soff, &dist);
      face_resp_encode(out, match, dist);
      ans = out;
      ans_len = FACE_RESP_LEN;
    }
  }
  rc = lynx_send(mq, req->tag, ans, ans_len);
  if (rc == -EAGAIN)
    return -EAGAIN;
  *replied = rc == 0;
  return 0;
}

/*
 * relay: the first tier of a multi-tier service: every request is passed
 * to back end "next" (any len32 service, e.g. another Lynx TCP service)
 * and its reply is the answer; "ERROR" when "next" is down or silent.
 */
static int relay_handle(struct lynx_mq *mq, const struct lynx_msg *req,
                        int *replied, const struct lynx_app_ctx *ctx) {
  static __thread uint8_t reply[MC_REPLY_MAX];
  struct lynx_client *next = lynx_app_client(ctx, "next");
  const void *ans = "ERROR";
  uint32_t ans_len = 5, rlen = 0;
  uint8_t hdr[4] = {(uint8_t)(req->len >> 24), (uint8_t)(req->len >> 16),
                    (uint8_t)(req->len >> 8), (uint8_t)req->len};
  static __thread uint8_t framed[MC_REPLY_MAX + 4];
  int rc;
  if (next && req->len <= MC_REPLY_MAX) {
    /* len32: the frontend sends what the application writes, as is */
    memcpy(framed, hdr, 4);
    memcpy(framed + 4, req->data, req->len);
    if (lynx_call(next, framed, req->len + 4, reply, sizeof(reply), &rlen,
                  ctx->call_timeout_ns) == 0) {
      ans = reply;
      ans_len = rlen;
    }
  }
  rc = lynx_send(mq, req->tag, ans, ans_len);
  if (rc == -EAGAIN)
    return -EAGAIN;
  *replied = rc == 0;
  return 0;
}

/*
 * lenet (docs/lenet.md): a request is a 28x28 grayscale image, optionally
 * followed by a cookie of up to 16 bytes; the answer is the class, the 10
 * logits and the cookie (lenet.h). Any other request is dropped (the
 * frontend counts it). The TX slot is reserved before the inference, so a
 * full TX ring costs no wasted inference when the request comes back.
 */
static int lenet_handle(struct lynx_mq *mq, const struct lynx_msg *req,
                        int *replied, const struct lynx_app_ctx *ctx) {
  const struct lenet_model *m = ctx ? ctx->data : NULL;
  int clen = lenet_req_cookie_len(req->len), cls, rc;
  float logits[LENET_CLASSES];
  uint8_t *buf;
  *replied = 0;
  if (!m || clen < 0)
    return lynx_drop(mq, req->tag) == -EAGAIN ? -EAGAIN : 0;
  rc = lynx_reserve(mq, LENET_RESP_MAX, &buf);
  if (rc == -EAGAIN)
    return -EAGAIN;
  if (rc) /* a slot too small for the answer: the service's spec */
    return lynx_drop(mq, req->tag) == -EAGAIN ? -EAGAIN : 0;
  cls = lenet_infer(m, req->data, logits);
  lynx_commit(mq, req->tag,
              lenet_resp_encode(buf, cls, logits, req->data + LENET_PIXELS,
                                (uint32_t)clen),
              LENET_RESP_MAX);
  *replied = 1;
  return 0;
}

static int lenet_prepare(struct lynx_app_res *res, const void **data, char *why,
                         size_t whylen) {
  char err[320];
  int rc;
  if (!res->lenet) {
    if (!res->lenet_model || !res->lenet_model[0]) {
      snprintf(why, whylen, "lenet: no weights file (--lenet-model)");
      return -ENOENT;
    }
    rc = lenet_model_load(res->lenet_model, &res->lenet, err, sizeof(err));
    if (rc) {
      snprintf(why, whylen, "lenet: cannot load its weights: %s", err);
      return rc;
    }
    LYNX_INFO("apps",
              "lenet: weights %s loaded: %u parameters, CRC-32 "
              "%08x, test accuracy %u/%u at training",
              res->lenet_model, LENET_PARAMS, res->lenet->crc,
              res->lenet->test_correct, res->lenet->test_total);
  }
  *data = res->lenet;
  return 0;
}

int lynx_app_prepare(const struct lynx_app *app, struct lynx_app_res *res,
                     const void **data, char *why, size_t whylen) {
  *data = NULL;
  return app->prepare ? app->prepare(res, data, why, whylen) : 0;
}

void lynx_app_res_free(struct lynx_app_res *res) {
  lenet_model_free(res->lenet);
  res->lenet = NULL;
}

static const struct lynx_app apps[] = {
    {"echo", "answer every request with its own bytes", echo_handle, NULL,
     LYNX_CUDA_APP_ECHO, NULL},
    {"sockperf-echo", "answer sockperf pong requests as sockperf's server does",
     sockperf_handle, NULL, LYNX_CUDA_APP_SOCKPERF_ECHO, NULL},
    {"sockperf-fault",
     "sockperf-echo; 'LYNX-HANG <ms>' stops the "
     "accelerator consuming for ms (liveness tests)",
     sockperf_fault_handle, NULL, LYNX_CUDA_APP_SOCKPERF_FAULT, NULL},
    {"mc-get", "answer a key with its value from memcached back end 'db'",
     mc_get_handle, "db", LYNX_CUDA_APP_MC_GET, NULL},
    {"face-verify",
     "LBP face verification against images in memcached "
     "back end 'db'",
     face_handle, "db", LYNX_CUDA_APP_FACE_VERIFY, NULL},
    {"relay",
     "answer with back end 'next''s reply to the same request "
     "(len32)",
     relay_handle, "next", LYNX_CUDA_APP_NONE, NULL},
    {"lenet",
     "LeNet-5 on a 28x28 image (Fashion-MNIST): its class and "
     "logits (weights: the agent's --lenet-model)",
     lenet_handle, NULL, LYNX_CUDA_APP_LENET, lenet_prepare},
};

const struct lynx_app *lynx_app_find(const char *name) {
  for (size_t i = 0; i < sizeof(apps) / sizeof(apps[0]); i++)
    if (strcmp(apps[i].name, name) == 0)
      return &apps[i];
  return NULL;
}

const struct lynx_app *lynx_app_at(size_t i) {
  return i < sizeof(apps) / sizeof(apps[0]) ? &apps[i] : NULL;
}

const char *lynx_app_names(void) {
  return "echo, sockperf-echo, sockperf-fault, mc-get, face-verify, relay, "
         "lenet";
}

const char *lynx_app_cuda_names(void) {
  return "echo, sockperf-echo, sockperf-fault, mc-get, face-verify, lenet";
}
