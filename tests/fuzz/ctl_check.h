/*
 * ctl_check.h - what the control-connection harnesses (fuzz_ctl_frame.c,
 * fuzz_ctl_coordinator.c) run on every lynx.Envelope they decode: the
 * checks the daemons make on each message they accept, where those are
 * functions of their own (proto/frame.h lynx_hello_check, proto/desc.h
 * lynx_desc_from_pb, the agent's lynx_app_find, the coordinator's
 * lynx_text_ok), and properties of the encoding.
 */
#ifndef LYNX_FUZZ_CTL_CHECK_H
#define LYNX_FUZZ_CTL_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "desc.h"
#include "frame.h"

/* lynx_desc_from_pb on pb, as the coordinator (Register, InstanceReady)
 * and the frontend (Descriptors, DispatchTable) run it. A descriptor it
 * takes must come back the same through lynx_desc_to_pb, what the
 * coordinator forwards to frontends. 0 (d filled) or -EINVAL. */
int fz_ctl_desc(const Lynx__RegionDesc *pb, struct lynx_region_desc *d);

/* Every check a daemon that accepts env's message makes on it. */
void fz_ctl_check(const Lynx__Envelope *env);

/* env encoded as a frame and read back by a frame reader decodes (when
 * protobuf-c takes what it wrote) to a message that encodes to the same
 * bytes. */
void fz_ctl_roundtrip(const Lynx__Envelope *env);

/* What a harness does with one decoded message: 0 to read on,
 * FZ_CTL_TRUST to read on with frames up to the daemons' default cap (the
 * peer's Hello passed), FZ_CTL_CLOSE to close the connection. */
enum { FZ_CTL_CLOSE = -1, FZ_CTL_TRUST = 1 };
typedef int (*fz_ctl_msg_fn)(void *arg, const Lynx__Envelope *env);

/* Reads p[0, n) as common/ctlconn.c reads a connection: fed to a frame
 * reader in pieces of piece bytes (SIZE_MAX: at once), frames capped at
 * max until on_msg trusts the peer; each message checked (fz_ctl_check,
 * fz_ctl_roundtrip), then handed to on_msg (env is freed after it
 * returns). Ends with the bytes, a refused frame or FZ_CTL_CLOSE. */
void fz_ctl_stream(const uint8_t *p, size_t n, size_t piece, size_t max,
                   fz_ctl_msg_fn on_msg, void *arg);

#endif
