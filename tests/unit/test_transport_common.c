/*
 * test_transport_common.c - unit tests of what transport/transport.c gives
 * every backend without being one (the bounds helper, region format and
 * header validation), and proto/desc.c's descriptor <-> protobuf
 * conversion and its test of a local agent (host and network namespace
 * identity). Regions here
 * are plain process memory; what the backends do with them is the
 * conformance suite's (transport_conformance.c).
 */
#include <errno.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "lynx.pb-c.h"
#include "mqueue.h"
#include "transport.h"
#include "ut_main.h"
#include "ut_region.h"

/* ---- fixture: one formatted region in process memory -------------------- */

struct fx {
  struct lynx_region r;
  struct lynx_geom g;
  struct lynx_region_desc d;
};

static int fx_setup(void **state) {
  struct fx *f = calloc(1, sizeof(*f));
  if (!f)
    return -1;
  *state = f;
  if (lynx_geom_init(&f->g, UT_Q, UT_S, UT_Z, 0) ||
      ut_region_mem(&f->r, f->g.region_size))
    return -1;
  snprintf(f->r.locator, sizeof(f->r.locator), "/lynx-ut-common");
  if (lynx_region_format(&f->r, UT_Q, UT_S, UT_Z, 0, LYNX_ORDER_COALESCED,
                         UT_EPOCH, UT_ACCEL))
    return -1;
  ut_desc_fill(&f->d, "shm", f->r.locator, &f->g, UT_ACCEL, UT_EPOCH,
               LYNX_ORDER_COALESCED);
  return 0;
}

static int fx_teardown(void **state) {
  struct fx *f = *state;
  if (f)
    free(f->r.base);
  free(f);
  *state = NULL;
  return 0;
}

/* ---- bounds helper ------------------------------------------------------- */

static void test_bounds_ok(void **state) {
  (void)state;
  assert_int_equal(lynx_bounds_ok(100, 0, 100), 0);
  assert_int_equal(lynx_bounds_ok(100, 100, 0), 0);
  assert_int_equal(lynx_bounds_ok(100, 99, 1), 0);
  assert_int_equal(lynx_bounds_ok(100, 99, 2), -EFAULT);
  assert_int_equal(lynx_bounds_ok(100, 101, 0), -EFAULT);
  assert_int_equal(lynx_bounds_ok(100, 0, 101), -EFAULT);
  /* no overflow */
  assert_int_equal(lynx_bounds_ok(100, UINT64_MAX, 2), -EFAULT);
  assert_int_equal(lynx_bounds_ok(100, 50, UINT64_MAX - 10), -EFAULT);
  assert_int_equal(lynx_bounds_ok(UINT64_MAX, 1, UINT64_MAX), -EFAULT);
  assert_int_equal(lynx_bounds_ok(UINT64_MAX, 1, UINT64_MAX - 1), 0);
}

/* ---- format and validation ----------------------------------------------- */

static void test_format_rejects(void **state) {
  struct fx *f = *state;
  struct lynx_region r2;
  char err[256];
  /* a region too small for the geometry */
  assert_int_equal(ut_region_mem(&r2, 4096), 0);
  assert_int_equal(lynx_region_format(&r2, 1, 2, 64, 0, 0, 1, 0), -EINVAL);
  assert_int_equal(((struct lynx_region_hdr *)r2.base)->magic, 0);
  free(r2.base);
  /* a geometry out of bounds */
  assert_int_equal(lynx_region_format(&f->r, 1, 3, 64, 0, 0, 1, 0), -EINVAL);
  assert_int_equal(lynx_region_format(&f->r, 0, 2, 64, 0, 0, 1, 0), -EINVAL);
  assert_int_equal(lynx_region_format(&f->r, 1, 2, 32, 0, 0, 1, 0), -EINVAL);
  /* the valid header was not touched: a frontend still accepts it */
  assert_true(((struct lynx_region_hdr *)f->r.base)->epoch == UT_EPOCH);
  assert_int_equal(
      lynx_region_validate(f->r.base, f->r.size, &f->d, err, sizeof(err)), 0);
}

static void test_region_validate(void **state) {
  struct fx *f = *state;
  char err[256];
  struct lynx_region_desc d = f->d;
  err[0] = 0;
  assert_int_equal(
      lynx_region_validate(f->r.base, f->r.size, &d, err, sizeof(err)), 0);
  assert_int_equal(lynx_region_validate(f->r.base, 63, &d, err, sizeof(err)),
                   -EPROTO);
  assert_true(strlen(err) > 0);
  err[0] = 0;
  /* mapped less than the geometry needs */
  assert_int_equal(
      lynx_region_validate(f->r.base, f->r.size - 1, &d, err, sizeof(err)),
      -EPROTO);
  assert_true(strlen(err) > 0);
  d.epoch = 1;
  assert_int_equal(
      lynx_region_validate(f->r.base, f->r.size, &d, err, sizeof(err)),
      -EPROTO);
  assert_non_null(strstr(err, "epoch"));
  d = f->d;
  d.slots = 3; /* invalid geometry in the descriptor */
  assert_int_equal(
      lynx_region_validate(f->r.base, f->r.size, &d, err, sizeof(err)),
      -EPROTO);
}

/* ---- descriptor <-> protobuf --------------------------------------------- */

static void test_desc_pb_roundtrip(void **state) {
  struct fx *f = *state;
  Lynx__RegionDesc pb;
  struct lynx_region_desc in = f->d, out;
  char err[256];
  in.ordering = LYNX_ORDER_FENCED;
  in.key = 0x1234;
  in.remote_addr = 0xFEDCBA9876543210ull;
  /* a tcp region that is a shared-memory file too (--transport auto) */
  snprintf(in.shm_locator, sizeof(in.shm_locator), "/lynx-n1-42-i7");
  snprintf(in.host_id, sizeof(in.host_id),
           "0b7c3a2e-1d4f-4e63-9d1a-6f1c2b3a4d5e");
  snprintf(in.netns_id, sizeof(in.netns_id), "4:4026531840");
  lynx_desc_to_pb(&in, &pb);
  assert_int_equal(pb.ordering, LYNX__ORDERING__ORDERING_FENCED);
  assert_int_equal(lynx_desc_from_pb(&pb, &out, err, sizeof(err)), 0);
  ut_assert_desc_equal(&in, &out);

  /* through the wire format too */
  {
    uint8_t buf[512];
    size_t n = lynx__region_desc__get_packed_size(&pb);
    Lynx__RegionDesc *back;
    assert_true(n <= sizeof(buf));
    lynx__region_desc__pack(&pb, buf);
    back = lynx__region_desc__unpack(NULL, n, buf);
    assert_non_null(back);
    memset(&out, 0, sizeof(out));
    assert_int_equal(lynx_desc_from_pb(back, &out, err, sizeof(err)), 0);
    lynx__region_desc__free_unpacked(back, NULL);
    ut_assert_desc_equal(&in, &out);
  }

  /* invalid descriptors are refused with a reason */
  lynx_desc_to_pb(&in, &pb);
  pb.region_size += 4096;
  err[0] = 0;
  assert_int_equal(lynx_desc_from_pb(&pb, &out, err, sizeof(err)), -EINVAL);
  assert_true(strlen(err) > 0);
  lynx_desc_to_pb(&in, &pb);
  pb.slots = 6;
  assert_int_equal(lynx_desc_from_pb(&pb, &out, err, sizeof(err)), -EINVAL);
  lynx_desc_to_pb(&in, &pb);
  pb.ordering = (Lynx__Ordering)7;
  assert_int_equal(lynx_desc_from_pb(&pb, &out, err, sizeof(err)), -EINVAL);
  lynx_desc_to_pb(&in, &pb);
  pb.transport = NULL;
  assert_int_equal(lynx_desc_from_pb(&pb, &out, err, sizeof(err)), -EINVAL);
  {
    char longloc[LYNX_LOCATOR_MAX + 1];
    memset(longloc, 'a', sizeof(longloc) - 1);
    longloc[0] = '/';
    longloc[LYNX_LOCATOR_MAX] = 0;
    lynx_desc_to_pb(&in, &pb);
    pb.locator = longloc;
    assert_int_equal(lynx_desc_from_pb(&pb, &out, err, sizeof(err)), -EINVAL);
    longloc[LYNX_LOCATOR_MAX - 1] = 0; /* 127 chars fit */
    assert_int_equal(lynx_desc_from_pb(&pb, &out, err, sizeof(err)), 0);
    assert_string_equal(out.locator, longloc);
  }
  /* an shm offer comes with the agent's identity and names one file */
  lynx_desc_to_pb(&in, &pb);
  pb.host_id = "";
  assert_int_equal(lynx_desc_from_pb(&pb, &out, err, sizeof(err)), -EINVAL);
  assert_non_null(strstr(err, "identity"));
  lynx_desc_to_pb(&in, &pb);
  pb.netns_id = NULL;
  assert_int_equal(lynx_desc_from_pb(&pb, &out, err, sizeof(err)), -EINVAL);
  lynx_desc_to_pb(&in, &pb);
  pb.shm_locator = "/dev/shm/x";
  assert_int_equal(lynx_desc_from_pb(&pb, &out, err, sizeof(err)), -EINVAL);
  lynx_desc_to_pb(&in, &pb);
  pb.shm_locator = ""; /* no offer: the identity is not needed */
  pb.host_id = pb.netns_id = "";
  assert_int_equal(lynx_desc_from_pb(&pb, &out, err, sizeof(err)), 0);
  assert_string_equal(out.shm_locator, "");
}

/* Where a frontend maps a region through shm: an offered file and both
 * identities its own; this process's identity is the kernel's boot id
 * and its network namespace, which another namespace does not share. */
static void test_desc_local(void **state) {
  struct lynx_region_desc d;
  char host[LYNX_IDENT_MAX], netns[LYNX_IDENT_MAX];
  (void)state;
  memset(&d, 0, sizeof(d));
  assert_int_equal(lynx_local_identity(host, netns), 0);
  assert_int_equal(strlen(host), 36); /* a UUID */
  assert_non_null(strchr(netns, ':'));
  snprintf(d.host_id, sizeof(d.host_id), "%s", host);
  snprintf(d.netns_id, sizeof(d.netns_id), "%s", netns);
  assert_false(lynx_desc_local(&d, host, netns)); /* no file offered */
  snprintf(d.shm_locator, sizeof(d.shm_locator), "/lynx-x");
  assert_true(lynx_desc_local(&d, host, netns));
  assert_false(lynx_desc_local(&d, host, "4:1"));
  assert_false(lynx_desc_local(&d, "another-host", netns));
  assert_false(lynx_desc_local(&d, "", "")); /* no identity: never local */
  /* a fresh network namespace (a child's: this process keeps its own)
   * is another identity on the same host */
  {
    char n2[LYNX_IDENT_MAX + 1] = "", h2[LYNX_IDENT_MAX], n2own[LYNX_IDENT_MAX];
    int p[2], st = 0;
    pid_t pid;
    ssize_t got;
    assert_int_equal(pipe(p), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      close(p[0]);
      if (unshare(CLONE_NEWNET) == 0 && lynx_local_identity(h2, n2own) == 0 &&
          strcmp(h2, host) == 0)
        (void)!write(p[1], n2own, strlen(n2own));
      _exit(0);
    }
    close(p[1]);
    got = read(p[0], n2, LYNX_IDENT_MAX);
    close(p[0]);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (got > 0) { /* (not root: no namespace of its own to compare) */
      n2[got] = '\0';
      assert_string_not_equal(n2, netns);
      assert_false(lynx_desc_local(&d, host, n2));
    }
  }
}

int main(int argc, char **argv) {
#define T(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bounds_ok),  T(test_format_rejects),
      T(test_region_validate),           T(test_desc_pb_roundtrip),
      cmocka_unit_test(test_desc_local),
  };
#undef T
  return LYNX_UT_MAIN(argc, argv, "transport_common", tests, NULL, NULL);
}
