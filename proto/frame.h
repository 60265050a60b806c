/*
 * frame.h - length-prefixed protobuf-c framing for control connections.
 *
 * A frame is a 4-byte big-endian length N followed by N bytes of an encoded
 * lynx.Envelope. The reader enforces a cap: a length above it is reported
 * before any of the body is buffered, so a peer cannot make us allocate
 * more than cap + 4 bytes. Decoding errors are reported, never asserted: the
 * caller closes that one connection with a logged reason.
 */
#ifndef LYNX_FRAME_H
#define LYNX_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "lynx.pb-c.h"

#define LYNX_PROTO_VERSION 1u
#define LYNX_FRAME_HDR 4u
#define LYNX_FRAME_MAX_DEFAULT (1u << 20)

/* Encodes env as one frame into a malloc'd buffer (*out, *len); the caller
 * frees it. 0 or -ENOMEM, -EMSGSIZE (encoded size above max). */
int lynx_frame_encode(const Lynx__Envelope *env, size_t max, uint8_t **out,
                      size_t *len);

struct lynx_frame_reader {
  uint8_t *buf;
  size_t len, cap;
  size_t max; /* largest accepted body */
};

void lynx_frame_reader_init(struct lynx_frame_reader *r, size_t max);
void lynx_frame_reader_free(struct lynx_frame_reader *r);

/* Appends n received bytes. 0 or -ENOMEM. */
int lynx_frame_feed(struct lynx_frame_reader *r, const void *data, size_t n);

/*
 * Takes the next complete frame out of the reader. Returns 1 and sets *env
 * (free it with lynx__envelope__free_unpacked(*env, NULL)), 0 when more bytes
 * are needed, -EMSGSIZE when the announced length is above the cap, -EBADMSG
 * when the body does not decode or carries no message. After an error the
 * reader's content is unspecified: close the connection.
 */
int lynx_frame_next(struct lynx_frame_reader *r, Lynx__Envelope **env);

/* Compares a presented credential with the token in a time that depends
 * on the token's length only, never on where they first differ, so a peer
 * cannot find the token byte by byte from response times (control Hellos,
 * the API's bearer token). 1 when equal. */
int lynx_token_equal(const char *given, const char *token);

/* Checks a peer's Hello: version, then token (both empty means none
 * configured; compared with lynx_token_equal). 0, or -EPROTO / -EACCES with
 * a reason written to err. */
int lynx_hello_check(const Lynx__Hello *h, const char *token, char *err,
                     size_t errlen);

#endif
