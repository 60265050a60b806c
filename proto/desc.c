/* desc.c - the region descriptor's transport names and its protobuf
 * conversion; see desc.h. */
#include "desc.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "lynx.pb-c.h"
#include "mqueue.h"

const char *const lynx_transport_names[LYNX_TRANSPORT_COUNT] = {
    [LYNX_TRANSPORT_SHM] = "shm",
    [LYNX_TRANSPORT_TCP] = "tcp",
    [LYNX_TRANSPORT_RDMA] = "rdma",
};

int lynx_transport_id(const char *name) {
  for (int i = 0; name && i < LYNX_TRANSPORT_COUNT; i++)
    if (strcmp(lynx_transport_names[i], name) == 0)
      return i;
  return -1;
}

void lynx_desc_to_pb(const struct lynx_region_desc *d, Lynx__RegionDesc *pb) {
  lynx__region_desc__init(pb);
  pb->accel_id = d->accel_id;
  pb->transport = (char *)d->transport;
  pb->locator = (char *)d->locator;
  pb->region_size = d->region_size;
  pb->epoch = d->epoch;
  pb->n_mqueues = d->n_mqueues;
  pb->slot_size = d->slot_size;
  pb->slots = d->slots;
  pb->large_bytes = d->large_bytes;
  pb->ordering = d->ordering == LYNX_ORDER_FENCED
                     ? LYNX__ORDERING__ORDERING_FENCED
                     : LYNX__ORDERING__ORDERING_COALESCED;
  pb->key = d->key;
  pb->remote_addr = d->remote_addr;
  if (lynx_transport_id(d->transport) == LYNX_TRANSPORT_RDMA) {
    pb->n_rkeys = LYNX_MR_COUNT;
    pb->rkeys = (uint32_t *)d->rkeys;
  }
}

int lynx_desc_from_pb(const Lynx__RegionDesc *pb, struct lynx_region_desc *d,
                      char *err, size_t errlen) {
  struct lynx_geom g;
  memset(d, 0, sizeof(*d));
  if (!pb->transport || strlen(pb->transport) >= sizeof(d->transport) ||
      !pb->locator || strlen(pb->locator) >= sizeof(d->locator)) {
    snprintf(err, errlen, "accel %u: transport or locator missing or too long",
             pb->accel_id);
    return -EINVAL;
  }
  if (lynx_geom_init(&g, pb->n_mqueues, pb->slots, pb->slot_size,
                     pb->large_bytes) ||
      g.region_size != pb->region_size) {
    snprintf(err, errlen,
             "accel %u: geometry %u x %u x %u B + %u B / %llu B is invalid",
             pb->accel_id, pb->n_mqueues, pb->slots, pb->slot_size,
             pb->large_bytes, (unsigned long long)pb->region_size);
    return -EINVAL;
  }
  if (pb->ordering != LYNX__ORDERING__ORDERING_COALESCED &&
      pb->ordering != LYNX__ORDERING__ORDERING_FENCED) {
    snprintf(err, errlen, "accel %u: unknown ordering %d", pb->accel_id,
             (int)pb->ordering);
    return -EINVAL;
  }
  d->accel_id = pb->accel_id;
  strcpy(d->transport, pb->transport);
  strcpy(d->locator, pb->locator);
  d->region_size = pb->region_size;
  d->epoch = pb->epoch;
  d->n_mqueues = pb->n_mqueues;
  d->slot_size = pb->slot_size;
  d->slots = pb->slots;
  d->large_bytes = pb->large_bytes;
  d->ordering = pb->ordering == LYNX__ORDERING__ORDERING_FENCED
                    ? LYNX_ORDER_FENCED
                    : LYNX_ORDER_COALESCED;
  if (lynx_transport_id(pb->transport) == LYNX_TRANSPORT_RDMA &&
      pb->n_rkeys != LYNX_MR_COUNT) {
    snprintf(err, errlen, "accel %u: rdma descriptor carries %zu rkeys, not %d",
             pb->accel_id, pb->n_rkeys, LYNX_MR_COUNT);
    return -EINVAL;
  }
  d->key = pb->key;
  d->remote_addr = pb->remote_addr;
  for (size_t i = 0; i < pb->n_rkeys && i < LYNX_MR_COUNT; i++)
    d->rkeys[i] = pb->rkeys[i];
  return 0;
}
