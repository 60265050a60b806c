/*
 * jsondup.h - finds a key that appears twice in one object of a JSON text.
 *
 * json-c, which parses the API's request bodies, keeps the last of two
 * equal keys without a word: {"replicas": 1, ..., "replicas": 8} would be
 * taken as 8. jansson's decoder can refuse them instead
 * (JSON_REJECT_DUPLICATES); this wraps it. jsondup.c is the only file that
 * includes jansson.h: jansson and json-c both export json_object_get and
 * json_object_iter_next (each library's own calls are kept apart by symbol
 * versions; keeping the headers apart keeps ours apart).
 */
#ifndef LYNX_JSONDUP_H
#define LYNX_JSONDUP_H

#include <stddef.h>

/*
 * Looks for an object with the same key twice in the len bytes at buf.
 * -EEXIST when there is one: key gets its name as written between the quotes
 * (escapes left as they are; cut to key_len - 1 bytes), *line and *column
 * where jansson stopped (1-based). -EILSEQ when a key holds a NUL
 * character ("\u0000"), *line and *column where: json-c cuts a key there,
 * so {"name": "a", "name\u0000": "b"} would be a key twice it cannot see.
 * 0 when there is none, and also when
 * jansson cannot read buf for another reason (invalid UTF-8, a control
 * character in a string): the caller's parser and decoder judge those,
 * naming what is wrong. -ENOMEM. (0 / -errno like every function here:
 * the duplicate is the error the caller reports.)
 */
int lynx_json_dup_key(const char *buf, size_t len, char *key, size_t key_len,
                      int *line, int *column);

#endif
