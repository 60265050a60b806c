/*
 * forwarder.h - the Message Forwarder (Lynx paper §4.2, egress): takes the
 * responses the Remote Message Queue Manager reads from the TX rings, maps
 * each tag back to its client and sends them.
 *
 * Owns: the responses gathered in one pass over every accelerator (sent in
 * dispatch order, 64 per sendmmsg for UDP; framed onto their connections
 * for TCP) and the handing of client mqueues' requests to their back ends.
 */
#ifndef LYNX_FE_FORWARDER_H
#define LYNX_FE_FORWARDER_H

#include <stdint.h>
#include <sys/socket.h>

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

/* The forwarder's state in a worker. */
struct fe_egress {
  /* responses gathered in one forwarder pass over every accelerator, sent
   * in dispatch order so one client's answers from several accelerators do
   * not overtake each other needlessly */
  struct fe_resp *resp;
  uint32_t n_resp, max_resp;
  struct mmsghdr out[FE_SEND_BATCH];
  struct iovec out_iov[FE_SEND_BATCH];
};

/* One pass: every connection's manager cycle (its slots come back through
 * fe_forward_slot), then the gathered responses are sent. Returns
 * responses handled (>= 0). */
int fe_forward(struct fe_worker *w);

/* The manager's slot hook: one staged TX slot at ring position pos. 0 when
 * consumed, -EAGAIN when not published yet (retry from here next cycle). */
int fe_forward_slot(struct fe_worker *w, struct fe_mq *mq,
                    const uint8_t *slot, uint32_t pos, const uint8_t *large,
                    uint32_t large_len);

/* Room for every response one pass can gather from the connection set
 * (called with the set's lock held). 0 or -ENOMEM (nothing changed). */
int fe_forwarder_reserve(struct fe_worker *w);

/* r went out (handed to the kernel at now_ns): counted responded on its
 * mqueue, its end-to-end time into the worker's histogram. */
void fe_resp_sent(struct fe_worker *w, const struct fe_resp *r,
                  uint64_t now_ns);
void fe_forwarder_free(struct fe_worker *w);

#endif
