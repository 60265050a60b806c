#!/usr/bin/env bash
# shellcheck disable=SC2317 # the fault functions are called through window()
# faults/coordinator: the faults of the coordinator, each under sockperf
# load, judged by the fault suite's counts (lib.sh; docs/faults.md).
#
#   coord  10.77.0.1   lynx-coordinator (lease 1 s), state directory
#   h1, h2 10.77.0.11-12  an agent each, 2 CPU accelerators over tcp
#   fe1    10.77.0.2   lynx-frontend
#   client 10.77.0.9   sockperf under-load, 1000 msg/s
#
# The coordinator is off the data path: through each of its faults the
# data plane serves on its last tables, so every request is answered
# (none dropped for any reason), no node is declared down, and the
# frontend keeps producing with the epoch it had (nothing moves).
#
#  0. no fault.
#  1. kill -9 of the coordinator, a new one 1 s later: it adopts the
#     agents' instances and the frontend's claims.
#  2. SIGSTOP of the coordinator for 2.5 leases, then SIGCONT: it adds the
#     pause to every lease before any expires (no node down, nothing lost);
#     the agents hold requests while their fence is past (from ~3/4 lease
#     after their last answered heartbeat) and answer them once it is
#     renewed. Meanwhile a flow whose mqueue fills drops (flow_full): the
#     one count allowed here, at most what the pause brings.
#  3. restart of the coordinator (SIGTERM, a new one).
#  4. a full disk: the coordinator runs with its state directory on a
#     256 KiB tmpfs (in a mount namespace of its own), which is then filled.
#     A service create is refused with 507 insufficient_storage and not
#     applied (the service list is unchanged, in the API and on disk); the
#     data plane serves; once there is room again the same create
#     succeeds and is on disk.
#
# usage: coordinator.sh [BIN_DIR]   (ctest passes build/bin; root)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

IT_NAME=faults_coordinator
mh_begin "$IT_NAME" 240
if ! command -v unshare >/dev/null || ! command -v nsenter >/dev/null; then
  mh_skip "unshare and nsenter (util-linux) are needed for the full disk"
fi

STATE=$MH_DIR/state
step "set-up: coordinator, agents h1 and h2, frontend fe1, client"
fl_cluster 2 1

coord_metric() { api_get /metrics | fl_sum "$1"; }
epochs() { grep -c "producing with frontend epoch" "${FL_LOG[fe1]}" || true; }
node_epochs() { api_get /v1/nodes | jq -c '[.items[] | {id, epoch, state}] | sort_by(.id)'; }

# window NAME SECONDS FAULT_FN [MAX_DROPS REASON...]: sockperf for SECONDS
# through fe1 with FAULT_FN run 1 s into the load: nothing dropped (or at
# most MAX_DROPS, for the REASONs), no lease expired, the frontend's epoch
# and the nodes' incarnations as they were.
window() {
  local name=$1 secs=$2 fn=$3 max=${4:-0} exp0 ep0 nodes0
  exp0=$(coord_metric lynx_coordinator_lease_expiries_total)
  ep0=$(epochs) nodes0=$(node_epochs)
  fl_fault_window "$name" fe1 "$secs" "$fn" "${@:5}"
  assert_le "$FL_DROPPED" "$max" "$name: requests dropped"
  mh_wait_until 15 "$name: both nodes ready again" fl_node_ready h2
  mh_wait_until 15 "$name: both nodes ready again" fl_node_ready h1
  assert_eq "$(coord_metric lynx_coordinator_lease_expiries_total)" "$exp0" "$name: leases expired"
  assert_eq "$(epochs)" "$ep0" "$name: times fe1 changed its producing epoch"
  assert_str "$(node_epochs)" "$nodes0" "$name: the nodes' incarnations (id, epoch, state)"
}

step "0. no fault"
window none 3 true
fl_check_once h1 fe1
fl_check_once h2 fe1

step "1. kill -9 of the coordinator, a new one 1 s later"
fault_kill() {
  mh_stop "${FL_PID[coord]}" 5 KILL
  sleep 1
  fl_coordinator --state-dir "$STATE"
}
window kill9 6 fault_kill
fl_check_once h1 fe1
fl_check_once h2 fe1

step "2. SIGSTOP of the coordinator for 2.5 leases, then SIGCONT"
fault_stop() {
  kill -STOP "${FL_PID[coord]}"
  sleep "$(awk -v l="$FL_LEASE_MS" 'BEGIN { print l * 2.5 / 1000 }')"
  kill -CONT "${FL_PID[coord]}"
}
# the agents' fences pass ~3/4 lease after their last answered heartbeat:
# they hold their requests from then until the coordinator answers, and a
# flow's mqueue that fills meanwhile drops (docs/faults.md)
window sigstop 6 fault_stop $((FL_RATE * FL_LEASE_MS * 5 / 2 / 1000)) flow_full ring_full
fl_check_once h1 fe1
fl_check_once h2 fe1

step "3. restart of the coordinator (SIGTERM, a new one)"
fault_restart() {
  mh_stop "${FL_PID[coord]}" 10
  fl_coordinator --state-dir "$STATE"
}
window restart 6 fault_restart

step "4. a full disk under the state directory"
# the coordinator again, its state directory a small tmpfs of its own
# mount namespace (gone with it: nothing is left mounted)
FULL=$MH_DIR/fullstate
mkdir -p "$FULL"
mh_stop "${FL_PID[coord]}" 10
# shellcheck disable=SC2016 # expanded by the inner shell
FL_COORD_WRAP=(unshare -m --propagation private sh -c \
  'mount -t tmpfs -o size=256k lynxfull "$0" && cp -a "$1/." "$0/" && shift && exec "$@"' \
  "$FULL" "$STATE")
fl_coordinator --state-dir "$FULL"
in_coord_ns() { nsenter -t "${FL_PID[coord]}" -m "$@"; }
services_on_disk() { in_coord_ns jq -r '[.services[].name] | sort | join(",")' "$FULL/state.json"; }
services_in_api() { api_get /v1/services | jq -r '[.items[].name] | sort | join(",")'; }
# both: the window below compares the nodes at its end with those at its
# start, and h2 registering with the new coordinator meanwhile read as a
# new node (seen once under the sanitizers)
mh_wait_until 15 "both nodes ready" fl_node_ready h1
mh_wait_until 15 "both nodes ready" fl_node_ready h2
assert_str "$(services_on_disk)" echo "services in the tmpfs state directory"
in_coord_ns dd if=/dev/zero of="$FULL/filler" bs=4k >/dev/null 2>&1 || true
log "state directory: $(in_coord_ns df -k "$FULL" | tail -n 1)"

fault_full() {
  local body=$MH_DIR/create-full.json code
  code=$(mh_exec coord curl -s -o "$body" -w '%{http_code}' --max-time 5 \
    -H "Authorization: Bearer $(cat "$FL_TOKEN")" -H 'Content-Type: application/json' \
    -d '{"name":"echo2","port":9002,"app":"echo","placement":"all"}' \
    "http://127.0.0.1:$FL_API_PORT/v1/services")
  assert_eq "$code" 507 "service create on a full disk: HTTP status"
  assert_str "$(jq -r .error.code "$body")" insufficient_storage "service create on a full disk: error code"
  grep -q "No space left on device" "$body" ||
    fail "the 507 does not say why: $(cat "$body")"
  log "ok: refused: $(jq -r .error.message "$body")"
  assert_str "$(services_in_api)" echo "services in the API after the refused create"
  assert_str "$(services_on_disk)" echo "services on disk after the refused create"
}
window fulldisk 4 fault_full

step "4b. room again: the same create succeeds and is saved"
in_coord_ns rm -f "$FULL/filler"
ctl service create --name echo2 --port 9002 --app echo --placement all \
  >"$MH_DIR/create-room.out" 2>&1 ||
  { cat "$MH_DIR/create-room.out"; fail "service create failed with room on disk"; }
assert_str "$(services_in_api)" echo,echo2 "services in the API"
assert_str "$(services_on_disk)" echo,echo2 "services on disk"
fl_window_begin fe1
fl_load_start after-full fe1 2
fl_load_wait
fl_check_window fe1 after-full
assert_eq "$FL_DROPPED" 0 "after-full: requests dropped"
it_done
