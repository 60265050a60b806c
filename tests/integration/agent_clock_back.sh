#!/usr/bin/env bash
# agent_clock_back: an agent whose wall clock was stepped back (NTP, a VM
# restored from a snapshot) is not taken for an older incarnation of its
# node: epochs come from the coordinator's store, not from clocks
# (docs/etcd.md "Epochs"). libfaketime moves the agent's wall clock; its
# monotonic clock stays real (leases keep their meaning).
#
#  1. An agent registers and serves; its epoch E0.
#  2. It leaves (SIGTERM) and starts again one day in the past: it is
#     registered (no "older" refusal) with an epoch beyond E0, ready, and
#     serves.
#  3. kill -9 and at once a start two days in the past, while the
#     coordinator still holds the node at its last epoch: registered again
#     with a newer epoch, ready, serving; no epoch was refused.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init agent_clock_back
it_require_coord
it_require sockperf jq
FAKETIME_LIB=''
for f in /usr/lib/*/faketime/libfaketime.so.1 /usr/lib/faketime/libfaketime.so.1; do
  [[ -e $f ]] && { FAKETIME_LIB=$f; break; }
done
[[ -n $FAKETIME_LIB ]] || skip "libfaketime is not installed (Debian: faketime; deploy/install-deps.sh)"
pick_ports COORD_PORT API_PORT METRICS_PORT UDP_PORT


# agent_back DAYS NODE: the node's agent with its wall clock DAYS days
# behind (env execs it: the pid is the agent's). An ASan runtime must come
# first among preloaded libraries unless told otherwise.
agent_back() {
  SPAWN_WRAP=(env "LD_PRELOAD=$FAKETIME_LIB" "FAKETIME=-$1d" DONT_FAKE_MONOTONIC=1
    "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0")
  start_node_agent "$2" --cpu-accels 1
  SPAWN_WRAP=()
}

# accel_reqs: requests of the node's accelerator (its heartbeats report
# them); wait_reqs_above N: until they exceed N (5 s).
accel_reqs() { ctl accelerators --json | jq -r '[.items[].requests] | add // 0'; }
wait_reqs_above() {
  local end=$(($(now_ms) + 5000)) v
  for (( ; ; )); do
    v=$(accel_reqs)
    is_uint "$v" && ((v > $1)) && return 0
    (($(now_ms) < end)) || fail "the accelerator reports ${v:-no} requests, want more than $1"
    sleep 0.1
  done
}

# the wrapper really moves the clock
now_s=$(date +%s)
back_s=$(env "LD_PRELOAD=$FAKETIME_LIB" FAKETIME=-1d date +%s)
assert_lt "$back_s" $((now_s - 80000)) "the wall clock under libfaketime -1d"

start_coordinator --lease-ms 3000
node_ids N1
start_node_agent "$N1" --cpu-accels 1
start_coord_frontend
FE=$FRONTEND_PID FE_LOG=$FRONTEND_LOG
serve_service echo "\"port\":$UDP_PORT,\"app\":\"sockperf-echo\""

log "== 1. registered and serving"
pingpong before
E0=$(api_json "/v1/nodes/$N1" .epoch)
assert_gt "$E0" 0 "epoch of the first incarnation"
ref0=$(METRICS_PORT=$API_PORT metric lynx_coordinator_refused_epochs_total)

log "== 2. SIGTERM; the agent starts again with its clock one day back"
stop "$AGENT_PID"
wait_node_state "$N1" left 5000 || true
agent_back 1 "$N1"
wait_node_state "$N1" ready 10000 || fail "$N1 not ready after the start (state '$NODE_STATE')"
E1=$(api_json "/v1/nodes/$N1" .epoch)
assert_gt "$E1" "$E0" "epoch after a start one day in the past"
wait_log "$FE_LOG" "serving service echo" 5 1 "$FE"
pingpong day-back
wait_reqs_above 0 # a new incarnation counts from 0
log "ok: epoch $E0 -> $E1, served"

log "== 3. kill -9 and a start two days back while the node is still held"
kill -9 "$AGENT_PID"
wait_exit "$AGENT_PID" 5 || true
untrack "$AGENT_PID"
agent_back 2 "$N1"
wait_node_state "$N1" ready 10000 || fail "$N1 not ready after the second start (state '$NODE_STATE')"
E2=$(api_json "/v1/nodes/$N1" .epoch)
assert_gt "$E2" "$E1" "epoch after a start two days in the past"
ref1=$(METRICS_PORT=$API_PORT metric lynx_coordinator_refused_epochs_total)
assert_eq "$ref1" "$ref0" "registrations refused as stale"
assert_log "$AGENT_LOG" "registered with coordinator" "the agent two days back registered"
if grep -q "is older than" "$AGENT_LOG" "$COORD_LOG"; then
  fail "an epoch was refused as older: $(grep -h "is older than" "$AGENT_LOG" "$COORD_LOG" | head -n 2)"
fi
pingpong two-days-back
wait_reqs_above 0
log "ok: epoch $E1 -> $E2, served"
it_done
