/*
 * beframe.h - cutting a back end's byte stream into replies (client
 * mqueues, docs/client-mqueues.md). Pure functions: unit-tested on their
 * own (tests/unit/test_beframe.c).
 */
#ifndef LYNX_FE_BEFRAME_H
#define LYNX_FE_BEFRAME_H

#include <stddef.h>
#include <stdint.h>

#define BE_REPLY_MAX (1u << 20) /* largest reply accepted, bytes */
/* Longest memcached reply line, CR LF included: a VALUE line holds a key
 * of at most 250 bytes and three numbers, so a longer line is no reply. */
#define BE_LINE_MAX 512u

enum fe_be_proto { FE_BE_MEMCACHED, FE_BE_LEN32 };

/* Length of the first complete reply in p[0..n): > 0 (len32: including
 * the length word), 0 when more bytes are needed, -1 when the bytes are not
 * a reply of the protocol (memcached: a one-line reply, or VALUE blocks
 * ending with END, no line longer than BE_LINE_MAX; len32: a 4-byte
 * big-endian length, then the bytes). p comes from the network: every
 * length in it is checked before it is used. */
long fe_be_reply_len(enum fe_be_proto proto, const uint8_t *p, size_t n);

#endif
