/* tls.c - GnuTLS credentials and sessions over memory buffers; see tls.h. */
#include "tls.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util.h"

/* A handshake message larger than this fails the handshake: a stranger
 * cannot make us buffer more before it authenticates (our certificates
 * are well under 4 KiB; the default would be 128 KiB). */
#define HANDSHAKE_MAX (64u << 10)
/* A PEM file larger than this is not a certificate or key we make. */
#define PEM_MAX (1u << 20)

/* The text of path into *out (malloc'd, NUL-terminated). */
static int read_pem(const char *opt, const char *path, char **out, char *err,
                    size_t errlen) {
  FILE *f = fopen(path, "rb");
  struct stat st;
  size_t n;
  *out = NULL;
  if (!f)
    return lynx_fail(err, errlen, -errno, "--%s %s: %s", opt, path,
                     strerror(errno));
  if (fstat(fileno(f), &st) || !S_ISREG(st.st_mode) ||
      (uint64_t)st.st_size > PEM_MAX) {
    fclose(f);
    return lynx_fail(err, errlen, -EINVAL,
                     "--%s %s: not a regular file of "
                     "at most %u bytes",
                     opt, path, PEM_MAX);
  }
  *out = malloc((size_t)st.st_size + 1);
  if (!*out) {
    fclose(f);
    return lynx_fail(err, errlen, -ENOMEM, "--%s %s: out of memory", opt, path);
  }
  n = fread(*out, 1, (size_t)st.st_size, f);
  (*out)[n] = '\0';
  fclose(f);
  return 0;
}

int lynx_tls_load(struct lynx_tls *t, int server,
                  const struct lynx_tls_files *f, char *err, size_t errlen) {
  char *ca = NULL;
  int rc;
  if (!f->ca && !f->cert && !f->key)
    return 1;
  if (!f->cert != !f->key)
    return lynx_fail(err, errlen, -EINVAL,
                     "--tls-cert and --tls-key go "
                     "together (%s is missing)",
                     f->cert ? "--tls-key" : "--tls-cert");
  if (server && !f->cert)
    return lynx_fail(err, errlen, -EINVAL,
                     "--tls-ca needs --tls-cert and "
                     "--tls-key: this coordinator's own certificate");
  if (!server && !f->ca)
    return lynx_fail(err, errlen, -EINVAL,
                     "--tls-cert needs --tls-ca: the "
                     "CA that signed the coordinator's certificate");
  if (!server && !f->cert)
    return lynx_fail(err, errlen, -EINVAL,
                     "--tls-ca needs --tls-cert and "
                     "--tls-key: the coordinator refuses a peer without a "
                     "certificate its CA signed");
  memset(t, 0, sizeof(*t));
  t->server = server;
  if (gnutls_certificate_allocate_credentials(&t->cred) < 0)
    return lynx_fail(err, errlen, -ENOMEM, "TLS: out of memory");
  if ((rc = read_pem("tls-cert", f->cert, &t->cert_pem, err, errlen)) ||
      (rc = read_pem("tls-key", f->key, &t->key_pem, err, errlen)))
    goto fail;
  {
    gnutls_datum_t c = {(unsigned char *)t->cert_pem,
                        (unsigned)strlen(t->cert_pem)};
    gnutls_datum_t k = {(unsigned char *)t->key_pem,
                        (unsigned)strlen(t->key_pem)};
    int g = gnutls_certificate_set_x509_key_mem2(t->cred, &c, &k,
                                                 GNUTLS_X509_FMT_PEM, NULL, 0);
    if (g < 0) {
      rc = lynx_fail(err, errlen, -EINVAL, "--tls-cert %s, --tls-key %s: %s",
                     f->cert, f->key,
                     g == GNUTLS_E_CERTIFICATE_KEY_MISMATCH
                         ? "the key does not match the certificate"
                         : gnutls_strerror(g));
      goto fail;
    }
  }
  if (f->ca) {
    gnutls_datum_t d;
    int g;
    if ((rc = read_pem("tls-ca", f->ca, &ca, err, errlen)))
      goto fail;
    d.data = (unsigned char *)ca;
    d.size = (unsigned)strlen(ca);
    g = gnutls_certificate_set_x509_trust_mem(t->cred, &d, GNUTLS_X509_FMT_PEM);
    free(ca);
    if (g <= 0) {
      rc = lynx_fail(err, errlen, -EINVAL, "--tls-ca %s: %s", f->ca,
                     g < 0 ? gnutls_strerror(g) : "holds no PEM certificate");
      goto fail;
    }
    t->has_ca = 1;
  }
  return 0;
fail:
  lynx_tls_free(t);
  return rc;
}

int lynx_tls_load_client(struct lynx_tls *t, const struct lynx_tls_files *f,
                         int to_coordinator, char *err, size_t errlen) {
  if (!to_coordinator && (f->ca || f->cert || f->key))
    return lynx_fail(err, errlen, -EINVAL,
                     "--tls-ca, --tls-cert, --tls-key: "
                     "TLS is for the control connection to a coordinator "
                     "(--coordinator); static mode speaks plain text "
                     "(docs/tls.md)");
  return lynx_tls_load(t, 0, f, err, errlen);
}

void lynx_tls_free(struct lynx_tls *t) {
  if (t->cred)
    gnutls_certificate_free_credentials(t->cred);
  t->cred = NULL;
  free(t->cert_pem);
  free(t->key_pem);
  t->cert_pem = t->key_pem = NULL;
}

/* ---- sessions ----------------------------------------------------------- */

static ssize_t pull(gnutls_transport_ptr_t p, void *buf, size_t n) {
  struct lynx_tls_conn *tc = p;
  size_t have = tc->in_len - tc->in_off;
  if (!have) {
    gnutls_transport_set_errno(tc->s, EAGAIN);
    return -1;
  }
  if (n > have)
    n = have;
  memcpy(buf, tc->in + tc->in_off, n);
  tc->in_off += n;
  return (ssize_t)n;
}

/* GnuTLS asks whether data waits (with a timeout we never block on). */
static int pull_timeout(gnutls_transport_ptr_t p, unsigned ms) {
  struct lynx_tls_conn *tc = p;
  (void)ms;
  return tc->in_len > tc->in_off;
}

static ssize_t push(gnutls_transport_ptr_t p, const void *buf, size_t n) {
  struct lynx_tls_conn *tc = p;
  int rc = tc->push(tc->push_arg, buf, n);
  if (rc) {
    gnutls_transport_set_errno(tc->s, -rc);
    return -1;
  }
  return (ssize_t)n;
}

int lynx_tls_conn_init(struct lynx_tls_conn *tc, const struct lynx_tls *t,
                       const char *host, lynx_tls_push_fn push_fn, void *arg,
                       char *err, size_t errlen) {
  int g;
  memset(tc, 0, sizeof(*tc));
  tc->push = push_fn;
  tc->push_arg = arg;
  g = gnutls_init(&tc->s, (t->server ? GNUTLS_SERVER : GNUTLS_CLIENT) |
                              GNUTLS_NONBLOCK);
  if (g < 0)
    return lynx_fail(err, errlen, -ENOMEM, "TLS: %s", gnutls_strerror(g));
  if ((g = gnutls_set_default_priority(tc->s)) < 0 ||
      (g = gnutls_credentials_set(tc->s, GNUTLS_CRD_CERTIFICATE, t->cred)) <
          0) {
    lynx_tls_conn_free(tc);
    return lynx_fail(err, errlen, -EINVAL, "TLS: %s", gnutls_strerror(g));
  }
  if (t->server)
    /* asked, not required: a peer without one completes the handshake
     * and is refused in its Hello's answer, which says why */
    gnutls_certificate_server_set_request(tc->s, GNUTLS_CERT_REQUEST);
  else {
    /* the handshake fails unless the CA signed the server's certificate
     * and it names host (an IP address is matched against its IP SANs) */
    snprintf(tc->host, sizeof(tc->host), "%s", host ? host : "");
    gnutls_session_set_verify_cert(tc->s, tc->host, 0);
  }
  gnutls_handshake_set_max_packet_length(tc->s, HANDSHAKE_MAX);
  gnutls_transport_set_ptr(tc->s, tc);
  gnutls_transport_set_push_function(tc->s, push);
  gnutls_transport_set_pull_function(tc->s, pull);
  gnutls_transport_set_pull_timeout_function(tc->s, pull_timeout);
  return 0;
}

void lynx_tls_conn_free(struct lynx_tls_conn *tc) {
  if (tc->s)
    gnutls_deinit(tc->s);
  tc->s = NULL;
  free(tc->in);
  tc->in = NULL;
  tc->in_off = tc->in_len = tc->in_cap = 0;
}

int lynx_tls_feed(struct lynx_tls_conn *tc, const void *buf, size_t n) {
  size_t have = tc->in_len - tc->in_off;
  if (!n)
    return 0;
  if (tc->in_off) { /* what GnuTLS pulled is gone: keep the rest in front */
    memmove(tc->in, tc->in + tc->in_off, have);
    tc->in_off = 0;
    tc->in_len = have;
  }
  if (have + n > tc->in_cap) {
    size_t cap = tc->in_cap ? tc->in_cap : 16384;
    uint8_t *p;
    while (cap < have + n)
      cap *= 2;
    p = realloc(tc->in, cap);
    if (!p)
      return -ENOMEM;
    tc->in = p;
    tc->in_cap = cap;
  }
  memcpy(tc->in + tc->in_len, buf, n);
  tc->in_len += n;
  tc->fed += n;
  return 0;
}

/* The reason a client refused the server's certificate. */
static void verify_reason(unsigned status, const char *what, char *err,
                          size_t errlen) {
  gnutls_datum_t out = {NULL, 0};
  if (gnutls_certificate_verification_status_print(status, GNUTLS_CRT_X509,
                                                   &out, 0) >= 0 &&
      out.data) {
    size_t n;
    snprintf(err, errlen, "%s: %s", what, (const char *)out.data);
    gnutls_free(out.data);
    n = strlen(err);
    while (n && err[n - 1] == ' ') /* GnuTLS ends its sentences so */
      err[--n] = '\0';
  } else {
    snprintf(err, errlen, "%s: not trusted (status 0x%x)", what, status);
  }
}

int lynx_tls_handshake(struct lynx_tls_conn *tc, char *err, size_t errlen) {
  int g;
  if (tc->ready)
    return 0;
  do {
    g = gnutls_handshake(tc->s);
  } while (g == GNUTLS_E_INTERRUPTED);
  if (g == GNUTLS_E_SUCCESS) {
    tc->ready = 1;
    return 0;
  }
  if (g == GNUTLS_E_AGAIN)
    return -EAGAIN;
  if (g == GNUTLS_E_CERTIFICATE_VERIFICATION_ERROR)
    verify_reason(gnutls_session_get_verify_cert_status(tc->s),
                  "the peer's certificate", err, errlen);
  else if (g == GNUTLS_E_UNEXPECTED_PACKET_LENGTH ||
           g == GNUTLS_E_UNSUPPORTED_VERSION_PACKET ||
           g == GNUTLS_E_UNEXPECTED_PACKET)
    snprintf(err, errlen, "%s (a peer that does not speak TLS?)",
             gnutls_strerror(g));
  else
    snprintf(err, errlen, "%s", gnutls_strerror(g));
  return -EPROTO;
}

ssize_t lynx_tls_recv(struct lynx_tls_conn *tc, void *buf, size_t n, char *err,
                      size_t errlen) {
  for (;;) {
    ssize_t r = gnutls_record_recv(tc->s, buf, n);
    if (r >= 0)
      return r;
    if (r == GNUTLS_E_AGAIN)
      return -EAGAIN;
    if (r == GNUTLS_E_INTERRUPTED || !gnutls_error_is_fatal((int)r))
      continue; /* a warning alert, a TLS 1.3 key update or ticket */
    snprintf(err, errlen, "%s", gnutls_strerror((int)r));
    return -EPROTO;
  }
}

int lynx_tls_send(struct lynx_tls_conn *tc, const void *buf, size_t n) {
  const uint8_t *p = buf;
  /* a record carries at most 16 KiB: a larger frame takes several; our
   * push never says EAGAIN (it queues on the stream), so each call either
   * sends some or fails */
  while (n) {
    ssize_t r = gnutls_record_send(tc->s, p, n);
    if (r == GNUTLS_E_INTERRUPTED)
      continue;
    if (r <= 0)
      return -EIO;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

int lynx_tls_peer_check(struct lynx_tls_conn *tc, char *err, size_t errlen) {
  unsigned n = 0, status = 0;
  int g;
  if (!gnutls_certificate_get_peers(tc->s, &n) || !n)
    return lynx_fail(err, errlen, -EACCES,
                     "TLS: presented no client certificate");
  g = gnutls_certificate_verify_peers3(tc->s, NULL, &status);
  if (g < 0)
    return lynx_fail(err, errlen, -EACCES, "TLS: client certificate: %s",
                     gnutls_strerror(g));
  if (status) {
    verify_reason(status, "TLS: client certificate", err, errlen);
    return -EACCES;
  }
  return 0;
}
