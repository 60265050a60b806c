/*
 * tls.h - GnuTLS for the control connections (and the coordinator's API
 * keys): a daemon's credentials, loaded once at start, and one session per
 * connection driven over memory buffers.
 *
 * libuv owns the socket, so GnuTLS never touches it: what uv_read brings
 * is fed in (lynx_tls_feed) and GnuTLS pulls it from there; what GnuTLS
 * sends goes to a push callback that hands it to uv_write. Both sides of a
 * session are therefore non-blocking and run on the connection's loop
 * thread (docs/tls.md).
 *
 * Authentication is mutual and against one cluster CA: a client checks the
 * server's certificate and that it names the host it dialed (during the
 * handshake, which fails otherwise); a server asks for the client's
 * certificate and checks it after the handshake (lynx_tls_peer_check), so
 * that a peer without a valid one can be refused with a reason it can read,
 * counted as a wrong token is.
 */
#ifndef LYNX_TLS_H
#define LYNX_TLS_H

#include <gnutls/gnutls.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* A daemon's TLS configuration. */
struct lynx_tls {
  gnutls_certificate_credentials_t cred;
  int server;
  int has_ca;               /* peers are verified against a CA */
  char *cert_pem, *key_pem; /* the files' text (the API serves them) */
};

/* The options of one daemon, as given: NULL when absent. */
struct lynx_tls_files {
  const char *ca, *cert, *key;
};

/* Loads t from f: a server (the coordinator) needs cert and key, and
 * verifies clients when f->ca is given; a client needs f->ca and, to
 * authenticate, cert and key. Contradicting options (a cert without its
 * key, a client cert without a CA), an unreadable file, a file that is no
 * PEM certificate or key, or a key that does not match the certificate
 * are refused with a sentence naming the option and the file in err.
 * 0 (t loaded; lynx_tls_free it), 1 when f names nothing (t untouched, no
 * TLS), or -errno. */
int lynx_tls_load(struct lynx_tls *t, int server,
                  const struct lynx_tls_files *f, char *err, size_t errlen);
/* An agent's or a frontend's: lynx_tls_load as a client, where only the
 * connection to a coordinator (to_coordinator) speaks TLS; --tls-* in
 * static mode are refused. Same returns. */
int lynx_tls_load_client(struct lynx_tls *t, const struct lynx_tls_files *f,
                         int to_coordinator, char *err, size_t errlen);
void lynx_tls_free(struct lynx_tls *t);

/* Sends n bytes of ciphertext to the peer; 0 or -errno. */
typedef int (*lynx_tls_push_fn)(void *arg, const void *buf, size_t n);

/* One session. */
struct lynx_tls_conn {
  gnutls_session_t s;
  uint8_t *in; /* ciphertext fed in, not yet pulled by GnuTLS */
  size_t in_off, in_len, in_cap;
  uint64_t fed;   /* bytes fed in all */
  int ready;      /* the handshake completed */
  char host[256]; /* a client's: what the server's certificate must name */
  lynx_tls_push_fn push;
  void *push_arg;
};

/* Starts a session on t. host: a client's, the host it dialed (the
 * server's certificate must name it: an IP address or a DNS name). 0 or
 * -errno (err says why). */
int lynx_tls_conn_init(struct lynx_tls_conn *tc, const struct lynx_tls *t,
                       const char *host, lynx_tls_push_fn push, void *arg,
                       char *err, size_t errlen);
void lynx_tls_conn_free(struct lynx_tls_conn *tc);
/* Appends n bytes received from the peer. 0 or -ENOMEM. */
int lynx_tls_feed(struct lynx_tls_conn *tc, const void *buf, size_t n);
/* Advances the handshake as far as what was fed allows: 0 done (ready),
 * -EAGAIN more is needed from the peer, or -EPROTO with the reason in err
 * (a plain-text peer, a certificate the client does not trust: the
 * connection is to be closed). */
int lynx_tls_handshake(struct lynx_tls_conn *tc, char *err, size_t errlen);
/* Decrypts into buf: bytes (> 0), -EAGAIN (nothing complete yet), 0 (the
 * peer closed the session), or -EPROTO with the reason in err. */
ssize_t lynx_tls_recv(struct lynx_tls_conn *tc, void *buf, size_t n, char *err,
                      size_t errlen);
/* Encrypts all n bytes and pushes them. 0 or -errno. */
int lynx_tls_send(struct lynx_tls_conn *tc, const void *buf, size_t n);
/* A server's check of the client after the handshake: 0 when it presented
 * a certificate the CA signed, valid now; else -EACCES with the reason
 * ("presented no certificate", "certificate ... not signed by the cluster
 * CA", ...) in err. */
int lynx_tls_peer_check(struct lynx_tls_conn *tc, char *err, size_t errlen);

#endif
