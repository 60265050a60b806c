/* test_tagtab.c - unit tests of frontend/tagtab.c. */
#include <arpa/inet.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tagtab.h"
#include "ut_main.h"

static struct sockaddr_in v4(uint32_t host, uint16_t port) {
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(host);
  a.sin_port = htons(port);
  return a;
}

static int tt_teardown(void **state) {
  struct lynx_tagtab *t = *state;
  if (t) {
    lynx_tagtab_free(t);
    free(t);
  }
  *state = NULL;
  return 0;
}

static struct lynx_tagtab *tt_new(void **state, uint32_t min, uint32_t gen0) {
  struct lynx_tagtab *t = calloc(1, sizeof(*t));
  assert_non_null(t);
  *state = t;
  assert_int_equal(lynx_tagtab_init(t, min, gen0), 0);
  return t;
}

static void test_init_sizes(void **state) {
  struct lynx_tagtab t;
  (void)state;
  assert_int_equal(lynx_tagtab_init(&t, 0, 1), 0);
  assert_int_equal(t.size, 16);
  assert_int_equal(t.n_free, 16);
  assert_int_equal(t.in_use, 0);
  lynx_tagtab_free(&t);
  assert_int_equal(lynx_tagtab_init(&t, 100, 1), 0);
  assert_int_equal(t.size, 128);
  assert_int_equal(t.bits, 7);
  lynx_tagtab_free(&t);
  assert_int_equal(lynx_tagtab_init(&t, 128, 1), 0);
  assert_int_equal(t.size, 128);
  lynx_tagtab_free(&t);
  assert_int_equal(lynx_tagtab_init(&t, (1u << 20) + 1, 1), -EINVAL);
  assert_null(t.e);
  lynx_tagtab_free(&t); /* harmless on a failed init */
}

/* The process's resident memory, in KiB (/proc/self/statm). */
static long rss_kib(void) {
  long size = 0, res = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f) {
    if (fscanf(f, "%ld %ld", &size, &res) != 2)
      res = 0;
    fclose(f);
  }
  return res * (sysconf(_SC_PAGESIZE) / 1024);
}

/* A worker's table (65,536 entries, 4.7 MB) costs memory only for the
 * entries a service uses at a time (issue 38: an idle service's memory):
 * entries are first handed out in order 0, 1, 2, ..., a released one
 * before any never used, and nothing of the rest is written. */
static void test_lazy_entries(void **state) {
  struct lynx_tagtab t;
  struct sockaddr_in a = {.sin_family = AF_INET};
  struct lynx_tag_entry *e[3];
  uint32_t tag[3], again;
  long before;
  (void)state;
  before = rss_kib();
  assert_int_equal(lynx_tagtab_init(&t, 65536, 7), 0);
  for (int i = 0; i < 3; i++) {
    e[i] = lynx_tag_alloc(&t, 0, (const struct sockaddr *)&a, 1, &tag[i]);
    assert_non_null(e[i]);
    assert_int_equal(tag[i] & (t.size - 1), (uint32_t)i);
    assert_int_equal(tag[i] >> t.bits, 8); /* gen0 + 1 */
  }
  assert_int_equal(t.fresh, 3);
  assert_int_equal(t.n_free, 65536 - 3);
  lynx_tag_release(&t, e[1]);
  assert_non_null(
      lynx_tag_alloc(&t, 0, (const struct sockaddr *)&a, 1, &again));
  assert_int_equal(again & (t.size - 1), 1); /* the released one */
  assert_int_equal(again >> t.bits, 9);      /* in its next generation */
  assert_int_equal(t.fresh, 3);
  assert_null(lynx_tag_lookup(&t, (7u << t.bits) | 100u, 0)); /* never used */
  /* every entry but 4 of 65,536 untouched: far less than the table */
#if !defined(__SANITIZE_ADDRESS__)
  assert_true(rss_kib() - before < 1024);
#else
  (void)before; /* ASan's allocator writes its own shadow */
#endif
  lynx_tagtab_free(&t);
}

static void test_alloc_lookup_release(void **state) {
  struct lynx_tagtab *t = tt_new(state, 16, 0x1234);
  struct sockaddr_in a = v4(0x0A000001, 5000);
  struct sockaddr_in6 b;
  struct lynx_tag_entry *e1, *e2;
  uint32_t tag1 = 0, tag2 = 0;

  memset(&b, 0, sizeof(b));
  b.sin6_family = AF_INET6;
  b.sin6_port = htons(6000);
  inet_pton(AF_INET6, "2001:db8::42", &b.sin6_addr);
  b.sin6_scope_id = 3;

  e1 = lynx_tag_alloc(t, 3, (struct sockaddr *)&a, 1000, &tag1);
  assert_non_null(e1);
  e2 = lynx_tag_alloc(t, 4, (struct sockaddr *)&b, 2000, &tag2);
  assert_non_null(e2);
  assert_true(e1 != e2);
  assert_true(tag1 != tag2);
  assert_int_equal(e1->tag, tag1);
  assert_int_equal(e1->mq, 3);
  assert_int_equal(e1->t_ns, 1000);
  assert_int_equal(e1->in_use, 1);
  assert_int_equal(t->in_use, 2);
  assert_int_equal(t->n_free, 14);
  /* the tag's low bits name its entry */
  assert_ptr_equal(&t->e[tag1 & (t->size - 1)], e1);

  assert_ptr_equal(lynx_tag_lookup(t, tag1, 3), e1);
  assert_ptr_equal(lynx_tag_lookup(t, tag2, 4), e2);
  assert_int_equal(e1->peer.v4.sin_family, AF_INET);
  assert_memory_equal(&e1->peer.v4, &a, sizeof(a));
  assert_int_equal(e2->peer.sa.sa_family, AF_INET6);
  assert_memory_equal(&e2->peer.v6, &b, sizeof(b));

  lynx_tag_release(t, e1);
  assert_int_equal(t->in_use, 1);
  assert_null(lynx_tag_lookup(t, tag1, 3));
  assert_ptr_equal(lynx_tag_lookup(t, tag2, 4), e2);
  /* releasing twice does not free the entry twice */
  lynx_tag_release(t, e1);
  assert_int_equal(t->in_use, 1);
  assert_int_equal(t->n_free, 15);
  /* a tag never issued */
  assert_null(lynx_tag_lookup(t, tag2 ^ (1u << 20), 4));
  assert_null(lynx_tag_lookup(t, 0, 4));
}

static void test_stale_after_reuse(void **state) {
  struct lynx_tagtab *t = tt_new(state, 16, 7);
  struct sockaddr_in a = v4(0x7F000001, 1), b = v4(0x7F000002, 2);
  struct lynx_tag_entry *e1, *e2;
  uint32_t old = 0, now = 0;

  e1 = lynx_tag_alloc(t, 0, (struct sockaddr *)&a, 1, &old);
  assert_non_null(e1);
  lynx_tag_release(t, e1);
  /* the same entry comes back first (LIFO), with another generation */
  e2 = lynx_tag_alloc(t, 0, (struct sockaddr *)&b, 2, &now);
  assert_ptr_equal(e2, e1);
  assert_true(now != old);
  assert_int_equal(now & (t->size - 1), old & (t->size - 1));
  assert_null(lynx_tag_lookup(t, old, 0));
  assert_ptr_equal(lynx_tag_lookup(t, now, 0), e2);
  assert_memory_equal(&e2->peer.v4, &b, sizeof(b));

  /* many reuses of one entry: every tag is different and only the latest
   * one is ever found */
  {
    uint32_t seen[200];
    for (int i = 0; i < 200; i++) {
      lynx_tag_release(t, e2);
      e2 = lynx_tag_alloc(t, 0, (struct sockaddr *)&b, 3, &seen[i]);
      assert_ptr_equal(e2, e1);
      assert_null(lynx_tag_lookup(t, old, 0));
      assert_null(lynx_tag_lookup(t, now, 0));
      for (int j = 0; j < i; j++) {
        assert_true(seen[j] != seen[i]);
        assert_null(lynx_tag_lookup(t, seen[j], 0));
      }
      assert_ptr_equal(lynx_tag_lookup(t, seen[i], 0), e2);
    }
  }
}

static void test_generation_wrap(void **state) {
  /* gen0 at the very top: the first generation wraps past 0 */
  struct lynx_tagtab *t = tt_new(state, 16, 0xFFFFFFFFu);
  struct sockaddr_in a = v4(1, 1);
  struct lynx_tag_entry *e;
  uint32_t tag = 0, tag2 = 0;
  e = lynx_tag_alloc(t, 0, (struct sockaddr *)&a, 0, &tag);
  assert_non_null(e);
  assert_true((tag >> t->bits) != 0);
  assert_ptr_equal(lynx_tag_lookup(t, tag, 0), e);
  lynx_tag_release(t, e);
  e = lynx_tag_alloc(t, 0, (struct sockaddr *)&a, 0, &tag2);
  assert_true(tag2 != tag);
  assert_null(lynx_tag_lookup(t, tag, 0));
  assert_ptr_equal(lynx_tag_lookup(t, tag2, 0), e);
}

static void test_wrong_mqueue(void **state) {
  struct lynx_tagtab *t = tt_new(state, 16, 99);
  struct sockaddr_in a = v4(1, 1);
  uint32_t tag = 0;
  struct lynx_tag_entry *e =
      lynx_tag_alloc(t, 5, (struct sockaddr *)&a, 0, &tag);
  assert_non_null(e);
  assert_null(lynx_tag_lookup(t, tag, 4));
  assert_null(lynx_tag_lookup(t, tag, 6));
  assert_null(lynx_tag_lookup(t, tag, 0));
  assert_ptr_equal(lynx_tag_lookup(t, tag, 5), e);
}

static void test_table_full(void **state) {
  struct lynx_tagtab *t = tt_new(state, 20, 1); /* 32 entries */
  struct sockaddr_in a = v4(1, 1);
  struct lynx_tag_entry *es[32];
  uint32_t tags[32], tag = 0xFEEDu;
  assert_int_equal(t->size, 32);
  for (int i = 0; i < 32; i++) {
    es[i] = lynx_tag_alloc(t, (uint32_t)i % 3, (struct sockaddr *)&a,
                           (uint64_t)i, &tags[i]);
    assert_non_null(es[i]);
    for (int j = 0; j < i; j++)
      assert_true(tags[j] != tags[i]);
  }
  assert_int_equal(t->in_use, 32);
  assert_null(lynx_tag_alloc(t, 0, (struct sockaddr *)&a, 0, &tag));
  assert_int_equal(tag, 0xFEEDu); /* untouched */
  assert_int_equal(t->in_use, 32);
  for (int i = 0; i < 32; i++)
    assert_ptr_equal(lynx_tag_lookup(t, tags[i], (uint32_t)i % 3), es[i]);
  lynx_tag_release(t, es[17]);
  assert_ptr_equal(lynx_tag_alloc(t, 1, (struct sockaddr *)&a, 0, &tag),
                   es[17]);
  assert_null(lynx_tag_alloc(t, 0, (struct sockaddr *)&a, 0, &tag));
}

struct expired {
  int n;
  uint32_t tags[64];
  int in_use_seen;
};

static void on_expire(void *arg, const struct lynx_tag_entry *e) {
  struct expired *x = arg;
  if (x->n < 64)
    x->tags[x->n] = e->tag;
  x->n++;
  x->in_use_seen += e->in_use == 1;
}

static int was_expired(const struct expired *x, uint32_t tag) {
  for (int i = 0; i < x->n && i < 64; i++)
    if (x->tags[i] == tag)
      return 1;
  return 0;
}

static void test_expire_old_only(void **state) {
  struct lynx_tagtab *t = tt_new(state, 16, 5);
  struct sockaddr_in a = v4(1, 1);
  struct lynx_tag_entry *es[8];
  uint32_t tags[8];
  struct expired x;
  memset(&x, 0, sizeof(x));
  /* dispatch times 100, 200, ... 800 */
  for (int i = 0; i < 8; i++) {
    es[i] =
        lynx_tag_alloc(t, 1, (struct sockaddr *)&a, 100u * (i + 1), &tags[i]);
    assert_non_null(es[i]);
  }
  /* dispatched before 450: the first four */
  assert_int_equal(lynx_tag_expire(t, 450, t->size, on_expire, &x), 4);
  assert_int_equal(x.n, 4);
  assert_int_equal(x.in_use_seen, 4); /* callback sees the live entry */
  assert_int_equal(t->in_use, 4);
  for (int i = 0; i < 8; i++) {
    if (i < 4) {
      assert_true(was_expired(&x, tags[i]));
      assert_null(lynx_tag_lookup(t, tags[i], 1));
    } else {
      assert_false(was_expired(&x, tags[i]));
      assert_ptr_equal(lynx_tag_lookup(t, tags[i], 1), es[i]);
    }
  }
  /* an entry dispatched exactly at the deadline is not expired */
  memset(&x, 0, sizeof(x));
  assert_int_equal(lynx_tag_expire(t, 500, t->size, on_expire, &x), 0);
  assert_int_equal(x.n, 0);
  /* no callback is fine too */
  assert_int_equal(lynx_tag_expire(t, 701, t->size, NULL, NULL), 3);
  assert_ptr_equal(lynx_tag_lookup(t, tags[7], 1), es[7]);
  assert_int_equal(t->in_use, 1);
}

/* Bounded work: max limits the entries scanned, and the next scan carries on
 * where the last one stopped. */
static void test_expire_bounded_scan(void **state) {
  struct lynx_tagtab *t = tt_new(state, 16, 5);
  struct sockaddr_in a = v4(1, 1);
  uint32_t tag, total = 0;
  struct expired x;
  for (int i = 0; i < 16; i++)
    assert_non_null(lynx_tag_alloc(t, 0, (struct sockaddr *)&a, 1, &tag));
  memset(&x, 0, sizeof(x));
  assert_int_equal(lynx_tag_expire(t, 10, 5, on_expire, &x), 5);
  assert_int_equal(t->in_use, 11);
  total = 5;
  while (t->in_use) {
    uint32_t n = lynx_tag_expire(t, 10, 5, on_expire, &x);
    assert_true(n <= 5);
    assert_true(n > 0);
    total += n;
  }
  assert_int_equal(total, 16);
  assert_int_equal(x.n, 16);
  /* every entry was reported exactly once */
  for (int i = 0; i < 16; i++)
    for (int j = i + 1; j < 16; j++)
      assert_true(x.tags[i] != x.tags[j]);
  assert_int_equal(lynx_tag_expire(t, 10, 5, on_expire, &x), 0);
}

static void test_release_mq(void **state) {
  struct lynx_tagtab *t = tt_new(state, 16, 11);
  struct sockaddr_in a = v4(1, 1);
  const uint32_t mqs[10] = {1, 2, 1, 3, 1, 2, 7, 1, 3, 2};
  struct lynx_tag_entry *es[10];
  uint32_t tags[10];
  for (int i = 0; i < 10; i++) {
    es[i] = lynx_tag_alloc(t, mqs[i], (struct sockaddr *)&a, 0, &tags[i]);
    assert_non_null(es[i]);
  }
  assert_int_equal(lynx_tag_release_mq(t, 1, NULL, NULL), 4);
  assert_int_equal(t->in_use, 6);
  for (int i = 0; i < 10; i++) {
    if (mqs[i] == 1)
      assert_null(lynx_tag_lookup(t, tags[i], 1));
    else
      assert_ptr_equal(lynx_tag_lookup(t, tags[i], mqs[i]), es[i]);
  }
  assert_int_equal(lynx_tag_release_mq(t, 1, NULL, NULL), 0);
  assert_int_equal(lynx_tag_release_mq(t, 9, NULL, NULL), 0);
  assert_int_equal(lynx_tag_release_mq(t, 7, NULL, NULL), 1);
  assert_int_equal(t->in_use, 5);
  assert_int_equal(t->n_free, 11);
}

struct seen_mq {
  uint32_t n, mq, bad;
};
static void on_release(void *arg, const struct lynx_tag_entry *e) {
  struct seen_mq *s = arg;
  s->n++;
  if (e->mq != s->mq || !e->in_use)
    s->bad++;
}

/* release_mq tells the caller about every entry it frees, while the entry
 * is still intact (the frontend returns the flow's count from it) */
static void test_release_mq_callback(void **state) {
  struct lynx_tagtab *t = tt_new(state, 16, 3);
  struct sockaddr_in a = v4(1, 1);
  struct seen_mq s = {0, 2, 0};
  uint32_t tag;
  for (int i = 0; i < 9; i++)
    assert_non_null(
        lynx_tag_alloc(t, (uint32_t)(i % 3), (struct sockaddr *)&a, 0, &tag));
  assert_int_equal(lynx_tag_release_mq(t, 2, on_release, &s), 3);
  assert_int_equal(s.n, 3);
  assert_int_equal(s.bad, 0);
  assert_int_equal(t->in_use, 6);
}

/* Two workers' tables used in lock step never hand out the same tag. */
static void test_gen0_distinct_tables(void **state) {
  struct lynx_tagtab *tabs = calloc(2, sizeof(*tabs));
  struct sockaddr_in a = v4(1, 1);
  enum { STEPS = 300, K = 4 };
  static uint32_t ta[STEPS * K], tb[STEPS * K];
  assert_non_null(tabs);
  *state = tabs; /* pair_teardown frees both on every path */
  assert_int_equal(lynx_tagtab_init(&tabs[0], 16, 0x1000), 0);
  assert_int_equal(lynx_tagtab_init(&tabs[1], 16, 0x9E3779B9u), 0);
  for (int s = 0; s < STEPS; s++) {
    struct lynx_tag_entry *ea[K], *eb[K];
    for (int k = 0; k < K; k++) {
      ea[k] =
          lynx_tag_alloc(&tabs[0], 0, (struct sockaddr *)&a, 0, &ta[s * K + k]);
      eb[k] =
          lynx_tag_alloc(&tabs[1], 0, (struct sockaddr *)&a, 0, &tb[s * K + k]);
      assert_non_null(ea[k]);
      assert_non_null(eb[k]);
      assert_true(ta[s * K + k] != tb[s * K + k]);
      /* a response carrying the other table's tag is stale here */
      assert_null(lynx_tag_lookup(&tabs[0], tb[s * K + k], 0));
      assert_null(lynx_tag_lookup(&tabs[1], ta[s * K + k], 0));
    }
    for (int k = 0; k < K; k++) {
      lynx_tag_release(&tabs[0], ea[k]);
      lynx_tag_release(&tabs[1], eb[k]);
    }
  }
  /* and none of the tags of one table was ever issued by the other */
  for (int i = 0; i < STEPS * K; i++)
    for (int j = 0; j < STEPS * K; j++)
      if (ta[i] == tb[j])
        fail_msg("tag 0x%08x issued by both tables", ta[i]);
}

static int pair_teardown(void **state) {
  struct lynx_tagtab *tabs = *state;
  if (tabs) {
    lynx_tagtab_free(&tabs[0]);
    lynx_tagtab_free(&tabs[1]);
    free(tabs);
  }
  *state = NULL;
  return 0;
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_init_sizes),
      cmocka_unit_test(test_lazy_entries),
      cmocka_unit_test_teardown(test_alloc_lookup_release, tt_teardown),
      cmocka_unit_test_teardown(test_stale_after_reuse, tt_teardown),
      cmocka_unit_test_teardown(test_generation_wrap, tt_teardown),
      cmocka_unit_test_teardown(test_wrong_mqueue, tt_teardown),
      cmocka_unit_test_teardown(test_table_full, tt_teardown),
      cmocka_unit_test_teardown(test_expire_old_only, tt_teardown),
      cmocka_unit_test_teardown(test_expire_bounded_scan, tt_teardown),
      cmocka_unit_test_teardown(test_release_mq, tt_teardown),
      cmocka_unit_test_teardown(test_release_mq_callback, tt_teardown),
      cmocka_unit_test_teardown(test_gen0_distinct_tables, pair_teardown),
  };
  return LYNX_UT_MAIN(argc, argv, "tagtab", tests, NULL, NULL);
}
