/*
 * transport_lookup.c - the table of backends: a descriptor's transport
 * name to its ops (lynx_transport_find).
 *
 * The one file that names every backend's table, above them all: the
 * backends call transport.c's helpers, and transport.c names no backend.
 */
#include <stddef.h>

#include "transport.h"

/* Indexed by enum lynx_transport_id (desc.h): a backend's name is the
 * descriptor's (lynx_transport_names). */
static const struct lynx_transport_ops *const backends[LYNX_TRANSPORT_COUNT] = {
    [LYNX_TRANSPORT_SHM] = &lynx_transport_shm,
    [LYNX_TRANSPORT_TCP] = &lynx_transport_tcp,
    [LYNX_TRANSPORT_RDMA] = &lynx_transport_rdma,
};

const struct lynx_transport_ops *lynx_transport_find(const char *name) {
  int id = lynx_transport_id(name);
  return id < 0 ? NULL : backends[id];
}
