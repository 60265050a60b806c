#!/usr/bin/env bash
# replica_move: replicas follow capacity, without loss (docs/design.md
# "Replicas follow capacity"). A service with two replicas runs on the only
# node, N1 (both its accelerators). Under sockperf under-load, N2 joins:
# the placement prefers a replica there, so one moves: its replacement
# starts on N2 while it serves, then it leaves the tables and is stopped
# once the frontend has nothing outstanding on it.
#
#  - the coordinator counts one move started and one done, and no more;
#  - the service ends with one replica on each node, and N2's serves;
#  - the frontend answered every request it received and dropped none
#    (nothing lost, expired or in doubt), none duplicated.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init replica_move
it_require_coord
it_require sockperf jq
pick_ports COORD_PORT API_PORT METRICS_PORT UDP_PORT

coord_metric() { METRICS_PORT=$API_PORT metric "$1"; }
# replicas_on NODE: the service's instances in the dispatch (mqueues) on NODE.
replicas_on() {
  ctl mqueues --json | jq -r --arg n "$1" '[.items[] | select(.node == $n) | .instance] | unique | length'
}

start_coordinator --lease-ms 3000
node_ids N1 N2
start_node_agent "$N1" --cpu-accels 2
start_coord_frontend
FE=$FRONTEND_PID FE_LOG=$FRONTEND_LOG
serve_service rep "\"port\":$UDP_PORT,\"app\":\"sockperf-echo\",\"placement\":{\"replicas\":2}"
end=$(($(now_ms) + 10000))
until [[ $(replicas_on "$N1") == 2 ]]; do
  (($(now_ms) < end)) || fail "the two replicas are not both on $N1: $(replicas_on "$N1")"
  sleep 0.1
done
assert_eq "$(coord_metric lynx_coordinator_replica_moves_started_total)" 0 "moves before $N2 joins"

log "== $N2 joins under sockperf under-load"
out=$IT_DIR/underload.out
underload_start "$out" 8
sp=$UNDERLOAD_PID
sleep 2
start_node_agent "$N2" --cpu-accels 1
moved() { [[ $(coord_metric lynx_coordinator_replica_moves_done_total) == 1 ]]; }
end=$(($(now_ms) + 15000))
until moved; do
  (($(now_ms) < end)) || fail "no move done within 15 s of $N2 joining (started: $(coord_metric lynx_coordinator_replica_moves_started_total))"
  sleep 0.1
done
log "ok: one replica moved to $N2"
assert_log "$COORD_LOG" "moves from $N1/" "the coordinator logged the move"
wait "$sp" || true
check_sockperf_served "$out"
check_no_drops "the frontend"
assert_eq "$(replicas_on "$N1")" 1 "replicas on $N1 after the move"
assert_eq "$(replicas_on "$N2")" 1 "replicas on $N2 after the move"
assert_eq "$(coord_metric lynx_coordinator_replica_moves_started_total)" 1 "moves started"

log "== $N2's replica serves"
r0=$(ctl accelerators --json | jq -r --arg n "$N2" '[.items[] | select(.node == $n) | .requests] | add // 0')
run_sockperf "$IT_DIR/pingpong.out" ping-pong -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 2
check_sockperf "$IT_DIR/pingpong.out"
end=$(($(now_ms) + 5000))
for (( ; ; )); do
  r1=$(ctl accelerators --json | jq -r --arg n "$N2" '[.items[] | select(.node == $n) | .requests] | add // 0')
  ((r1 > r0)) && break
  (($(now_ms) < end)) || fail "$N2's accelerator took no request ($r1)"
  sleep 0.1
done
log "ok: $N2's accelerator took $((r1 - r0)) requests"
assert_eq "$(coord_metric lynx_coordinator_replica_moves_started_total)" 1 "moves started (balanced: no more)"
it_done
