#!/usr/bin/env bash
# etcd_store: the coordinator keeps operator intent in etcd (--etcd,
# docs/etcd.md) instead of its state directory.
#
#  1. A coordinator on a real etcd: a service created through the API is a
#     key under the prefix (its spec, as the API took it), a drain intent
#     another; agents, a frontend and the service serve as with a state
#     directory (sockperf ping-pong answered).
#  2. That coordinator killed (-9) and another started on the same etcd,
#     with an empty state directory: the service and the drain intent are
#     back, and the frontend keeps serving through it.
#  3. etcd stopped (SIGSTOP: it answers nothing): an API change answers
#     503 store_unavailable within the etcd timeout, saying etcd and that
#     the change was not applied; reads still answer, without it; etcd
#     back: the next change is saved, and etcd holds what the API shows
#     (should the timed-out write have reached etcd after all, that save
#     takes it back out); the refused change made again succeeds.
#  4. What the coordinator refuses to start on rather than forget
#     services: a layout version it does not know, an etcd it cannot reach
#     (each a clear error and a non-zero exit).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init etcd_store
it_require_coord
it_require etcd etcdctl sockperf
pick_ports COORD_PORT API_PORT METRICS_PORT UDP_PORT UDP_PORT2 UDP_PORT3
PFX=/it-$IT_NODE/

start_etcd
COORD_STATE=$IT_DIR/state-a
start_coordinator --etcd "$ETCD_URL" --etcd-prefix "$PFX" --etcd-timeout-ms 800
node_ids N1 N2
start_node_agent "$N1" --cpu-accels 1
start_node_agent "$N2" --cpu-accels 1
start_coord_frontend

# ---- 1. operator intent in etcd --------------------------------------------------------
log "== 1. a service and a drain intent are keys in etcd"
api POST /v1/services -d "{\"name\":\"echo1\",\"port\":$UDP_PORT,\"app\":\"sockperf-echo\"}"
assert_eq "$API_STATUS" 201 "POST /v1/services echo1: HTTP status"
v=$(etcd_get "${PFX}services/echo1")
assert_str "$(jq -r '.name + " " + (.port|tostring) + " " + .app' <<<"$v")" \
  "echo1 $UDP_PORT sockperf-echo" "the spec etcd holds under ${PFX}services/echo1"
assert_eq "$(etcd_get "${PFX}version")" 1 "the layout version in etcd"
api POST "/v1/nodes/$N2/drain"
assert_eq "$API_STATUS" 200 "drain $N2: HTTP status"
n=$(ETCDCTL_API=3 etcdctl --endpoints "$ETCD_URL" get --keys-only --prefix "${PFX}drained/" | grep -c "$N2")
assert_eq "$n" 1 "a drain intent for $N2 in etcd"
wait_log "$FRONTEND_LOG" "service echo1" 10 1 "$FRONTEND_PID"
out=$IT_DIR/pingpong-1.out
run_sockperf "$out" ping-pong -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 1
check_sockperf "$out"

# ---- 2. another coordinator on the same etcd ----------------------------------------------
log "== 2. the coordinator killed, another started on the same etcd"
kill -KILL "$COORD_PID"
wait "$COORD_PID" 2>/dev/null
untrack "$COORD_PID"
COORD_STATE=$IT_DIR/state-b # empty: everything must come from etcd
start_coordinator --etcd "$ETCD_URL" --etcd-prefix "$PFX" --etcd-timeout-ms 800
# it leads once the dead one's election lease has run out; until then it
# sends reads of services (their state is the leader's) to the dead one
wait_role "$API_PORT" leader 10000 || fail "the new coordinator does not lead within 10 s"
log "ok: the new coordinator leads after ${WAITED_MS} ms"
assert_eq "$(api_json /v1/services/echo1 .port)" "$UDP_PORT" "echo1 after the restart"
[[ -z $(ls -A "$IT_DIR/state-b" 2>/dev/null) ]] ||
  it_check_failed "the coordinator on etcd wrote to its state directory: $(ls "$IT_DIR/state-b")"
wait_node_state "$N1" ready 10000
wait_node_state "$N2" drained 10000
out=$IT_DIR/pingpong-2.out
run_sockperf "$out" ping-pong -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 1
check_sockperf "$out"

# ---- 3. etcd not answering -------------------------------------------------------------
log "== 3. etcd stopped: changes answer 503, reads answer"
kill -STOP "$ETCD_PID"
t0=$(now_ms)
api POST /v1/services -d "{\"name\":\"echo2\",\"port\":$UDP_PORT2,\"app\":\"sockperf-echo\"}"
t1=$(now_ms)
assert_eq "$API_STATUS" 503 "POST /v1/services while etcd is stopped: HTTP status"
assert_str "$(jq -r .error.code "$API_BODY")" store_unavailable "the error code"
[[ $(jq -r .error.message "$API_BODY") == *etcd* ]] ||
  it_check_failed "the 503 does not say etcd: $(cat "$API_BODY")"
[[ $(jq -r .error.message "$API_BODY") == *"not applied"* ]] ||
  it_check_failed "the 503 does not say the change was not applied: $(cat "$API_BODY")"
assert_lt $((t1 - t0)) "$(ts_ms 3000)" "ms the 503 took (etcd timeout 800 ms)"
api GET /v1/services
assert_eq "$API_STATUS" 200 "GET /v1/services while etcd is stopped"
assert_str "$(jq -r '[.items[].name] | index("echo2")' "$API_BODY")" null \
  "echo2 in GET /v1/services after the 503"
kill -CONT "$ETCD_PID"
api POST /v1/services -d "{\"name\":\"echo3\",\"port\":$UDP_PORT3,\"app\":\"sockperf-echo\"}"
assert_eq "$API_STATUS" 201 "POST /v1/services echo3 once etcd is back"
assert_str "$(etcd_get "${PFX}services/echo3" | jq -r .name)" echo3 "echo3 in etcd"
assert_str "$(etcd_get "${PFX}services/echo2")" "" "echo2 in etcd (refused, not applied)"
api GET /v1/services/echo2
assert_eq "$API_STATUS" 404 "GET /v1/services/echo2 (refused while etcd was stopped)"
api POST /v1/services -d "{\"name\":\"echo2\",\"port\":$UDP_PORT2,\"app\":\"sockperf-echo\"}"
assert_eq "$API_STATUS" 201 "POST /v1/services echo2 again, etcd back"
assert_str "$(etcd_get "${PFX}services/echo2" | jq -r .name)" echo2 "echo2 in etcd"
api DELETE /v1/services/echo2
assert_eq "$API_STATUS" 200 "DELETE echo2"
assert_str "$(etcd_get "${PFX}services/echo2")" "" "echo2 in etcd once deleted"

# ---- 4. refusals at start --------------------------------------------------------------
log "== 4. a layout version it does not know, an etcd it cannot reach"
stop "$COORD_PID"
ETCDCTL_API=3 etcdctl --endpoints "$ETCD_URL" put "${PFX}version" 9 >/dev/null
NOWAIT=1 start_coordinator --etcd "$ETCD_URL" --etcd-prefix "$PFX"
wait_exit "$COORD_PID" 10 || fail "the coordinator started on layout version 9"
assert_gt "$WAIT_RC" 0 "the coordinator's exit status on layout version 9"
assert_log "$COORD_LOG" "different release" "it says the layout is another release's"
pick_ports DEAD_PORT
NOWAIT=1 start_coordinator --etcd "http://127.0.0.1:$DEAD_PORT" --etcd-timeout-ms 300
wait_exit "$COORD_PID" 10 || fail "the coordinator started without its etcd"
assert_gt "$WAIT_RC" 0 "the coordinator's exit status without its etcd"
assert_log "$COORD_LOG" "cannot load state from http://127.0.0.1:$DEAD_PORT" "it says it cannot reach etcd"
exit 0
