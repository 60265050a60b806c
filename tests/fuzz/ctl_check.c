/* ctl_check.c - checks on decoded control messages; see ctl_check.h. */
#include "ctl_check.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "apps.h"
#include "fuzz.h"
#include "registry.h"
#include "wire.h"

int fz_ctl_desc(const Lynx__RegionDesc *pb, struct lynx_region_desc *d) {
  struct lynx_region_desc back;
  Lynx__RegionDesc pb2;
  char err[256] = "";
  int rc = lynx_desc_from_pb(pb, d, err, sizeof(err));
  FZ_CHECK(rc == 0 || rc == -EINVAL);
  if (rc) {
    FZ_CHECK(err[0]); /* a refusal says why */
    return rc;
  }
  lynx_desc_to_pb(d, &pb2);
  FZ_CHECK(lynx_desc_from_pb(&pb2, &back, err, sizeof(err)) == 0);
  /* rkeys mean something to rdma only, the only transport that sends
   * them on */
  if (lynx_transport_id(d->transport) != LYNX_TRANSPORT_RDMA)
    memcpy(back.rkeys, d->rkeys, sizeof(back.rkeys));
  FZ_CHECK(memcmp(&back, d, sizeof(back)) == 0);
  return 0;
}

static void check_hello(const Lynx__Hello *h) {
  static const char *const tokens[] = {NULL, "", "fuzz-token"};
  for (size_t i = 0; i < sizeof(tokens) / sizeof(tokens[0]); i++) {
    char err[400] = "";
    int rc = lynx_hello_check(h, tokens[i], err, sizeof(err));
    FZ_CHECK(rc == 0 || ((rc == -EPROTO || rc == -EACCES) && err[0]));
    /* the same token is always equal to itself, another never */
    if (h->token) {
      FZ_CHECK(lynx_token_equal(h->token, h->token));
      if (tokens[i])
        FZ_CHECK(lynx_token_equal(h->token, tokens[i]) ==
                 !strcmp(h->token, tokens[i]));
    }
  }
}

static void check_register(const Lynx__Register *m) {
  struct lynx_region_desc d;
  for (size_t i = 0; i < m->n_accels; i++)
    for (size_t k = 0; k < m->accels[i]->n_apps; k++)
      if (m->accels[i]->apps[k])
        (void)lynx_text_ok(m->accels[i]->apps[k],
                           strlen(m->accels[i]->apps[k]));
  for (size_t i = 0; i < m->n_instances; i++)
    if (m->instances[i]->region)
      fz_ctl_desc(m->instances[i]->region, &d);
}

/* The agent's StartInstance: the application by name, its back ends. */
static void check_start(const Lynx__StartInstance *s) {
  const struct lynx_app *app;
  if (!s->service || !s->service->app)
    return;
  app = lynx_app_find(s->service->app);
  FZ_CHECK(!app || !strcmp(app->name, s->service->app));
}

void fz_ctl_check(const Lynx__Envelope *env) {
  struct lynx_region_desc d;
  switch (env->msg_case) {
  case LYNX__ENVELOPE__MSG_HELLO:
    check_hello(env->hello);
    break;
  case LYNX__ENVELOPE__MSG_REGISTER:
    check_register(env->register_);
    break;
  case LYNX__ENVELOPE__MSG_DESCRIPTORS:
    for (size_t i = 0; i < env->descriptors->n_regions; i++)
      fz_ctl_desc(env->descriptors->regions[i], &d);
    break;
  case LYNX__ENVELOPE__MSG_DISPATCH_TABLE:
    for (size_t i = 0; i < env->dispatch_table->n_services; i++) {
      const Lynx__ServiceTable *st = env->dispatch_table->services[i];
      for (size_t k = 0; k < st->n_entries; k++)
        if (st->entries[k]->region)
          fz_ctl_desc(st->entries[k]->region, &d);
    }
    break;
  case LYNX__ENVELOPE__MSG_START_INSTANCE:
    check_start(env->start_instance);
    break;
  case LYNX__ENVELOPE__MSG_INSTANCE_READY:
    if (env->instance_ready->region)
      fz_ctl_desc(env->instance_ready->region, &d);
    break;
  default: /* read field by field, no function of their own */
    break;
  }
}

void fz_ctl_roundtrip(const Lynx__Envelope *env) {
  struct lynx_frame_reader r;
  Lynx__Envelope *back = NULL;
  uint8_t *a = NULL, *b = NULL;
  size_t alen = 0, blen = 0;
  if (lynx_frame_encode(env, SIZE_MAX, &a, &alen))
    return; /* out of memory */
  lynx_frame_reader_init(&r, alen);
  /* protobuf-c keeps an unknown field whose tag was spelled 0x80 0x00 and
   * writes it back as 0x00, which it refuses: such a frame does not come
   * back (no daemon sends on what it received as is) */
  if (lynx_frame_feed(&r, a, alen) == 0 && lynx_frame_next(&r, &back) == 1) {
    FZ_CHECK(r.len == 0);
    if (lynx_frame_encode(back, SIZE_MAX, &b, &blen) == 0) {
      FZ_CHECK(blen == alen && memcmp(a, b, alen) == 0);
      free(b);
    }
    lynx__envelope__free_unpacked(back, NULL);
  }
  lynx_frame_reader_free(&r);
  free(a);
}

void fz_ctl_stream(const uint8_t *p, size_t n, size_t piece, size_t max,
                   fz_ctl_msg_fn on_msg, void *arg) {
  struct lynx_frame_reader r;
  size_t at = 0;
  int open = 1;
  lynx_frame_reader_init(&r, max);
  while (open && at < n) {
    size_t k = n - at < piece ? n - at : piece;
    if (lynx_frame_feed(&r, p + at, k))
      break;
    at += k;
    for (;;) {
      Lynx__Envelope *env = NULL;
      int rc = lynx_frame_next(&r, &env);
      if (rc == 0)
        break;
      if (rc < 0) {
        FZ_CHECK(rc == -EMSGSIZE || rc == -EBADMSG);
        open = 0;
        break;
      }
      FZ_CHECK(env && env->msg_case != LYNX__ENVELOPE__MSG__NOT_SET);
      fz_ctl_check(env);
      fz_ctl_roundtrip(env);
      rc = on_msg(arg, env);
      lynx__envelope__free_unpacked(env, NULL);
      if (rc == FZ_CTL_CLOSE) {
        open = 0;
        break;
      }
      if (rc == FZ_CTL_TRUST)
        r.max = LYNX_FRAME_MAX_DEFAULT; /* lynx_ctl_trust */
    }
    if (open) /* what is left is less than one frame */
      FZ_CHECK(r.len < LYNX_FRAME_HDR + r.max);
  }
  lynx_frame_reader_free(&r);
}
