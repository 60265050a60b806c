/*
 * forwarder.h - the Message Forwarder (Lynx paper §4.2, egress): takes the
 * responses the Remote Message Queue Manager reads from the TX rings, maps
 * each tag back to its client and sends them.
 *
 * Owns: the responses gathered in one pass over every accelerator (sent in
 * dispatch order, 64 per sendmmsg for UDP; framed onto their connections
 * for TCP), their accounting (responded, the end-to-end histogram, the
 * drops of answers that cannot go out) and the handing of client mqueues'
 * requests to their back ends.
 *
 * It is made (fe_forwarder_init) with what it reaches (struct
 * fe_egress_opts): the manager whose connections it polls, the tag table,
 * the dispatcher (whose socket UDP answers leave by, and which ends each
 * request) and, for a TCP service, its connections; it knows no worker.
 */
#ifndef LYNX_FE_FORWARDER_H
#define LYNX_FE_FORWARDER_H

#include <stdint.h>
#include <sys/socket.h>

#include "lathist.h"
#include "rmq.h"

#define FE_SEND_BATCH 64

/* A response ready to send; data points into its mqueue's staging. */
struct fe_resp {
  uint64_t seq;
  union lynx_sockaddr addr;
  uint32_t cli, cli_gen; /* TCP services: the client connection */
  const uint8_t *data;
  uint32_t len;
  struct fe_mq *mq;
  uint64_t t_ns; /* its request's dispatch (the worker loop's time) */
};

struct fe_ingress;
struct fe_tcpsvc;

/* What a forwarder is made with (fe_forwarder_init copies it). */
struct fe_egress_opts {
  uint32_t worker; /* its worker's index (log lines) */
  /* shared with its worker: the manager whose connections each pass
   * polls, the tags that map a response back to its client */
  struct fe_rmq *rmq;
  struct lynx_tagtab *tags;
  /* the dispatcher: it ends every request answered, and UDP answers go
   * out on its socket */
  struct fe_ingress *ingress;
  struct fe_tcpsvc *tcp; /* a TCP service's connections; NULL: UDP */
};

/* The forwarder's state in a worker. */
struct fe_egress {
  struct fe_egress_opts opts;
  /* responses gathered in one forwarder pass over every accelerator, sent
   * in dispatch order so one client's answers from several accelerators do
   * not overtake each other needlessly */
  struct fe_resp *resp;
  uint32_t n_resp, max_resp;
  struct mmsghdr out[FE_SEND_BATCH];
  struct iovec out_iov[FE_SEND_BATCH];
  /* End-to-end time of the requests answered (resp_sent: from the
   * dispatch, in the loop pass that received it, to the answer handed to
   * the kernel); one writer, read by other threads (metrics.c) like the
   * counters. */
  struct lynx_lat_hist e2e;
};

/* Sets up a forwarder (main thread; any memory): opts copied. */
void fe_forwarder_init(struct fe_egress *eg, const struct fe_egress_opts *o);

/* One pass: every connection's manager cycle (its slots come back through
 * fe_forward_slot), then the gathered responses are sent. Returns
 * responses handled (>= 0). */
int fe_forward(struct fe_egress *eg);

/* The manager's slot hook (the worker's hooks->slot jumps here): one
 * staged TX slot at ring position pos. 0 when consumed, -EAGAIN when not
 * published yet (retry from here next cycle). */
int fe_forward_slot(struct fe_egress *eg, struct fe_mq *mq, const uint8_t *slot,
                    uint32_t pos, const uint8_t *large, uint32_t large_len);

/* Room for every response one pass can gather from the connection set
 * (called with the set's lock held). 0 or -ENOMEM (nothing changed). */
int fe_forwarder_reserve(struct fe_egress *eg);

void fe_forwarder_free(struct fe_egress *eg);

#endif
