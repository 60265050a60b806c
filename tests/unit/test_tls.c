/*
 * test_tls.c - GnuTLS sessions over memory buffers (common/tls.c): two
 * sessions, a client and a server, wired to each other in memory, with
 * certificates from deploy/make-test-ca.sh (the case skips without
 * certtool).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tls.h"
#include "ut_main.h"

static char dir[] = "/tmp/lynx-ut-tls-XXXXXX";
static int have_ca; /* the script made the CAs */

/* One direction of the wire: what one side pushed, not yet fed. */
struct wire {
  uint8_t buf[1 << 20];
  size_t len;
};
static struct wire to_server, to_client;

static int push(void *arg, const void *p, size_t n) {
  struct wire *w = arg;
  if (w->len + n > sizeof(w->buf))
    return -ENOBUFS;
  memcpy(w->buf + w->len, p, n);
  w->len += n;
  return 0;
}

/* What w holds, fed to tc. */
static void carry(struct wire *w, struct lynx_tls_conn *tc) {
  assert_int_equal(lynx_tls_feed(tc, w->buf, w->len), 0);
  w->len = 0;
}

static const char *path(const char *ca, const char *file) {
  static char p[4][256];
  static int i;
  i = (i + 1) % 4;
  snprintf(p[i], sizeof(p[i]), "%s/%s/%s", dir, ca, file);
  return p[i];
}

static int setup(void **state) {
  char cmd[1024];
  (void)state;
  if (system("command -v certtool >/dev/null 2>&1") != 0)
    return 0;
  if (!mkdtemp(dir))
    return -1;
  snprintf(cmd, sizeof(cmd),
           "%s/deploy/make-test-ca.sh %s/ca1 agent1 2>/dev/null && "
           "%s/deploy/make-test-ca.sh %s/ca2 agent2 2>/dev/null",
           LYNX_SRC_DIR, dir, LYNX_SRC_DIR, dir);
  have_ca = system(cmd) == 0;
  return have_ca ? 0 : -1;
}

static int teardown(void **state) {
  char cmd[300];
  (void)state;
  if (have_ca) {
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
      return -1;
  }
  return 0;
}

#define NEED_CA()                                                              \
  do {                                                                         \
    if (!have_ca) {                                                            \
      ut_skip(                                                                 \
          "certtool is missing (gnutls-bin: deploy/install-deps.sh test)");    \
    }                                                                          \
  } while (0)

/* The coordinator's credentials, from ca. */
static void server_creds(struct lynx_tls *t, const char *ca) {
  struct lynx_tls_files f = {path(ca, "ca.pem"), path(ca, "coordinator.pem"),
                             path(ca, "coordinator-key.pem")};
  char err[512];
  assert_int_equal(lynx_tls_load(t, 1, &f, err, sizeof(err)), 0);
  assert_true(t->has_ca);
}

/* A client's: trusting trust_ca, with name's certificate from cert_ca. */
static void client_creds(struct lynx_tls *t, const char *trust_ca,
                         const char *cert_ca, const char *name) {
  char cert[64], key[64], err[512];
  struct lynx_tls_files f = {path(trust_ca, "ca.pem"), cert, key};
  snprintf(cert, sizeof(cert), "%s.pem", name);
  snprintf(key, sizeof(key), "%s-key.pem", name);
  f.cert = path(cert_ca, cert);
  f.key = path(cert_ca, key);
  assert_int_equal(lynx_tls_load(t, 0, &f, err, sizeof(err)), 0);
}

struct pair {
  struct lynx_tls_conn s, c;
  int rs, rc; /* the last handshake results */
  char es[512], ec[512];
};

/* Handshakes until both are done or one fails (or nothing moves). */
static void handshake(struct pair *p, const struct lynx_tls *st,
                      const struct lynx_tls *ct, const char *host) {
  char err[256];
  memset(p, 0, sizeof(*p));
  to_server.len = to_client.len = 0;
  assert_int_equal(
      lynx_tls_conn_init(&p->s, st, NULL, push, &to_client, err, sizeof(err)),
      0);
  assert_int_equal(
      lynx_tls_conn_init(&p->c, ct, host, push, &to_server, err, sizeof(err)),
      0);
  p->rs = p->rc = -EAGAIN;
  for (int i = 0; i < 20; i++) {
    if (p->rc == -EAGAIN) {
      carry(&to_client, &p->c);
      p->rc = lynx_tls_handshake(&p->c, p->ec, sizeof(p->ec));
    }
    if (p->rs == -EAGAIN) {
      carry(&to_server, &p->s);
      p->rs = lynx_tls_handshake(&p->s, p->es, sizeof(p->es));
    }
    if (p->rc != -EAGAIN && p->rs != -EAGAIN)
      break;
    if (p->rc == -EPROTO || p->rs == -EPROTO)
      break;
  }
}

static void pair_free(struct pair *p) {
  lynx_tls_conn_free(&p->s);
  lynx_tls_conn_free(&p->c);
}

/* Everything from -> to: len bytes of what to decrypts. */
static size_t receive(struct wire *w, struct lynx_tls_conn *to, uint8_t *out,
                      size_t cap) {
  char err[256];
  size_t got = 0;
  ssize_t r;
  carry(w, to);
  while ((r = lynx_tls_recv(to, out + got, cap - got, err, sizeof(err))) > 0)
    got += (size_t)r;
  assert_int_equal(r, -EAGAIN);
  return got;
}

/* Both certificates valid: both sides done, the client's certificate
 * passes, and data crosses both ways, a 200 KB message in several
 * records. */
static void test_mutual_ok(void **state) {
  static struct lynx_tls st, ct;
  static uint8_t big[200000], got[200001];
  struct pair p;
  char err[512];
  (void)state;
  NEED_CA();
  server_creds(&st, "ca1");
  client_creds(&ct, "ca1", "ca1", "agent1");
  handshake(&p, &st, &ct, "127.0.0.1");
  assert_int_equal(p.rc, 0);
  assert_int_equal(p.rs, 0);
  assert_int_equal(lynx_tls_peer_check(&p.s, err, sizeof(err)), 0);
  for (size_t i = 0; i < sizeof(big); i++)
    big[i] = (uint8_t)(i * 7);
  assert_int_equal(lynx_tls_send(&p.c, big, sizeof(big)), 0);
  assert_true(to_server.len > sizeof(big)); /* framed and sealed */
  assert_null(memmem(to_server.buf, to_server.len, big + 1000, 64));
  assert_int_equal(receive(&to_server, &p.s, got, sizeof(got)), sizeof(big));
  assert_memory_equal(got, big, sizeof(big));
  assert_int_equal(lynx_tls_send(&p.s, "ok", 2), 0);
  assert_int_equal(receive(&to_client, &p.c, got, sizeof(got)), 2);
  pair_free(&p);
  lynx_tls_free(&st);
  lynx_tls_free(&ct);
}

/* The client on ct completes its handshake with the server on st (it
 * trusts the server), and the server's check refuses it with reason;
 * frees both. */
static void expect_client_refused(struct lynx_tls *st, struct lynx_tls *ct,
                                  const char *reason) {
  struct pair p;
  char err[512];
  handshake(&p, st, ct, "127.0.0.1");
  assert_int_equal(p.rs, 0);
  assert_int_equal(lynx_tls_peer_check(&p.s, err, sizeof(err)), -EACCES);
  assert_non_null(strstr(err, reason));
  pair_free(&p);
  lynx_tls_free(st);
  lynx_tls_free(ct);
}

/* A client certificate from another CA: the handshake completes (the
 * client trusts us) but the server's check refuses it, saying why. */
static void test_client_cert_other_ca(void **state) {
  static struct lynx_tls st, ct;
  (void)state;
  NEED_CA();
  server_creds(&st, "ca1");
  client_creds(&ct, "ca1", "ca2", "agent2");
  expect_client_refused(&st, &ct, "NOT trusted");
}

/* A client with no certificate (built by hand: lynx_tls_load refuses
 * one): refused by the server's check. */
static void test_no_client_cert(void **state) {
  static struct lynx_tls st, ct;
  (void)state;
  NEED_CA();
  server_creds(&st, "ca1");
  memset(&ct, 0, sizeof(ct));
  assert_int_equal(gnutls_certificate_allocate_credentials(&ct.cred), 0);
  assert_int_equal(gnutls_certificate_set_x509_trust_file(
                       ct.cred, path("ca1", "ca.pem"), GNUTLS_X509_FMT_PEM),
                   1);
  expect_client_refused(&st, &ct, "no client certificate");
}

/* The client checks the coordinator: a certificate from a CA it does not
 * trust, or one that does not name the host dialed, fails the handshake
 * with the reason. */
static void test_server_not_trusted(void **state) {
  static struct lynx_tls st, ct, ct2;
  struct pair p;
  (void)state;
  NEED_CA();
  server_creds(&st, "ca1");
  client_creds(&ct, "ca2", "ca2", "agent2");
  handshake(&p, &st, &ct, "127.0.0.1");
  assert_int_equal(p.rc, -EPROTO);
  assert_non_null(strstr(p.ec, "NOT trusted"));
  pair_free(&p);
  client_creds(&ct2, "ca1", "ca1", "agent1");
  handshake(&p, &st, &ct2, "10.9.9.9");
  assert_int_equal(p.rc, -EPROTO);
  assert_non_null(strstr(p.ec, "not match"));
  pair_free(&p);
  handshake(&p, &st, &ct2, "localhost"); /* its DNS name is fine */
  assert_int_equal(p.rc, 0);
  pair_free(&p);
  lynx_tls_free(&st);
  lynx_tls_free(&ct);
  lynx_tls_free(&ct2);
}

/* A plain-text peer (a Hello frame where a ClientHello belongs) fails the
 * server's handshake; nothing is leaked (ASan build). */
static void test_plaintext_peer(void **state) {
  static struct lynx_tls st;
  struct lynx_tls_conn s;
  const uint8_t frame[] = {0,   0,   0,   12,   0x0a, 10,  'a', 'g',
                           'e', 'n', 't', 0x12, 2,    'a', '1', 0};
  char err[512];
  (void)state;
  NEED_CA();
  server_creds(&st, "ca1");
  to_client.len = 0;
  assert_int_equal(
      lynx_tls_conn_init(&s, &st, NULL, push, &to_client, err, sizeof(err)), 0);
  assert_int_equal(lynx_tls_feed(&s, frame, sizeof(frame)), 0);
  assert_int_equal(lynx_tls_handshake(&s, err, sizeof(err)), -EPROTO);
  assert_true(strlen(err) > 0);
  lynx_tls_conn_free(&s);
  lynx_tls_free(&st);
}

/* Options that contradict each other, files that are missing, not PEM or
 * do not match: each refused with a sentence naming the option. */
static void test_load_errors(void **state) {
  struct lynx_tls t;
  char err[512];
  struct lynx_tls_files none = {NULL, NULL, NULL};
  (void)state;
  NEED_CA();
  assert_int_equal(lynx_tls_load(&t, 1, &none, err, sizeof(err)), 1);
  {
    struct lynx_tls_files f = {NULL, path("ca1", "coordinator.pem"), NULL};
    assert_int_equal(lynx_tls_load(&t, 1, &f, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "--tls-key is missing"));
  }
  {
    struct lynx_tls_files f = {path("ca1", "ca.pem"), NULL, NULL};
    assert_int_equal(lynx_tls_load(&t, 1, &f, err, sizeof(err)), -EINVAL);
    assert_int_equal(lynx_tls_load(&t, 0, &f, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "--tls-ca needs --tls-cert"));
    assert_int_equal(lynx_tls_load_client(&t, &f, 0, err, sizeof(err)),
                     -EINVAL);
    assert_non_null(strstr(err, "static mode"));
  }
  {
    struct lynx_tls_files f = {NULL, path("ca1", "coordinator.pem"),
                               path("ca1", "agent1-key.pem")};
    assert_int_equal(lynx_tls_load(&t, 1, &f, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "does not match"));
  }
  {
    struct lynx_tls_files f = {NULL, path("ca1", "nope.pem"),
                               path("ca1", "agent1-key.pem")};
    assert_int_equal(lynx_tls_load(&t, 1, &f, err, sizeof(err)), -ENOENT);
    assert_non_null(strstr(err, "--tls-cert"));
  }
  {
    struct lynx_tls_files f = {path("ca1", "agent1-key.pem"),
                               path("ca1", "coordinator.pem"),
                               path("ca1", "coordinator-key.pem")};
    assert_int_equal(lynx_tls_load(&t, 1, &f, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "--tls-ca"));
  }
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mutual_ok),
      cmocka_unit_test(test_client_cert_other_ca),
      cmocka_unit_test(test_no_client_cert),
      cmocka_unit_test(test_server_not_trusted),
      cmocka_unit_test(test_plaintext_peer),
      cmocka_unit_test(test_load_errors),
  };
  return LYNX_UT_MAIN(argc, argv, "tls", tests, setup, teardown);
}
