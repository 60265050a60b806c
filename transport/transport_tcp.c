/*
 * transport_tcp.c - the "tcp" backend: one-sided writes and reads of a
 * remote region carried over a TCP connection and applied by the agent.
 *
 * Wire format (docs/design.md, "tcp transport"): every operation is a
 * 24-byte little-endian header {u8 op, u8 flags, u16 zero, u32 len, u64 off,
 * u64 wr_id} followed by len bytes for HELLO, WRITE, READ_TX and the
 * replies. The frontend sends HELLO {magic, version, region id, epoch,
 * region size, producer}; the agent answers CHALLENGE {nonce}, the
 * frontend PROOF {HMAC-SHA256(key, nonce || HELLO)} (version 4: the key
 * never crosses the wire, tcp_auth.h), and the agent HELLO_REPLY (off = 0
 * or an errno, payload = reason; an unknown region id is refused at once).
 * Then WRITE, READ and READ_TX operations; the agent answers one
 * READ_RESP per READ and READ_TX_RESP per READ_TX, in order.
 *
 * Fencing (version 3): producer is the frontend epoch (desc.producer). The
 * agent refuses an older one than the region admitted (HELLO_REPLY
 * ESTALE, "fenced: ..."); a newer one takes the region over: every
 * connection of an older epoch gets FENCED (off = ESTALE, payload =
 * reason) after its last reply and is closed, so that frontend's next op
 * returns -ESTALE. No operation of a cut connection is applied after the
 * HELLO that cut it: one thread serves both.
 *
 * READ_TX (version 2) is the frontend's poll in one round trip: the agent
 * reads the control array and, from that snapshot, the published TX slots
 * of the mqueues named, from the positions named, and answers with both;
 * the two-step path (array, then slots) took two, each a wake-up of the
 * agent's thread and of the frontend's.
 *
 * SUBSCRIBE and PUSH (version 5) make polling the fallback: the frontend
 * subscribes its mqueues from where it resumes (SUBSCRIBE_RESP in reply
 * order says whether the agent pushes), and the agent sends every TX slot
 * published there in PUSH frames between the replies, as soon as its
 * accelerator publishes (a CPU accelerator rings the agent thread's bell;
 * a GPU's control words are watched), with the rx_cons words and, from
 * host memory, the large messages the slots name. One message each way
 * per request: the request written, the answer pushed
 * (tcp_agent_conn.c, "Pushing").
 *
 * Semantics match shm: the agent applies operations in stream order, so a
 * read sees every earlier write (the fenced ordering mode's barrier comes
 * free) and a PUBLISH write stores its last word with release semantics
 * after the rest. After each batch of writes the agent wakes a CPU
 * accelerator that sleeps on the region's doorbell, so the frontend's
 * notify costs nothing on the wire.
 *
 * Bounds and access classes are checked on both sides: the frontend refuses
 * to post an access outside the region (-EFAULT) or a write outside fctrl
 * and the RX rings; the agent closes a connection that asks for one, with a
 * logged reason, before touching memory. A frame that does not parse is
 * treated the same way.
 *
 * Batching: the frontend appends operations to one buffer and sends it with
 * one send() per flush (the doorbell); the agent serves every complete
 * operation a read() brings and answers the reads with one write. Both sides
 * pipeline: a frontend may post new operations before earlier reads return.
 * Device memory with batch ops (struct lynx_region_mem: a GPU's) gets the
 * operations of one read() as one batch: writes are started without
 * waiting, reads are started into the memory's staging with their reply
 * space reserved in order, and one flush at the end waits for all of them
 * before the replies are filled.
 *
 * Files (tcp_internal.h): tcp_wire.c, the frame codec and buffers;
 * tcp_auth.c, the proof of the key; tcp_agent.c, the agent's handle
 * (listener, thread, exported regions) over tcp_agent_conn.c, one data
 * connection served; tcp_frontend.c, a frontend's connection. This file
 * is the ops table on top of them: it hands itself to each side when that
 * side creates a handle or a connection, so neither names it.
 */
#include <stddef.h>

#include "tcp_internal.h"
#include "transport.h"

static int lynx__tcp_agent_create(const struct lynx_transport_opts *o,
                                  struct lynx_transport_agent **out, char *err,
                                  size_t errlen) {
  return lynx__tcp_agent_start(&lynx_transport_tcp, o, out, err, errlen);
}

static int lynx__tcp_connect(const struct lynx_region_desc *d,
                             struct lynx_tconn **out) {
  return lynx__tcp_conn_open(&lynx_transport_tcp, d, out);
}

/* The agent's accelerators cannot reach this frontend's bell: the
 * socket (wait_fd) wakes a sleeping worker. */
#define lynx__tcp_arm lynx__arm_none

const struct lynx_transport_ops lynx_transport_tcp =
    LYNX_TRANSPORT_OPS("tcp", lynx__tcp);
