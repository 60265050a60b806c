/* apps.c - the built-in applications (echo, sockperf-echo, sockperf-fault,
 * mc-get, face-verify, relay, lenet), each a struct lynx_app_def as a
 * plug-in's is (lynx_app.h); client mqueue calls (lynx_call). */
#include "apps.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <json-c/json.h>

#include "bell.h"
#include "face.h"
#include "lenet_model.h"
#include "log.h"
#include "util.h"

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
  (void)ctx;
  return lynx_sockperf_answer(mq, req, replied);
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

/*
 * The calling thread's buffer for the apps that call a back end (a reply,
 * and relay's framed request after it): THREAD_BUF bytes, allocated at
 * the thread's first call and freed when it exits; NULL when out of
 * memory. Static __thread arrays would be in every thread of the agent
 * (3 MiB of TLS each, zeroed when each thread starts, whatever it runs):
 * 3 MiB of memory per instance thread (issue 38).
 */
#define THREAD_BUF (2u * MC_REPLY_MAX + 4u)
static pthread_key_t buf_key;
static pthread_once_t buf_once = PTHREAD_ONCE_INIT;
static int buf_key_ok;

static void buf_key_init(void) {
  buf_key_ok = pthread_key_create(&buf_key, free) == 0;
}

static uint8_t *thread_buf(void) {
  static __thread uint8_t *buf;
  if (!buf) {
    pthread_once(&buf_once, buf_key_init);
    if (!buf_key_ok || !(buf = malloc(THREAD_BUF)))
      return NULL;
    if (pthread_setspecific(buf_key, buf)) { /* not freed at exit: never kept */
      free(buf);
      buf = NULL;
    }
  }
  return buf;
}

static int mc_get_handle(struct lynx_mq *mq, const struct lynx_msg *req,
                         int *replied, const struct lynx_app_ctx *ctx) {
  uint8_t *reply = thread_buf();
  uint8_t cmd[LYNX_MC_GET_CMD_MAX];
  const uint8_t *val = (const uint8_t *)"ERROR";
  uint32_t vlen = 5, rlen = 0, voff = 0;
  int rc;
  if (reply && lynx_mc_key_ok(req->data, req->len)) {
    uint32_t n = lynx_mc_get_cmd(cmd, req->data, req->len);
    rc = lynx_app_call(ctx, "db", cmd, n, reply, MC_REPLY_MAX, &rlen);
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
  uint8_t *reply = thread_buf();
  const uint8_t *label, *probe;
  char key[FACE_KEY_MAX];
  uint8_t cmd[FACE_KEY_MAX + 8];
  uint8_t out[FACE_RESP_LEN];
  const void *ans = FACE_ERROR;
  uint32_t ans_len = FACE_ERROR_LEN, rlen = 0, soff, slen;
  int klen, rc;
  if (reply && face_req_parse(req->data, req->len, &label, &probe) == 0 &&
      (klen = face_key(label, key)) > 0) {
    uint32_t n = lynx_mc_get_cmd(cmd, (const uint8_t *)key, (uint32_t)klen);
    rc = lynx_app_call(ctx, "db", cmd, n, reply, FACE_PIXELS + 512, &rlen);
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
  uint8_t *reply = thread_buf();
  uint8_t *framed = reply ? reply + MC_REPLY_MAX : NULL; /* MC_REPLY_MAX + 4 */
  const void *ans = "ERROR";
  uint32_t ans_len = 5, rlen = 0;
  uint8_t hdr[4] = {(uint8_t)(req->len >> 24), (uint8_t)(req->len >> 16),
                    (uint8_t)(req->len >> 8), (uint8_t)req->len};
  int rc;
  if (reply && req->len <= MC_REPLY_MAX) {
    /* len32: the frontend sends what the application writes, as is */
    memcpy(framed, hdr, 4);
    memcpy(framed + 4, req->data, req->len);
    if (lynx_app_call(ctx, "next", framed, req->len + 4, reply, MC_REPLY_MAX,
                      &rlen) == 0) {
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
  const struct lenet_model *m = ctx ? ctx->state : NULL;
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

/*
 * lenet's configuration: {"model": PATH}, the weights file (docs/lenet.md);
 * the agent's --lenet-model is its default, so services may run different
 * weights. Instances of the same file share one read-only copy, loaded by
 * the first and freed with the last; a file that changed (its inode, size
 * or time) is loaded afresh, so a fixed file needs no agent restart.
 */
struct lenet_cached {
  char *path;
  struct stat st;
  struct lenet_model *m;
  unsigned refs;
  struct lenet_cached *next;
};
static pthread_mutex_t lenet_lock = PTHREAD_MUTEX_INITIALIZER;
static struct lenet_cached *lenet_cache;

static int same_file(const struct stat *a, const struct stat *b) {
  return a->st_dev == b->st_dev && a->st_ino == b->st_ino &&
         a->st_size == b->st_size && a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
         a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* The model of the file at path, shared: 0 and *out, or -errno with the
 * reason in why. */
static int lenet_get(const char *path, const char *service,
                     struct lenet_model **out, char *why, size_t whylen) {
  struct lenet_cached *c;
  struct stat st;
  char err[320];
  int rc = 0;
  pthread_mutex_lock(&lenet_lock);
  if (stat(path, &st) == 0)
    for (c = lenet_cache; c; c = c->next)
      if (!strcmp(c->path, path) && same_file(&c->st, &st)) {
        c->refs++;
        *out = c->m;
        goto out;
      }
  c = calloc(1, sizeof(*c));
  if (!c || !(c->path = strdup(path))) {
    free(c);
    snprintf(why, whylen, "out of memory");
    rc = -ENOMEM;
    goto out;
  }
  rc = lenet_model_load(path, &c->m, err, sizeof(err));
  if (rc) {
    snprintf(why, whylen, "cannot load its weights: %s", err);
    free(c->path);
    free(c);
    goto out;
  }
  if (stat(path, &c->st)) /* gone since: never matched again */
    memset(&c->st, 0, sizeof(c->st));
  c->refs = 1;
  c->next = lenet_cache;
  lenet_cache = c;
  *out = c->m;
  LYNX_INFO("apps",
            "lenet: weights %s loaded: %u parameters, CRC-32 %08x, test "
            "accuracy %u/%u at training (first instance: service %s)",
            path, LENET_PARAMS, c->m->crc, c->m->test_correct, c->m->test_total,
            service);
out:
  pthread_mutex_unlock(&lenet_lock);
  return rc;
}
static int lenet_start(const struct lynx_app_start *st, void **state, char *why,
                       size_t whylen) {
  struct json_tokener *tok = json_tokener_new();
  struct json_object *cfg = NULL, *v = NULL;
  struct lenet_model *m = NULL;
  const char *path = NULL;
  int rc = -EINVAL;
  if (!tok) {
    snprintf(why, whylen, "out of memory");
    return -ENOMEM;
  }
  cfg = json_tokener_parse_ex(tok, st->config, (int)st->config_len);
  if (!cfg || !json_object_is_type(cfg, json_type_object)) {
    snprintf(why, whylen, "its configuration is not a JSON object");
    goto out;
  }
  json_object_object_foreach(cfg, key, val) {
    if (strcmp(key, "model")) {
      snprintf(why, whylen,
               "configuration: unknown key '%s' (lenet takes: model)", key);
      goto out;
    }
    v = val;
  }
  if (!v || !json_object_is_type(v, json_type_string) ||
      !json_object_get_string_len(v)) {
    snprintf(why, whylen,
             "no weights file: configuration {\"model\": PATH} or the "
             "agent's --lenet-model");
    rc = -ENOENT;
    goto out;
  }
  path = json_object_get_string(v);
  rc = lenet_get(path, st->service, &m, why, whylen);
  if (rc)
    goto out;
  *state = m;
out:
  json_object_put(cfg);
  json_tokener_free(tok);
  return rc;
}

static void lenet_stop(void *state) {
  struct lenet_cached **pp, *c;
  pthread_mutex_lock(&lenet_lock);
  for (pp = &lenet_cache; (c = *pp); pp = &c->next)
    if (c->m == state) {
      if (--c->refs == 0) {
        *pp = c->next;
        lenet_model_free(c->m);
        free(c->path);
        free(c);
      }
      break;
    }
  pthread_mutex_unlock(&lenet_lock);
}

#define BUILTIN(var, name_, help_, backend_, handle_, start_, stop_)           \
  static const struct lynx_app_def var = {                                     \
      LYNX_APP_DEF_HEAD, .name = name_,                                        \
      .help = help_,     .needs_backend = backend_,                            \
      .start = start_,   .handle = handle_,                                    \
      .stop = stop_}

BUILTIN(echo_def, "echo", "answer every request with its own bytes", NULL,
        echo_handle, NULL, NULL);
BUILTIN(sockperf_def, "sockperf-echo",
        "answer sockperf pong requests as sockperf's server does", NULL,
        sockperf_handle, NULL, NULL);
BUILTIN(sockperf_fault_def, "sockperf-fault",
        "sockperf-echo; 'LYNX-HANG <ms>' stops the accelerator consuming for "
        "ms (liveness tests)",
        NULL, sockperf_fault_handle, NULL, NULL);
BUILTIN(mc_get_def, "mc-get",
        "answer a key with its value from memcached back end 'db'", "db",
        mc_get_handle, NULL, NULL);
BUILTIN(face_def, "face-verify",
        "LBP face verification against images in memcached back end 'db'", "db",
        face_handle, NULL, NULL);
BUILTIN(relay_def, "relay",
        "answer with back end 'next''s reply to the same request (len32)",
        "next", relay_handle, NULL, NULL);
BUILTIN(lenet_def, "lenet",
        "LeNet-5 on a 28x28 image (Fashion-MNIST): its class and logits "
        "(configuration {\"model\": PATH}; default: the agent's "
        "--lenet-model)",
        NULL, lenet_handle, lenet_start, lenet_stop);

const struct lynx_builtin_app lynx_builtin_apps[] = {
    {&echo_def, LYNX_CUDA_APP_ECHO},
    {&sockperf_def, LYNX_CUDA_APP_SOCKPERF_ECHO},
    {&sockperf_fault_def, LYNX_CUDA_APP_SOCKPERF_FAULT},
    {&mc_get_def, LYNX_CUDA_APP_MC_GET},
    {&face_def, LYNX_CUDA_APP_FACE_VERIFY},
    {&relay_def, LYNX_CUDA_APP_NONE},
    {&lenet_def, LYNX_CUDA_APP_LENET},
};
const size_t lynx_builtin_apps_n =
    sizeof(lynx_builtin_apps) / sizeof(lynx_builtin_apps[0]);
