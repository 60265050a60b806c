/*
 * tcpframe.h - cutting a TCP service's client stream into messages
 * (tcpsvc.c, docs/tcp-services.md): len32 (a 4-byte big-endian length,
 * then the bytes) or fixed N (every message N bytes). Pure functions, so
 * the fuzzer (tests/fuzz/fuzz_tcpsvc.c) runs what a connection runs.
 *
 * fixed is the service's fixed length (0: len32); cap the largest message
 * every accelerator of the service takes now (0: not known yet, a slot's
 * largest payload then).
 */
#ifndef LYNX_FE_TCPFRAME_H
#define LYNX_FE_TCPFRAME_H

#include <stddef.h>
#include <stdint.h>

/* The largest frame the service takes: its message plus the length word. */
uint32_t fe_tcp_frame_max(uint32_t fixed, uint32_t cap);

/* The first frame of p[0, n), which comes from the network: > 0, its whole
 * length (length word and message; *len the message's); 0 when more bytes
 * are needed; -1 when it is longer than the service takes (the connection
 * is closed before the rest of it is buffered). */
long fe_tcp_frame_len(uint32_t fixed, uint32_t cap, const uint8_t *p, size_t n,
                      uint32_t *len);

/* How many bytes a connection's input buffer should hold for its next
 * read, in[0, in_len) being what it holds: 64 KiB more, or the rest of a
 * longer frame whose length word is in (a connection's buffer grows only
 * for the frames it sends), never more than a frame and 4 KiB. More than
 * in_len whenever in holds the start of a frame the service takes. */
uint32_t fe_tcp_frame_want(uint32_t fixed, uint32_t cap, const uint8_t *in,
                           uint32_t in_len);

#endif
