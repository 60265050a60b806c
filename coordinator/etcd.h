/*
 * etcd.h - a small client of etcd's v3 API, through its gRPC-JSON gateway
 * (POST /v3/kv/range, put, deleterange, txn; /v3/lease/grant, keepalive,
 * revoke) with libcurl and json-c; keys and values are base64 on the wire
 * (OpenSSL's EVP_EncodeBlock). docs/etcd.md says how the coordinator uses
 * it.
 *
 * Calls block, each bounded by the client's timeout, and are made by one
 * thread at a time (a client holds one curl handle; the caller serialises).
 * A client knows several endpoints ("http://host:port,..."): a call goes
 * to the last one that answered, and on a transport failure or an
 * unavailable member (HTTP 5xx) tries the others once each, in order.
 *
 * Errors are -errno with a sentence in err: -ETIMEDOUT / -ECONNREFUSED /
 * -EHOSTUNREACH when no endpoint answered, -EAGAIN when the members
 * answered that they cannot serve (no leader, no quorum), -EPROTO for an
 * answer that is not what the API documents, -EINVAL for a request etcd
 * refused.
 */
#ifndef LYNX_ETCD_H
#define LYNX_ETCD_H

#include <stddef.h>
#include <stdint.h>

#define LYNX_ETCD_ENDPOINTS_MAX 16

struct lynx_etcd;

struct lynx_etcd_kv {
  char *key;
  char *value; /* NUL-terminated (value_len bytes before the NUL) */
  size_t value_len;
  int64_t create_rev, mod_rev, version, lease;
};

struct lynx_etcd_kvs {
  struct lynx_etcd_kv *kv;
  size_t n;
  int64_t revision; /* the store's revision when it answered */
};

/* A comparison of a transaction: key's create or mod revision, or its
 * value, equal (or not) to what is given. */
enum lynx_etcd_target { LYNX_ETCD_CREATE, LYNX_ETCD_MOD, LYNX_ETCD_VALUE };
struct lynx_etcd_cmp {
  const char *key;
  enum lynx_etcd_target target;
  int not_equal;     /* 0: EQUAL, 1: NOT_EQUAL */
  int64_t rev;       /* CREATE, MOD (0: the key does not exist) */
  const char *value; /* VALUE */
};

/* An operation of a transaction. */
enum lynx_etcd_opkind { LYNX_ETCD_PUT, LYNX_ETCD_DEL, LYNX_ETCD_DEL_PREFIX };
struct lynx_etcd_op {
  enum lynx_etcd_opkind kind;
  const char *key;
  const char *value; /* PUT: value_len bytes */
  size_t value_len;
  int64_t lease; /* PUT: 0, or the lease the key lives and dies with */
};

/* endpoints: "http://host:port[,http://host:port...]" (at most
 * LYNX_ETCD_ENDPOINTS_MAX); timeout_ms bounds each call (a connection
 * attempt to one endpoint: a third of it). Makes no call. 0 or -errno
 * with err. */
int lynx_etcd_open(struct lynx_etcd **out, const char *endpoints,
                   uint32_t timeout_ms, char *err, size_t errlen);
void lynx_etcd_close(struct lynx_etcd *e);
/* The endpoint the last call reached ("" before any). */
const char *lynx_etcd_endpoint(const struct lynx_etcd *e);

/* key, or with prefix every key that starts with it (sorted by key). A
 * key that does not exist is an empty answer, not an error. */
int lynx_etcd_get(struct lynx_etcd *e, const char *key, int prefix,
                  struct lynx_etcd_kvs *out, char *err, size_t errlen);
void lynx_etcd_kvs_free(struct lynx_etcd_kvs *k);

/* The comparisons all hold: the ok operations, else the fail ones,
 * atomically; *succeeded says which (NULL: not wanted), *rev the
 * revision after it. etcd takes up to 128 operations per transaction
 * (--max-txn-ops). */
int lynx_etcd_txn(struct lynx_etcd *e, const struct lynx_etcd_cmp *cmp,
                  size_t ncmp, const struct lynx_etcd_op *ok, size_t nok,
                  const struct lynx_etcd_op *fail, size_t nfail, int *succeeded,
                  int64_t *rev, char *err, size_t errlen);
/* One operation, unconditionally (a transaction without comparisons). */
int lynx_etcd_put(struct lynx_etcd *e, const char *key, const char *value,
                  size_t value_len, int64_t lease, char *err, size_t errlen);
int lynx_etcd_del(struct lynx_etcd *e, const char *key, int prefix, char *err,
                  size_t errlen);

/* Waits until key (with prefix: any key under it) changes at a revision
 * from from_rev on (0: from now), for at most timeout_ms, or until *stop
 * (NULL: never) turns nonzero. 1: a change (or etcd can no longer say:
 * its history was compacted past from_rev; read again), 0: none within
 * the time, or stopping; -errno with err when etcd could not be asked
 * (only the endpoint that answered last is tried). */
int lynx_etcd_watch(struct lynx_etcd *e, const char *key, int prefix,
                    int64_t from_rev, uint32_t timeout_ms, const int *stop,
                    char *err, size_t errlen);

/* Leases: granted for ttl_s seconds (*id); kept alive (*ttl_left: the
 * seconds it has now; 0 when it has expired or was revoked: its keys are
 * gone); revoked (its keys deleted at once). */
int lynx_etcd_lease_grant(struct lynx_etcd *e, uint32_t ttl_s, int64_t *id,
                          char *err, size_t errlen);
int lynx_etcd_lease_keepalive(struct lynx_etcd *e, int64_t id,
                              int64_t *ttl_left, char *err, size_t errlen);
int lynx_etcd_lease_revoke(struct lynx_etcd *e, int64_t id, char *err,
                           size_t errlen);

#endif
