/*
 * regjson.h - the registry as JSON (json-c), for the HTTP API, lynxctl and
 * the state directory.
 *
 * Encoders return a new json_object the caller owns (json_object_put);
 * every string in them is valid UTF-8 (one that is not is cleaned with
 * lynx_text_clean), so an answer is always valid JSON.
 * Field names and shapes are the API's (docs/api.md): a node has id, state,
 * address, epoch, labels (object), accelerators (array of accelerator
 * objects), last_heartbeat_ms (ms since the last heartbeat); an accelerator
 * has id ("node/idx"), node, kind, model, memory_bytes, ordering
 * ("coalesced"|"fenced"), pci_bus_id, gpudirect_rdma, rdma_writes_ordering,
 * state (its node's state), requests, responses and health {dispatchable,
 * device_lost, failed, last_error, stalled_mqueues, stall_ms,
 * unhealthy_for_ms, outages}; a mqueue has id ("service/node/accel/q"),
 * service, node, accel, instance, index, slots, slot_size, transport,
 * locator, dispatched, responded, outstanding (sums over frontends' reports
 * where known, else 0), dispatchable (in the dispatch table); a service has
 * every spec field plus placement as "all" or {"replicas": N, "selector":
 * {...}}, and instances (ready = in the dispatch table / wanted); a
 * frontend has id, address, connected, table_version, last_seen_ms.
 * Durations ("..._ms") are measured to now_ms.
 */
#ifndef LYNX_REGJSON_H
#define LYNX_REGJSON_H

#include <json-c/json.h>

#include "registry.h"

struct json_object *lynx_json_node(const struct lynx_registry *r,
                                   const struct lynx_reg_node *n,
                                   uint64_t now_ms);
struct json_object *lynx_json_accel(const struct lynx_reg_node *n,
                                    const struct lynx_reg_accel *a,
                                    uint64_t now_ms);
/* A service as the API shows it: its spec, its instances and its state
 * (lynx_reg_service_state). With unknown set (a follower that knows of no
 * leader: the runtime state is the leader's), its spec, "instances":
 * null, "state": "unknown" and unknown as the reason. */
struct json_object *lynx_json_service(const struct lynx_registry *r,
                                      const struct lynx_reg_service *s,
                                      const char *unknown);
/* The operator's intent alone, as the state directory keeps it (and as
 * lynx_json_service_spec reads it back). */
struct json_object *
lynx_json_service_spec_obj(const struct lynx_service_spec *sp);
struct json_object *lynx_json_frontend(const struct lynx_registry *r,
                                       const struct lynx_reg_frontend *f,
                                       uint64_t now_ms);

/* {"version": r->version, "items": [...]} for each collection. */
struct json_object *lynx_json_nodes(const struct lynx_registry *r,
                                    uint64_t now_ms);
struct json_object *lynx_json_accels(const struct lynx_registry *r,
                                     uint64_t now_ms);

/* Calls fn for every node (accels 0) or accelerator (accels 1) in id
 * order (accelerators: by node id, then index) with its JSON object, which
 * fn takes (NULL when out of memory); node and idx say whose it is. What
 * pages of the big lists are cut from (http.c). 0, or -ENOMEM (fn not
 * called). */
int lynx_json_each_by_id(const struct lynx_registry *r, uint64_t now_ms,
                         int accels,
                         void (*fn)(void *arg, const char *node, uint32_t idx,
                                    struct json_object *o),
                         void *arg);
struct json_object *lynx_json_mqueues(const struct lynx_registry *r);
struct json_object *lynx_json_services(const struct lynx_registry *r,
                                       const char *unknown);
struct json_object *lynx_json_frontends(const struct lynx_registry *r,
                                        uint64_t now_ms);

/*
 * Decodes a service spec (the POST /v1/services body, and one entry of the
 * state file). Applies defaults for absent optional fields (proto "udp",
 * slot_size 2048, slots 256, mqueues_per_accel 4, work_us 0, placement
 * "all"); wrong types, unknown fields, out-of-range values and strings
 * that are not valid UTF-8 or hold a control character (lynx_text_ok) give
 * -EINVAL with err->status 400, code "invalid_argument" and a message
 * naming the field. Range checks on geometry follow include/lynx/mqueue.h. Two
 * equal keys cannot be seen here (json-c keeps the last): the API refuses
 * them before (http.c, jsondup.h).
 */
int lynx_json_service_spec(struct json_object *j, struct lynx_service_spec *out,
                           struct lynx_reg_err *err);

/* The error body {"error": {"code": ..., "message": ...}} (new object). */
struct json_object *lynx_json_error(const char *code, const char *message);

#endif
