/*
 * registry.h - the coordinator's registry: nodes, accelerators, services,
 * instances, frontends; leases, placement, drain, dispatch tables.
 *
 * Pure logic, no I/O (log lines aside: accelerators going out of and back
 * into dispatch are logged) and no clock of its own: every call that
 * depends on time takes `now_ms` (monotonic milliseconds), so tests drive
 * it with an injected clock. The daemon (coordinator/ctlport.c,
 * actions.c) owns the network; the registry tells it what to do through
 * the action callbacks in struct lynx_reg_ops and answers its questions
 * (tables, JSON). Not thread-safe: every caller holds lynx_coord.lock
 * (the loop thread, and the API's threads: coord.h).
 *
 * Versions: `version` grows by one on every observable change (watch
 * long-polls on it); `table_version` grows whenever the dispatch table
 * (the set of ready, dispatchable instances and their descriptors) changes.
 *
 * Errors: 0 or -errno; functions that validate operator input also fill a
 * struct lynx_reg_err with an API error code and a message naming the field.
 *
 * The entities (nodes with their accelerators, services, instances,
 * frontends) keep these invariants together; each file of the registry
 * says which it keeps (reg_internal.h lists the files):
 *
 * - Versions. The dispatch table is every dispatchable instance (READY,
 *   on a READY node that is not suspect, on an accelerator whose health
 *   lets it serve) with the frontend that produces into it; nothing
 *   stores it, lynx_reg_table_foreach derives it. A change of it is
 *   marked and committed before the public call that made it returns,
 *   once (a drain commits first the table without its node, whose number
 *   it waits for): table_version grows by exactly one, version with it,
 *   ops.tables_changed is called once, with the registry consistent.
 *   Instance ids and table_version start from the daemon's wall clock
 *   (main.c), so neither goes back across coordinator restarts, and an
 *   instance id is never reused.
 * - Epochs. A node is one incarnation per epoch (issued by the store:
 *   docs/etcd.md, "Epochs"). Every agent message names its epoch; another
 *   one is refused (-ESTALE); a newer registration replaces the node and
 *   forgets its instances (they died with the old agent); an epoch
 *   declared down never serves again (new_incarnation), because the
 *   frontends counted its requests in flight lost. Frontend epochs come
 *   from the store as well and only grow: an instance given to a frontend
 *   carries one newer than every earlier producer's (a new region that
 *   admitted nobody may take the one its frontend has), and its fe_fence
 *   never goes back.
 * - Leases. A node not heard for lynx_reg_suspect_ms is suspect: out of
 *   the table, its instances kept, nothing new placed on it. Not heard for
 *   lease_ms it is DOWN: its instances are forgotten (not stopped) and
 *   its requests in flight lost. Leases count only the time the
 *   coordinator ran (a pause is credited at the next tick).
 * - Intents. What an operator asked that outlives the coordinator is the
 *   services and the drained nodes (drain_intent, and drain_intents for
 *   nodes not registered), which the store saves; every other field is
 *   rebuilt from what agents (registration with adoption) and frontends
 *   (claims, reports) tell a new coordinator. A drain to leave and a
 *   frontend's drain are not intents. Each change of intent has a check
 *   that leaves r unchanged, for the API to save it before it applies it.
 * - Drains. A drain loses nothing: a draining node's instances, and a
 *   retiring one (a replica that moved), leave the table first and are
 *   stopped once every connected frontend runs a table without them and
 *   reports nothing outstanding on them (never while the coordinator
 *   settles), or at their drain deadline. (Placement stops what policy no
 *   longer wants, and a deleted service's instances, at once.)
 * - Partitioning. Placement decides where instances run, partitioning
 *   only who produces into them: every dispatchable instance has at most
 *   one producer, an active and connected frontend (fe_owner). One that
 *   is gone is replaced at the next round (lynx_reg_partition, every
 *   tick), the newer epoch fencing it; a move between two live frontends
 *   releases first (no loss). partition.c is
 *   handed the registry's state and calls none of the registry's
 *   functions; lynx_reg_partition commits what it decided.
 */
#ifndef LYNX_REGISTRY_H
#define LYNX_REGISTRY_H

#include "events.h"
#include <stddef.h>
#include <stdint.h>

#include "desc.h"
#include "wire.h"

enum lynx_node_state {
  LYNX_NODE_READY = 0,    /* registered, lease alive, in dispatch */
  LYNX_NODE_DRAINING = 1, /* out of dispatch, waiting for in-flight answers */
  LYNX_NODE_DRAINED = 2,  /* instances stopped; stays until undrained */
  LYNX_NODE_DOWN = 3,     /* lease expired or left; forgettable */
};

enum lynx_inst_state {
  LYNX_INST_STARTING = 0, /* asked the agent to start it */
  LYNX_INST_READY = 1,    /* agent reported its region: dispatchable */
  /* moved away (its replacement is ready): out of the tables, still
   * running until the frontends report nothing outstanding on it or the
   * drain timeout passes; then stopped. Any other instance the registry
   * stops is forgotten at once. */
  LYNX_INST_RETIRING = 2,
};

enum lynx_placement_kind { LYNX_PLACE_ALL = 0, LYNX_PLACE_REPLICAS = 1 };

struct lynx_accel_info { /* as an agent registers it */
  uint32_t idx;          /* index on its node */
  char kind[16];         /* "cpu", "cuda" */
  char model[LYNX_ID_MAX];
  uint64_t memory_bytes;
  uint32_t ordering; /* enum lynx_ordering it supports */
  /* cuda only ("" and 0 for cpu): where the GPU sits, whether a NIC can
   * write its memory directly, and cudaDevAttrGPUDirectRDMAWritesOrdering
   * (0 none, 100 owner, 200 all devices) */
  char pci_bus_id[LYNX_PCI_ID_MAX];
  int gpudirect_rdma;
  uint32_t rdma_writes_ordering;
  /* the applications it can run (AccelInfo.apps); none listed: an agent
   * that does not say, taken to run any */
  uint32_t n_apps;
  char apps[LYNX_APPS_MAX][LYNX_APP_NAME_MAX];
  /* the back end apps[k] calls by name ("" none), when the agent says
   * (AccelInfo.app_backends; has_app_backends 0: it does not) */
  int has_app_backends;
  char app_backends[LYNX_APPS_MAX][LYNX_BACKEND_NAME_MAX];
  /* cuda: the blocks an empty GPU keeps resident for the agent's kernels,
   * and those each instance takes (0: auto, at least one per 64 mqueues;
   * AccelInfo); resident_blocks 0: no such limit (cpu, an older agent) */
  uint32_t resident_blocks, instance_blocks;
};

/*
 * An accelerator's health as its agent reports it in every heartbeat. It is
 * dispatchable (lynx_reg_accel_dispatchable) when it is not lost, not failed
 * and none of its mqueues is stalled. A non-dispatchable accelerator keeps
 * its instances (a stalled application may recover: they return to dispatch
 * without a restart) but they leave the dispatch table, and placement puts
 * no new instance on it.
 */
/* Latency quantiles over the agent's recent window (AccelCounters). */
struct lynx_accel_latency {
  uint64_t window_requests;
  uint64_t queue_p50_ns, queue_p99_ns, service_p50_ns, service_p99_ns;
};

struct lynx_accel_report {
  uint32_t idx;                 /* accelerator index on its node */
  uint64_t requests, responses; /* counters */
  struct lynx_accel_latency lat;
  int device_lost; /* the device is gone (fell off the bus, reset) */
  int failed;      /* last_error is fatal: the device needs a reset */
  /* mqueues with a request pending whose RX consumer index has not moved
   * for the agent's stall period, and the longest such stall now */
  uint32_t stalled_mqueues;
  uint64_t stall_ms;
  char last_error[LYNX_ACCEL_ERR_MAX]; /* "" none; need not be terminated */
  uint32_t blocks_held; /* cuda: of resident_blocks, held by its kernels */
};

struct lynx_reg_accel {
  struct lynx_accel_info info;
  uint64_t requests, responses;  /* from heartbeats */
  struct lynx_accel_latency lat; /* from the last heartbeat */
  uint32_t blocks_held;          /* from the last heartbeat (cuda) */
  /* an instance failed to start here: placement skips this accelerator
   * until retry_at_ms (backoff doubling from 200 ms to 30 s) */
  uint64_t retry_at_ms;
  uint32_t failures;
  /* health from the last heartbeat (struct lynx_accel_report); kept when
   * the same agent registers again, cleared by a new epoch */
  int device_lost, failed;
  uint32_t stalled_mqueues;
  uint64_t stall_ms;
  char last_error[LYNX_ACCEL_ERR_MAX];
  uint64_t unhealthy_since_ms; /* meaningful while not dispatchable */
  /* times it went out of dispatch for its health (for the registry's
   * lifetime: a new epoch does not reset it, so /metrics can count it) */
  uint64_t health_outages;
};

/* A plug-in application whose process died (Heartbeat.app_faults). */
struct lynx_app_fault {
  char name[LYNX_APP_NAME_MAX];
  char last_death[160];
  uint64_t restarts, lost;
};

/* A plug-in application an agent refused to load (Register.refused_apps). */
struct lynx_app_refusal {
  char name[LYNX_APP_NAME_MAX];
  char reason[LYNX_APP_REFUSAL_MAX];
};

struct lynx_reg_node {
  char id[LYNX_ID_MAX];
  char address[LYNX_ID_MAX]; /* host:port of the agent's control link */
  uint64_t epoch;
  struct lynx_label labels[LYNX_LABELS_MAX];
  uint32_t n_labels;
  struct lynx_reg_accel accels[LYNX_ACCELS_MAX];
  uint32_t n_accels;
  /* the plug-ins its agent refused, as it last registered */
  struct lynx_app_refusal refused_apps[LYNX_REFUSED_APPS_MAX];
  uint32_t n_refused_apps;
  /* its plug-ins' processes that died, as its last heartbeat said */
  struct lynx_app_fault app_faults[LYNX_APP_FAULTS_MAX];
  uint32_t n_app_faults;
  enum lynx_node_state state;
  int drain_intent; /* operator asked to drain (survives restarts) */
  int leaving;      /* its agent is stopping: drains to leave (Leave.drain) */
  uint64_t last_heartbeat_ms;
  uint64_t lease_deadline_ms;
  uint64_t expired_ms; /* when its lease last expired (0: never) */
  /* Silent for suspect_ms (its heartbeat lease, which ends that much
   * before lease_deadline_ms): out of the dispatch tables until heard
   * again, its instances kept and its requests in flight not counted lost
   * (that waits for lease_deadline_ms) */
  int suspect;
  uint64_t drain_deadline_ms;
  uint64_t drain_table_version; /* table without this node */
  void *conn;                   /* the daemon's control connection, or NULL */
  struct lynx_reg_node *next;
};

/* A back end a service's application reaches through a client mqueue. */
struct lynx_backend_spec {
  char name[LYNX_BACKEND_NAME_MAX];
  char address[LYNX_ADDR_MAX]; /* host:port */
  char proto[16];              /* "memcached" or "len32" */
};

struct lynx_service_spec {
  char name[LYNX_ID_MAX];
  char proto[8]; /* "udp" or "tcp" */
  uint32_t port;
  uint32_t fixed_len; /* tcp framing: 0 = len32, N = fixed N-byte messages */
  char app[LYNX_ID_MAX];
  uint32_t slot_size, slots, mqueues_per_accel, work_us;
  /* the largest request or answer (bytes): beyond a slot's payload, each
   * ring gets a large area (lynx_large_for) */
  uint32_t msg_max;
  enum lynx_placement_kind placement;
  uint32_t replicas;                           /* LYNX_PLACE_REPLICAS */
  struct lynx_label selector[LYNX_LABELS_MAX]; /* every pair must match */
  uint32_t n_selector;
  /* client mqueues: instance mqueue mqueues_per_accel + k reaches
   * backends[k] */
  struct lynx_backend_spec backends[LYNX_BACKENDS_MAX];
  uint32_t n_backends;
  /* the app's configuration: a JSON object's compact text ("": none),
   * sent to the agents that start instances (StartInstance.app_config),
   * never in dispatch tables */
  char app_config[LYNX_APP_CONFIG_MAX];
};

struct lynx_reg_instance {
  uint64_t id; /* unique for the registry's lifetime */
  struct lynx_reg_service *svc;
  struct lynx_reg_node *node;
  uint32_t accel_idx;
  enum lynx_inst_state state;
  struct lynx_region_desc desc; /* valid when READY */
  /* A move (replicas follow capacity): the instance that takes this one's
   * place (0: none). This one serves until that one is ready, then
   * retires: the first table without it, and when it must be stopped at
   * the latest. */
  uint64_t replaced_by;
  uint64_t retire_table_version, retire_deadline_ms;
  /* The frontend that produces into this instance's region (partition.c;
   * "" none) and the epoch it produces with: issued by the store when the
   * instance was given to it, so newer than every earlier producer's, which
   * the agent then refuses. Releasing (fe_release_version != 0): moving to
   * another frontend; its owner runs tables without it from that version
   * on and answers what it holds, and the instance goes to the next owner
   * once the owner reports nothing outstanding on it, or at
   * fe_release_deadline_ms. */
  char fe_owner[LYNX_ID_MAX];
  uint64_t fe_epoch;
  uint64_t fe_release_version, fe_release_deadline_ms;
  /* the newest epoch this registry gave or adopted for the instance (kept
   * when its owner goes): what its region fences at, at least. A claim
   * older than it is stale (the claimant was fenced out since) */
  uint64_t fe_fence;
  /* started by this registry and never given to a frontend: its region
   * admitted no producer, so the epoch its first frontend has already
   * will do (no store round trip for a new instance). An instance adopted
   * from an agent may have had producers: never fresh. */
  int fe_fresh;
  struct lynx_reg_instance *next;
};

struct lynx_reg_service {
  struct lynx_service_spec spec;
  uint64_t created_ms;
  /* the latest failure of one of its instances to start (InstanceFailed),
   * cleared when one becomes ready: shown in its API state */
  char last_error[256];
  uint64_t last_error_ms, failures;
  struct lynx_reg_service *next;
};

/* One frontend's view of one mqueue it serves. */
struct lynx_fe_mq_report {
  uint64_t instance_id;
  uint32_t q;
  uint64_t outstanding, dispatched, responded;
  /* 1 + the enum lynx_transport_id it is reached by; 0: not said */
  int transport;
};

/* A frontend's listener for one service, as it last reported it. */
struct lynx_fe_listen {
  char service[LYNX_ID_MAX];
  int listening;
  char error[160]; /* why not, e.g. "cannot bind UDP 0.0.0.0:7000: ..." */
};

/* An instance a frontend says it produces into, and with which epoch
 * (Hello.produces). */
struct lynx_fe_claim {
  uint64_t instance_id, epoch;
};

struct lynx_reg_frontend {
  char id[LYNX_ID_MAX];
  char address[LYNX_ID_MAX];
  int connected;
  /* one of the active frontends, which the instances are partitioned
   * among (the daemon chooses them: lynx_reg_frontend_set_active) */
  int active;
  /* the operator drains it (lynx_reg_frontend_drain): it lets go of every
   * instance (each moves once it answered what it held on it) and is a
   * standby once it has none; kept while this coordinator runs */
  int drain_intent;
  /* what it produced into when it connected (owned; dropped once it got
   * a table: lynx_reg_frontend_claims_done) */
  struct lynx_fe_claim *claims;
  uint32_t n_claims;
  uint64_t table_version_applied; /* last table the frontend reported */
  uint64_t last_seen_ms;
  void *conn;
  /* per-mqueue counters as last reported (owned, replaced on each report) */
  struct lynx_fe_mq_report *mqs;
  uint32_t n_mqs;
  struct lynx_fe_listen *listen; /* owned, replaced on each report */
  uint32_t n_listen;
  struct lynx_reg_frontend *next;
};

/* What the registry asks the daemon to do. Each may be NULL in tests. */
struct lynx_reg_ops {
  /* Ask node's agent to start inst (service spec in inst->svc). */
  void (*start_instance)(void *data, struct lynx_reg_node *node,
                         struct lynx_reg_instance *inst);
  /* Ask node's agent to stop inst (the registry forgets it right after). */
  void (*stop_instance)(void *data, struct lynx_reg_node *node,
                        uint64_t instance_id);
  /* The dispatch table changed: push it to every frontend. */
  void (*tables_changed)(void *data);
  /* A new frontend epoch from the store (strictly increasing across
   * restarts): 0, or -errno (nothing is given to a frontend then; a later
   * tick tries again). NULL: the registry counts them itself. */
  int (*issue_epoch)(void *data, uint64_t *epoch);
  void *data;
};

struct lynx_reg_err {
  int status;    /* HTTP status: 400, 404, 409, ... */
  char code[32]; /* "invalid_argument", "not_found", "conflict", ... */
  char message[256];
  /* registration: refused because the epoch was declared down; the agent
   * must come back as a new incarnation (RegisterReply.new_incarnation) */
  int new_incarnation;
};

/* A drain the operator asked for on a node that has not registered (yet):
 * loaded from the state directory, applied (and dropped from the list) when
 * the node registers. */
struct lynx_reg_drain_intent {
  char id[LYNX_ID_MAX];
  struct lynx_reg_drain_intent *next;
};

struct lynx_registry {
  struct lynx_events ev; /* recent events, for operators (events.h) */
  uint64_t version;
  uint64_t table_version;
  /* A node silent for lease_ms is down: its requests in flight counted
   * lost, its next registration a new incarnation (its agent fenced itself
   * by then: docs/design.md, "Delivery guarantees"). One silent for
   * suspect_ms (at most lease_ms; 0: lease_ms) is suspect: out of the
   * dispatch tables until it is heard again. */
  uint64_t lease_ms, suspect_ms;
  uint64_t drain_timeout_ms;
  uint64_t next_instance_id;
  struct lynx_reg_node *nodes;
  struct lynx_reg_service *services;
  struct lynx_reg_instance *instances;
  struct lynx_reg_frontend *frontends;
  struct lynx_reg_ops ops;
  uint64_t now_ms;        /* the latest time a call brought */
  uint64_t next_retry_ms; /* earliest failed-start backoff to end (0: none) */
  /* counters for /metrics */
  uint64_t lease_expiries, table_pushes, registrations, refused_epochs;
  uint64_t suspicions; /* nodes that went suspect (silent) */
  /* replicas moved onto a node the placement prefers (started, and the
   * moved-away instances stopped once quiet) */
  uint64_t moves_started, moves_done;
  /* registrations of a declared-down epoch sent back as new incarnations */
  uint64_t new_incarnations;
  /* Ticks: lynx_reg_tick is expected every tick_ms (0: no pause detection).
   * A longer gap means the coordinator did not run (stopped, descheduled):
   * it heard no heartbeat then, so the time beyond one tick is added to
   * every lease instead of expiring them all at the first tick after. */
  uint64_t tick_ms, last_tick_ms;
  uint64_t pauses, paused_ms; /* gaps credited so far, and their sum */
  uint64_t last_pause_ms;     /* the gap the latest tick credited (0: none) */
  /* drain intents of unregistered nodes (lynx_reg_drain_intent_add); the
   * state file's "drained" is these plus every node with drain_intent */
  struct lynx_reg_drain_intent *drain_intents;
  /* internal: the dispatch table changed during the current call (pushed
   * once at its end), and r->version when placement last ran (tick skips
   * placement when nothing changed since) */
  int table_dirty;
  uint64_t placed_version;
  /* Until when the coordinator settles after a restart, or on becoming
   * the leader (0: settled; its loop sets and clears it): tables wait, and
   * the frontends that still hold instances may not have reconnected yet,
   * so no drain or retirement counts as quiet meanwhile (their deadlines
   * still hold). */
  uint64_t settle_until_ms;
  /* operator limits on lynx_reg_service_create (0: none): how many
   * services may exist (409 above), and the largest region one service may
   * ask of each accelerator (lynx_service_region_bytes; 422 above) */
  uint32_t services_max;
  uint64_t region_max_bytes;
  /* Epochs the coordinator issues from its store (store.h, store_etcd.h):
   * the last one issued, and the newest frontend epoch (the active
   * frontend's, unless a promotion is under way). */
  uint64_t epoch_last, frontend_epoch;
  /* partition.c: instances given to a frontend, and moved between two
   * active frontends (released by one, then given to another) */
  uint64_t fe_assigned, fe_moves;
  uint64_t fe_epoch_retry_ms; /* no epoch could be issued: not before */
};

void lynx_reg_init(struct lynx_registry *r, uint64_t lease_ms,
                   uint64_t drain_timeout_ms, const struct lynx_reg_ops *ops);
/* The heartbeat lease in force: suspect_ms, at most lease_ms. */
uint64_t lynx_reg_suspect_ms(const struct lynx_registry *r);
void lynx_reg_free(struct lynx_registry *r);

/* ---- agents ---------------------------------------------------------- */

/*
 * An agent registers (or re-registers after a restart or a coordinator
 * restart). -ESTALE when epoch is older than the one known for this node id
 * (an old incarnation), and when it is the epoch of a node declared down
 * (err->new_incarnation: frontends counted its requests in flight lost, so
 * that incarnation may not serve again; its agent discards its instances
 * and registers with a new epoch). -EINVAL on bad fields (err says which).
 * A newer epoch replaces the node: its old instances are forgotten (they
 * died with the old agent). A node whose operator asked to drain it stays
 * drained.
 * Placement runs: the node's accelerators get the instances policies want.
 */
int lynx_reg_register(struct lynx_registry *r, const char *id,
                      const char *address, uint64_t epoch,
                      const struct lynx_label *labels, uint32_t n_labels,
                      const struct lynx_accel_info *accels, uint32_t n_accels,
                      void *conn, uint64_t now_ms, struct lynx_reg_err *err);

/* An instance the agent reports running when it registers. */
struct lynx_reg_adopt {
  uint64_t instance_id;
  char service[LYNX_ID_MAX];
  uint32_t accel_idx;
  struct lynx_region_desc desc;
};

/* lynx_reg_register, then takes over the instances the agent still runs
 * (after a coordinator restart, or when a node that was declared down comes
 * back with the same epoch) instead of starting duplicates: each one whose
 * service exists with the same geometry becomes a READY instance with its
 * id; any other is stopped (ops.stop_instance). Placement then runs. */
int lynx_reg_register_adopt(struct lynx_registry *r, const char *id,
                            const char *address, uint64_t epoch,
                            const struct lynx_label *labels, uint32_t n_labels,
                            const struct lynx_accel_info *accels,
                            uint32_t n_accels,
                            const struct lynx_reg_adopt *adopt,
                            uint32_t n_adopt, void *conn, uint64_t now_ms,
                            struct lynx_reg_err *err);

/* Renews the lease and stores each accelerator's counters and health
 * (n reports, by accel index; an unknown index is ignored). An accelerator
 * whose dispatchability changes is logged, bumps version and, when it has
 * ready instances on a ready node, the dispatch table (pushed once at the
 * end); one that became dispatchable gets new instances from the next
 * tick's placement.
 * Counters and a changing stall_ms alone are not changes for watchers.
 * -ENOENT unknown node, -ESTALE wrong epoch, -ENOTCONN node is down
 * (it must register again). */
int lynx_reg_heartbeat(struct lynx_registry *r, const char *id, uint64_t epoch,
                       const struct lynx_accel_report *reports, uint32_t n,
                       uint64_t now_ms);

/* 1 when a's health lets it take requests: not lost, not failed, no
 * stalled mqueue. Says nothing of its node's state. */
int lynx_reg_accel_dispatchable(const struct lynx_reg_accel *a);

/* Why a is out of dispatch, for logs and tables: "ok" when it is not, else
 * e.g. "device lost", "failed: Xid 79", "1 mqueue stalled for 2300 ms",
 * joined with "; ". Always terminates buf (when len > 0); returns buf. */
const char *lynx_reg_accel_health_str(const struct lynx_reg_accel *a, char *buf,
                                      size_t len);

/* Explicit leave (agent shutdown): node down, its instances gone. */
int lynx_reg_leave(struct lynx_registry *r, const char *id, uint64_t epoch,
                   uint64_t now_ms);

/* The daemon's connection to the node closed (the lease still decides). */
void lynx_reg_node_disconnected(struct lynx_registry *r, void *conn);

/* The agent reports an instance running with its region (ready) or failed
 * to start (the instance is forgotten; placement retries on the next tick).
 * -ENOENT unknown instance, -ESTALE wrong epoch. */
int lynx_reg_instance_ready(struct lynx_registry *r, const char *node_id,
                            uint64_t epoch, uint64_t instance_id,
                            const struct lynx_region_desc *desc,
                            uint64_t now_ms);
int lynx_reg_instance_failed(struct lynx_registry *r, const char *node_id,
                             uint64_t epoch, uint64_t instance_id,
                             const char *why, uint64_t now_ms);

/* ---- operators ------------------------------------------------------- */

/* Validates and adds a service (persisting is the caller's): the two
 * steps below. -EINVAL (400, field named), -EFBIG (422 "limit_exceeded":
 * its region is larger than r->region_max_bytes; the message gives the
 * computed size), -EEXIST (409 duplicate name), -EADDRINUSE (409 port in
 * use), -ENOSPC (409 "limit_exceeded": r->services_max services exist),
 * -ENOMEM. Placement runs. */
int lynx_reg_service_create(struct lynx_registry *r,
                            const struct lynx_service_spec *spec,
                            uint64_t now_ms, struct lynx_reg_err *err);
/* Every check of lynx_reg_service_create, r unchanged: *out gets the
 * service to add, its spec normalised as it will be kept (for the API to
 * save it first: http.c), which lynx_reg_service_add takes and cannot
 * fail; the caller frees one it does not add. */
int lynx_reg_service_prepare(struct lynx_registry *r,
                             const struct lynx_service_spec *spec,
                             struct lynx_reg_service **out,
                             struct lynx_reg_err *err);
void lynx_reg_service_add(struct lynx_registry *r, struct lynx_reg_service *s,
                          uint64_t now_ms);
/* The checks lynx_reg_service_create makes on a spec alone (no conflicts):
 * 0, or -EINVAL with err (400, "invalid_argument", field named). Shared
 * with the JSON decoder. */
int lynx_service_spec_validate(const struct lynx_service_spec *spec,
                               struct lynx_reg_err *err);
/* The size of the region a service asks of each accelerator it runs on:
 * mqueues_per_accel server mqueues plus one client mqueue per back end,
 * laid out as include/lynx/mqueue.h says (lynx_geom_init). 0 when the geometry
 * is out of the ring format's bounds. */
uint64_t lynx_service_region_bytes(const struct lynx_service_spec *spec);
/* Stops its instances and forgets it. -ENOENT (404). */
int lynx_reg_service_delete(struct lynx_registry *r, const char *name,
                            uint64_t now_ms, struct lynx_reg_err *err);
struct lynx_reg_service *lynx_reg_service_find(struct lynx_registry *r,
                                               const char *name);

/* Drain: out of dispatch now; instances stopped once every frontend applied
 * a table without the node and reports no outstanding request on it, or at
 * the drain deadline; then DRAINED. -ENOENT, -EINVAL (node is down). */
int lynx_reg_drain(struct lynx_registry *r, const char *id, uint64_t now_ms,
                   struct lynx_reg_err *err);
/* Its agent is stopping and asks for its node to be drained first (Leave
 * with drain): a drain as above, kept in memory only (not an operator's
 * intent: the node's next incarnation is READY); the agent leaves once its
 * instances are stopped. A node already draining or drained stays so.
 * -ENOENT, -ESTALE (another epoch), -ENOTCONN (declared down). */
int lynx_reg_leave_drain(struct lynx_registry *r, const char *id,
                         uint64_t epoch, uint64_t now_ms);
/* Back to READY (instances placed again). -ENOENT, -EINVAL (down, or
 * draining to leave). */
int lynx_reg_undrain(struct lynx_registry *r, const char *id, uint64_t now_ms,
                     struct lynx_reg_err *err);
/* The checks of lynx_reg_drain, lynx_reg_undrain and lynx_reg_forget, r
 * unchanged (for the API to save the change before it applies it: once
 * one passes, its operation succeeds). *out gets the node, when found. */
int lynx_reg_drain_check(struct lynx_registry *r, const char *id,
                         struct lynx_reg_node **out, struct lynx_reg_err *err);
int lynx_reg_undrain_check(struct lynx_registry *r, const char *id,
                           struct lynx_reg_node **out,
                           struct lynx_reg_err *err);
int lynx_reg_forget_check(struct lynx_registry *r, const char *id,
                          struct lynx_reg_node **out, struct lynx_reg_err *err);
/* Remembers that the operator drained node id (lynx_store_load): a node of
 * that id not registered yet starts DRAINED when it registers; a known node
 * just gets drain_intent (it applies at its next registration). 0, -EINVAL
 * (bad id), -ENOMEM. */
int lynx_reg_drain_intent_add(struct lynx_registry *r, const char *id);
/* Forgets every service and every drain intent of a node not registered
 * (a coordinator that does not lead reloading what etcd holds: elect.c). */
void lynx_reg_intent_clear(struct lynx_registry *r, uint64_t now_ms);
/* Forgets every node that is not DOWN, with its instances: a coordinator
 * that stops leading (elect.c) cannot follow their leases (it would
 * declare them down on its own, and refuse their epochs as a new
 * incarnation should it lead again), and a leader takes only the nodes
 * that register with it, their instances adopted. DOWN nodes stay: their
 * epochs were declared down to frontends. Returns how many went. */
uint32_t lynx_reg_nodes_release(struct lynx_registry *r);
/* Forget a DOWN node. -ENOENT, -EBUSY (409: not down). */
int lynx_reg_forget(struct lynx_registry *r, const char *id,
                    struct lynx_reg_err *err);
/* The plug-ins node id's agent refused (n of them, as its Register said),
 * in place of what it said before; nothing when id is not registered. */
void lynx_reg_node_refused(struct lynx_registry *r, const char *id,
                           const struct lynx_app_refusal *ref, uint32_t n);
/* The deaths of plug-ins' processes node id's agent reported (n of them),
 * in place of the last report; nothing when id is not registered. */
void lynx_reg_node_app_faults(struct lynx_registry *r, const char *id,
                              const struct lynx_app_fault *f, uint32_t n);

struct lynx_reg_node *lynx_reg_node_find(struct lynx_registry *r,
                                         const char *id);

/* ---- frontends ------------------------------------------------------- */

struct lynx_reg_frontend *
lynx_reg_frontend_connect(struct lynx_registry *r, const char *id,
                          const char *address, void *conn, uint64_t now_ms);
void lynx_reg_frontend_disconnected(struct lynx_registry *r, void *conn);
/* A frontend reports the table version it runs and its per-mqueue counters
 * (copied). Drives drains forward: a draining node's instances are stopped
 * once every connected frontend runs a table without them and reports no
 * request outstanding on them. */
void lynx_reg_frontend_status(struct lynx_registry *r, const char *id,
                              uint64_t table_version,
                              const struct lynx_fe_mq_report *mqs, uint32_t n,
                              uint64_t now_ms);
/* A frontend says which instances it produced into (Hello.produces;
 * copied): the registry gives each such instance that has no producer back
 * to the frontend presenting the newest epoch for it. 0 or -ENOMEM. */
int lynx_reg_frontend_claims(struct lynx_registry *r, const char *id,
                             const struct lynx_fe_claim *c, uint32_t n);
/* It got a table: its claims have served their purpose. */
void lynx_reg_frontend_claims_done(struct lynx_registry *r, const char *id);
/* The operator drains a frontend (drain != 0) or undrains it: -ENOENT
 * (unknown id, err filled). Its instances move to the other active
 * frontends without loss (partition.c). */
int lynx_reg_frontend_drain(struct lynx_registry *r, const char *id, int drain,
                            struct lynx_reg_err *err);
/* Makes it one of the active frontends (or not). Call lynx_reg_partition
 * after changing them. */
void lynx_reg_frontend_set_active(struct lynx_registry *r, const char *id,
                                  int active);

/* ---- several active frontends (reg_frontend.c, partition.c) ---------- */

/*
 * Partitions the dispatchable instances of every service among the active
 * frontends, so that each instance's region (every mqueue in it) has
 * exactly one producer:
 *  - an instance whose frontend is no longer active or connected is given
 *    to another at once, with a new epoch that fences the old one;
 *  - claims (Hello.produces) give unowned instances back to the frontend
 *    with the newest epoch for them;
 *  - each service is balanced (counts differ by one at most): a frontend
 *    with too many releases some, which move once it answered what it
 *    holds on them (no loss on a move between live frontends); a draining
 *    frontend releases all of them, if another active frontend can take
 *    them;
 *  - unowned instances go to the active frontend with the fewest of that
 *    service: a new instance with the epoch that frontend has (its region
 *    admitted nobody yet), any other with one epoch issued for the round
 *    (ops.issue_epoch), newer than every earlier producer's.
 * Commits the table when anything changed (every frontend gets it).
 */
void lynx_reg_partition(struct lynx_registry *r, uint64_t now_ms);
/* Whether f gets inst in its table: it owns it and is not releasing it. */
int lynx_reg_fe_produces(const struct lynx_reg_frontend *f,
                         const struct lynx_reg_instance *inst);
/* Whether active frontend f serves svc: it owns one of its instances
 * (releasing too: it still answers on them), or no frontend owns any (the
 * port stays open: clients get no answer rather than a refusal). */
int lynx_reg_fe_serves(const struct lynx_registry *r,
                       const struct lynx_reg_frontend *f,
                       const struct lynx_reg_service *svc);
struct lynx_reg_frontend *lynx_reg_frontend_find(struct lynx_registry *r,
                                                 const char *id);

/* A frontend reports whether it listens on each service's port (copied;
 * a change bumps r->version, so watchers see services become ready or
 * not). */
void lynx_reg_frontend_listen(struct lynx_registry *r, const char *id,
                              const struct lynx_fe_listen *l, uint32_t n);

/* ---- time ------------------------------------------------------------ */

/* Expires leases (node DOWN, instances gone, tables pushed), finishes
 * drains whose deadline passed, re-runs placement. Call every ~100 ms. */
void lynx_reg_tick(struct lynx_registry *r, uint64_t now_ms);

/* ---- dispatch table -------------------------------------------------- */

/* Calls fn for every dispatchable instance (READY, node READY, its
 * accelerator dispatchable) of every service, in a stable order. The
 * daemon encodes the table from this. */
void lynx_reg_table_foreach(struct lynx_registry *r,
                            void (*fn)(void *arg,
                                       const struct lynx_reg_service *svc,
                                       const struct lynx_reg_instance *inst),
                            void *arg);

/* 1 when inst is in the dispatch table (see lynx_reg_table_foreach). */
int lynx_reg_inst_dispatchable(const struct lynx_reg_instance *inst);

const char *lynx_node_state_name(enum lynx_node_state s);

/* 1 when accelerator a can run application app (an agent that lists no
 * applications is taken to run any). */
int lynx_reg_accel_runs(const struct lynx_reg_accel *a, const char *app);

/* Whether a service is served, for operators: "ready" (every instance it
 * wants is ready and no frontend fails to listen on its port), "degraded"
 * (some are ready) or "pending" (none, or no frontend can listen), with the
 * reason in reason (len bytes; "" when ready) and the counts in *ready and
 * *wanted. wanted counts the accelerators placement may use: on ready
 * nodes matching the selector, running the app. */
const char *lynx_reg_service_state(const struct lynx_registry *r,
                                   const struct lynx_reg_service *s,
                                   uint64_t *ready, uint64_t *wanted,
                                   char *reason, size_t len);

/* 1 when node n carries every label pair of sp's selector. */
int lynx_reg_labels_match(const struct lynx_reg_node *n,
                          const struct lynx_service_spec *sp);

/* ---- text ------------------------------------------------------------ */

/* Text the API shows (names, labels, an agent's free text): 1 when the len
 * bytes at s are valid UTF-8 (shortest forms, no surrogates, at most
 * U+10FFFF) and hold no control character (C0, DEL, C1). */
int lynx_text_ok(const char *s, size_t len);

/* Copies the NUL-terminated src into dst (size bytes, always terminated;
 * dst may be src) made fit for lynx_text_ok: each byte that does not start
 * a valid UTF-8 sequence becomes '?', each control character a space, and
 * a character that does not fit whole is left out. Returns dst. */
char *lynx_text_clean(char *dst, size_t size, const char *src);

#endif
