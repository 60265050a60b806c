/*
 * desc.h - the region descriptor: what a frontend needs to reach one
 * accelerator's mqueue region (mirrors lynx.RegionDesc), and its
 * conversion to and from the protobuf message.
 *
 * Here, in proto/, rather than with the transports: the coordinator stores
 * and forwards descriptors without reaching any region, so it needs this
 * header and not transport.h (nor rdma-core behind it). The transport names
 * a descriptor carries are the wire's strings; enum lynx_transport_id
 * numbers them for the tables indexed by transport (transport_lookup.c's
 * backends).
 */
#ifndef LYNX_DESC_H
#define LYNX_DESC_H

#include <stddef.h>
#include <stdint.h>

#define LYNX_LOCATOR_MAX 128
#define LYNX_IDENT_MAX 48 /* a host's or network namespace's identity */

/* The transports a descriptor may name; lynx_transport_names holds the
 * names on the wire (lynx.RegionDesc.transport). */
enum lynx_transport_id {
  LYNX_TRANSPORT_SHM = 0,
  LYNX_TRANSPORT_TCP = 1,
  LYNX_TRANSPORT_RDMA = 2,
  LYNX_TRANSPORT_COUNT = 3,
};
extern const char *const lynx_transport_names[LYNX_TRANSPORT_COUNT];

/* The id of the transport called name (exact, case-sensitive), or -1. */
int lynx_transport_id(const char *name);

/* The three access classes of a region (layout version 2): what a frontend
 * only reads (header + actrl, TX rings) and what it writes (fctrl + RX
 * rings; read too, when a takeover resumes the RX rings). An rdma
 * descriptor carries one rkey per class. */
enum lynx_mr {
  LYNX_MR_CTL = 0,   /* [0, fctrl_off): remote read */
  LYNX_MR_WRITE = 1, /* [fctrl_off, rings_off + Q*S*Z): remote write, read */
  LYNX_MR_TX = 2,    /* [rings_off + Q*S*Z, region_size): remote read */
  LYNX_MR_COUNT = 3,
};

/* What a frontend needs to reach one region (mirrors lynx.RegionDesc). */
struct lynx_region_desc {
  uint32_t accel_id;
  char transport[16];
  char locator[LYNX_LOCATOR_MAX];
  uint64_t region_size;
  uint64_t epoch;
  uint32_t n_mqueues, slot_size, slots;
  uint32_t large_bytes;          /* each ring's large-message area (0: none) */
  uint32_t ordering;             /* enum lynx_ordering */
  uint64_t key;                  /* tcp, rdma: the region's access key */
  uint64_t remote_addr;          /* rdma: region base in the agent */
  uint32_t rkeys[LYNX_MR_COUNT]; /* rdma: indexed by enum lynx_mr */
  /* the region through shm as well, for a frontend where the agent is
   * (lynx.RegionDesc.shm_locator, host_id, netns_id): the file ("" none)
   * and the agent's host and network namespace */
  char shm_locator[LYNX_LOCATOR_MAX];
  char host_id[LYNX_IDENT_MAX], netns_id[LYNX_IDENT_MAX];
  /* Frontend side only, not on the wire: the frontend epoch a connection
   * presents (DispatchTable.frontend_epoch; 0: none). The agent refuses it
   * when the region has admitted a newer one (docs/etcd.md "Fencing"). */
  uint64_t producer;
};

/* Descriptor <-> protobuf. to_pb points into d (no copies: keep d alive
 * while pb is used). from_pb validates; 0 or -EINVAL with a reason. */
struct Lynx__RegionDesc;
void lynx_desc_to_pb(const struct lynx_region_desc *d,
                     struct Lynx__RegionDesc *pb);
int lynx_desc_from_pb(const struct Lynx__RegionDesc *pb,
                      struct lynx_region_desc *d, char *err, size_t errlen);

/* This process's host and network namespace, as descriptors name an
 * agent's (lynx.RegionDesc.host_id, netns_id): 0, or -errno where /proc
 * does not say (then nothing is local). */
int lynx_local_identity(char host[LYNX_IDENT_MAX], char netns[LYNX_IDENT_MAX]);

/* Whether a frontend with identity host, netns may map the region d
 * describes through shm instead of d->transport: d offers a file, and both
 * identities are the agent's. */
int lynx_desc_local(const struct lynx_region_desc *d, const char *host,
                    const char *netns);

#endif
