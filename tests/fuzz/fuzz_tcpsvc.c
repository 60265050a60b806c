/*
 * fuzz_tcpsvc.c - a TCP service's client stream (frontend/tcpsvc.c): the
 * bytes a client sends, read into the connection's buffer as client_alloc
 * sizes it (fe_tcp_frame_want) and cut into messages after every read as
 * client_parse cuts them (fe_tcp_frame_len), until the stream ends or a
 * frame is refused (the connection closes).
 *
 * Input: u16 fixed length (0: len32; else taken modulo 4 KiB), u32 the
 * accelerators' cap (0: not known; else up to 64 KiB), one byte giving
 * the size of the reads the kernel hands over (1 to 256 bytes, 0: as much
 * as fits), then the stream. Checked besides memory errors: a read always
 * has room (a zero-sized buffer would close a connection sending a frame
 * the service takes); a message is never longer than the cap nor the
 * frame than its bytes; a fixed frame is exactly N bytes.
 */
#include "fuzz.h"
#include "tcpframe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct fz f = {data, size};
  uint32_t fixed = fz_u16(&f) % 4096u, cap = fz_u32(&f) % 65537u;
  uint32_t step = fz_u8(&f), in_len = 0, in_cap = 0;
  uint8_t *in = NULL;
  size_t n, at = 0;
  const uint8_t *stream = fz_rest(&f, &n);
  int closed = 0;
  while (at < n && !closed) {
    uint32_t want = fe_tcp_frame_want(fixed, cap, in, in_len), room, off = 0;
    if (in_cap < want) {
      uint8_t *p = realloc(in, want);
      if (!p)
        break;
      in = p;
      in_cap = want;
    }
    room = in_cap - in_len;
    FZ_CHECK(room > 0);
    if (step && room > step)
      room = step;
    if (room > n - at)
      room = (uint32_t)(n - at);
    memcpy(in + in_len, stream + at, room);
    in_len += room;
    at += room;
    for (;;) {
      uint32_t len = 0;
      long r = fe_tcp_frame_len(fixed, cap, in + off, in_len - off, &len);
      if (r < 0) {
        closed = 1;
        break;
      }
      if (r == 0)
        break;
      FZ_CHECK((uint64_t)r <= in_len - off);
      FZ_CHECK(!cap || len <= cap);
      FZ_CHECK(fixed ? (uint32_t)r == fixed && len == fixed
                     : (uint32_t)r == len + 4u);
      off += (uint32_t)r;
    }
    memmove(in, in + off, in_len - off);
    in_len -= off;
  }
  free(in);
  return 0;
}
