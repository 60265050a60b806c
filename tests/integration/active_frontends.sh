#!/usr/bin/env bash
# active_frontends: several active frontends share the accelerators, one
# producer per mqueue, and re-partition without loss as they join and fail
# (docs/frontends.md). Two agents of two CPU accelerators each (tcp data
# plane, so that the agents can count producers), service echo on all four,
# a coordinator with --active-frontends 0 (every frontend is active):
#
#  1. fe1 alone produces into all four instances.
#  2. fe2 (on 127.0.0.2) joins while sockperf under-load runs through fe1:
#     fe1 releases two instances, answers what it holds on them, and only
#     then are they given to fe2 (two moves). fe1 answered every request it
#     received and dropped none.
#  3. Every mqueue has one producer: the API names one frontend for each,
#     each frontend has two instances, and a ping-pong through fe2 only
#     moves the counters of fe2's mqueues (and through fe1, fe1's). No
#     region's agent saw two producers at its epoch, and the moved regions
#     admit a newer epoch than the others.
#  4. fe2 is killed (-9) under load through fe1: its two instances go to
#     fe1 with a newer epoch; fe1's own connections are untouched (it
#     drops nothing), and a ping-pong through fe1 reaches all four.
#  5. fe2 returns: it gets two instances back, again after fe1 let go.
#  6. fe2 is drained (lynxctl frontend drain) under load through fe1: it
#     lets go of its two, fe1 takes them and drops nothing, fe2 is a
#     standby; undrained, it takes two again.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init active_frontends
it_require_coord
it_require sockperf jq
pick_ports COORD_PORT API_PORT METRICS_PORT UDP_PORT FE2_METRICS AG1_METRICS AG2_METRICS

coord_metric() { METRICS_PORT=$API_PORT metric "$1"; }
fe_field() { api_json /v1/frontends ".items[] | select(.id == \"$1\") | .$2"; }
# wait_fe ID INSTANCES TIMEOUT_S: until frontend ID produces into that many.
wait_fe() {
  local end=$(($(now_ms) + $3 * 1000)) v
  until [[ $(v=$(fe_field "$1" instances) && echo "$v") == "$2" ]]; do
    (($(now_ms) < end)) || fail "frontend $1 does not produce into $2 instances within $3 s: $(cat "$API_BODY")"
    sleep 0.1
  done
}
# dispatched_by ID: requests dispatched to the mqueues frontend ID produces into.
dispatched_by() {
  api_json /v1/mqueues "[.items[] | select(.frontend == \"$1\") | .dispatched] | add // 0"
}
# agent_max PORT NAME: the largest sample of NAME on an agent's metrics.
agent_max() {
  curl -sf --max-time 5 "http://127.0.0.1:$1/metrics" | awk -v n="$2" '
    $1 ~ /^#/ { next } { s = $1; sub(/\{.*/, "", s) }
    s == n { if (!f || $2 + 0 > m) m = $2 + 0; f = 1 }
    END { if (!f) exit 1; printf "%.0f\n", m }'
}
fe2_start() {
  spawn_daemon lynx-frontend frontend "(fe2)" --coordinator "127.0.0.1:$COORD_PORT" \
    --bind 127.0.0.2 --metrics "127.0.0.1:$FE2_METRICS" --frontend-id fe2
  FE2=$SPAWN_PID FE2_LOG=$SPAWN_LOG
}

start_coordinator --lease-ms 3000 --active-frontends 0
node_ids N1 N2
start_node_agent "$N1" --transport tcp --metrics "127.0.0.1:$AG1_METRICS"
start_node_agent "$N2" --transport tcp --metrics "127.0.0.1:$AG2_METRICS"
start_coord_frontend --frontend-id fe1
FE1_LOG=$FRONTEND_LOG
# 1024 slots: half a second of an accelerator descheduled at 2000 msg/s
# (ASan on 2 loaded cores) before a flow's ring is full
serve_service echo "\"port\":$UDP_PORT,\"app\":\"sockperf-echo\",\"slots\":1024"

log "== 1. fe1 alone produces into every instance"
wait_fe fe1 4 10
E1=$(fe_field fe1 epoch)
assert_gt "$E1" 0 "fe1's epoch"
# instance@epoch of each instance fe1 produces into (the instances given in
# one round share an epoch)
fe1_pairs() {
  api_json /v1/mqueues '[.items[] | select(.frontend == "fe1") | "\(.instance)@\(.epoch)"] | unique | .[]'
}
pairs0=$(fe1_pairs)
assert_eq "$(api_json /v1/mqueues '[.items[] | select(.frontend != "fe1")] | length')" 0 "mqueues fe1 does not produce into"

log "== 2. fe2 joins under load through fe1"
out=$IT_DIR/join.out
underload_start "$out" 8
sleep 2
fe2_start
wait_fe fe2 2 15
wait_fe fe1 2 5
assert_eq "$(coord_metric lynx_coordinator_frontend_moves_total)" 2 "instances moved from fe1 to fe2"
assert_log "$COORD_LOG" "moves from frontend fe1" "the coordinator logged the release"
assert_log "$COORD_LOG" "frontend fe1 answered what it held on it" "the move waited for fe1's answers"
wait "$UNDERLOAD_PID" || true
check_sockperf_served "$out"
check_no_drops fe1
E2=$(fe_field fe2 epoch)
assert_gt "$E2" "$E1" "fe2's epoch (given after fe1's)"
kept=0
for p in $(fe1_pairs); do
  grep -qx "$p" <<<"$pairs0" || it_check_failed "fe1 produces into instance ${p%@*} with epoch ${p#*@}, not with the one it had before fe2 joined"
  kept=$((kept + 1))
done
assert_eq "$kept" 2 "instances fe1 kept, each with the epoch it had"

log "== 3. one producer per mqueue"
assert_eq "$(api_json /v1/mqueues '[.items[] | select(.frontend != "fe1" and .frontend != "fe2")] | length')" 0 "mqueues without a producer"
assert_eq "$(api_json /v1/mqueues '[.items[] | select(.frontend == "fe1") | .instance] | unique | length')" 2 "fe1's instances"
assert_eq "$(api_json /v1/mqueues '[.items[] | select(.frontend == "fe2") | .instance] | unique | length')" 2 "fe2's instances"
for port in "$AG1_METRICS" "$AG2_METRICS"; do
  assert_le "$(agent_max "$port" lynx_agent_region_producers)" 1 "producers of a region at its epoch (agent :$port)"
done
fence_max=$(( $(agent_max "$AG1_METRICS" lynx_agent_region_fence) > $(agent_max "$AG2_METRICS" lynx_agent_region_fence) ?
  $(agent_max "$AG1_METRICS" lynx_agent_region_fence) : $(agent_max "$AG2_METRICS" lynx_agent_region_fence) ))
assert_eq "$fence_max" "$E2" "the newest epoch a region admits (the moved ones')"
for fe in fe2 fe1; do
  ip=127.0.0.1 other=fe2
  [[ $fe == fe2 ]] && ip=127.0.0.2 other=fe1
  mine0=$(dispatched_by "$fe") theirs0=$(dispatched_by "$other")
  run_sockperf "$IT_DIR/pp-$fe.out" ping-pong -i "$ip" -p "$UDP_PORT" -m 64 -t 2
  check_sockperf "$IT_DIR/pp-$fe.out"
  # every request of it, reported (frontends report their counts with
  # their heartbeats: a count read before the last report would be read
  # as "theirs0" in the next round and the late rest blamed on that one)
  end=$(($(now_ms) + 5000))
  until (($(dispatched_by "$fe") >= mine0 + SP_SENT)); do
    (($(now_ms) < end)) || fail "$fe's mqueues report $(($(dispatched_by "$fe") - mine0)) of the $SP_SENT requests of a ping-pong through $fe dispatched"
    sleep 0.2
  done
  assert_eq "$(dispatched_by "$other")" "$theirs0" "requests dispatched to $other's mqueues by a ping-pong through $fe"
done

log "== 4. fe2 fails under load through fe1"
out=$IT_DIR/fail.out
underload_start "$out" 6
sleep 1.5
kill -9 "$FE2"
wait_exit "$FE2" 5 || fail "fe2 did not die of SIGKILL"
wait_fe fe1 4 10
assert_gt "$(fe_field fe1 epoch)" "$E2" "fe1's epoch for fe2's former instances"
wait "$UNDERLOAD_PID" || true
check_sockperf_served "$out"
check_no_drops "fe1 (its connections stayed)"
run_sockperf "$IT_DIR/pp-all.out" ping-pong -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 3
check_sockperf "$IT_DIR/pp-all.out"

log "== 5. fe2 returns"
moves=$(coord_metric lynx_coordinator_frontend_moves_total)
fe2_start
wait_fe fe2 2 15
wait_fe fe1 2 5
assert_eq "$(coord_metric lynx_coordinator_frontend_moves_total)" $((moves + 2)) "instances moved to the returning fe2"
run_sockperf "$IT_DIR/pp-back.out" ping-pong -i 127.0.0.2 -p "$UDP_PORT" -m 64 -t 2
check_sockperf "$IT_DIR/pp-back.out"

log "== 6. fe2 drained under load through fe1, then undrained"
moves=$(coord_metric lynx_coordinator_frontend_moves_total)
out=$IT_DIR/drain.out
underload_start "$out" 6
sleep 1.5
ctl frontend drain fe2 >"$IT_DIR/drain-ctl.out" 2>&1 || fail "lynxctl frontend drain fe2: $(cat "$IT_DIR/drain-ctl.out")"
assert_str "$(cat "$IT_DIR/drain-ctl.out")" "frontend fe2 drain requested" "lynxctl's answer"
wait_fe fe1 4 15
wait_fe fe2 0 5
assert_str "$(fe_field fe2 active)" false "fe2 active after its drain"
assert_str "$(fe_field fe2 draining)" true "fe2 draining"
assert_eq "$(coord_metric lynx_coordinator_frontend_moves_total)" $((moves + 2)) "instances moved off the drained fe2"
wait "$UNDERLOAD_PID" || true
check_sockperf_served "$out"
check_no_drops fe1
ctl frontend undrain fe2 >/dev/null || fail "lynxctl frontend undrain fe2"
wait_fe fe2 2 15
wait_fe fe1 2 5
it_done
