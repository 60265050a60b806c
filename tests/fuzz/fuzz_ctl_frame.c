/*
 * fuzz_ctl_frame.c - a control connection's bytes (proto/frame.h), as
 * common/ctlconn.c reads them for the coordinator, the agent and the
 * frontend: fed to a frame reader in the pieces the kernel hands over,
 * every complete frame decoded as a lynx.Envelope and checked as the
 * daemon that accepts its message checks it (ctl_check.h), until the
 * stream ends or a frame is refused (the connection closes). Frames are
 * capped at LYNX_CTL_UNTRUSTED_MAX until a Hello comes, at the daemons'
 * default cap after.
 *
 * Input: one byte: bits 0-3 the size of the pieces (0: everything at
 * once, k: 2^(k-1) bytes), bit 4: trusted from the start (a dialer's
 * peer); then the stream. Checked besides memory errors: a refusal is
 * -EMSGSIZE or -EBADMSG; what the reader keeps between reads is less than
 * a frame; every message survives encoding and decoding again.
 */
#include "ctl_check.h"
#include "ctlconn.h"
#include "fuzz.h"

static int on_msg(void *arg, const Lynx__Envelope *env) {
  (void)arg;
  return env->msg_case == LYNX__ENVELOPE__MSG_HELLO ? FZ_CTL_TRUST : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct fz f = {data, size};
  uint8_t flags = fz_u8(&f);
  size_t n;
  const uint8_t *stream = fz_rest(&f, &n);
  fz_quiet();
  fz_ctl_stream(stream, n,
                flags & 15 ? (size_t)1 << ((flags & 15) - 1) : SIZE_MAX,
                flags & 16 ? LYNX_FRAME_MAX_DEFAULT : LYNX_CTL_UNTRUSTED_MAX,
                on_msg, NULL);
  return 0;
}
