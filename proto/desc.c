/* desc.c - the region descriptor's transport names and its protobuf
 * conversion; see desc.h. */
#include "desc.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

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
  pb->shm_locator = (char *)d->shm_locator;
  pb->host_id = (char *)d->host_id;
  pb->netns_id = (char *)d->netns_id;
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
  if (pb->shm_locator && pb->shm_locator[0]) {
    /* all three, each fitting, or the descriptor is refused */
    if (strlen(pb->shm_locator) >= sizeof(d->shm_locator) ||
        pb->shm_locator[0] != '/' || strchr(pb->shm_locator + 1, '/') ||
        !pb->host_id || !pb->host_id[0] ||
        strlen(pb->host_id) >= sizeof(d->host_id) || !pb->netns_id ||
        !pb->netns_id[0] || strlen(pb->netns_id) >= sizeof(d->netns_id)) {
      snprintf(err, errlen,
               "accel %u: shm locator '%.64s' without a valid host and "
               "network namespace identity",
               pb->accel_id, pb->shm_locator);
      return -EINVAL;
    }
    strcpy(d->shm_locator, pb->shm_locator);
    strcpy(d->host_id, pb->host_id);
    strcpy(d->netns_id, pb->netns_id);
  }
  d->key = pb->key;
  d->remote_addr = pb->remote_addr;
  for (size_t i = 0; i < pb->n_rkeys && i < LYNX_MR_COUNT; i++)
    d->rkeys[i] = pb->rkeys[i];
  return 0;
}

int lynx_local_identity(char host[LYNX_IDENT_MAX], char netns[LYNX_IDENT_MAX]) {
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  struct stat st;
  size_t n;
  host[0] = netns[0] = '\0';
  if (!f)
    return -errno;
  n = fread(host, 1, LYNX_IDENT_MAX - 1, f);
  fclose(f);
  while (n && (host[n - 1] == '\n' || host[n - 1] == ' '))
    n--;
  host[n] = '\0';
  if (!n)
    return -ENOENT;
  if (stat("/proc/self/ns/net", &st) != 0) {
    int e = -errno;
    host[0] = '\0';
    return e;
  }
  snprintf(netns, LYNX_IDENT_MAX, "%llu:%llu", (unsigned long long)st.st_dev,
           (unsigned long long)st.st_ino);
  return 0;
}

int lynx_desc_local(const struct lynx_region_desc *d, const char *host,
                    const char *netns) {
  return d->shm_locator[0] && host && host[0] && netns && netns[0] &&
         strcmp(d->host_id, host) == 0 && strcmp(d->netns_id, netns) == 0;
}
