#!/usr/bin/env bash
# coord_ha: two coordinators on one etcd, one of them the leader
# (docs/etcd.md, "Leader election"); an agent and a frontend given both
# addresses (--coordinator A,B).
#
#  1. One leads (/readyz says leader, the other follower and where the
#     leader's API is); the follower redirects changes and reads of
#     runtime state (nodes, watch, services: their state and instances are
#     the leader's) to the leader (307 with Location, the query kept) and
#     refuses agents and frontends (they go to the leader); a service
#     created through the follower with curl -L exists on both (the
#     follower reloads what etcd holds: its /metrics counts it), and
#     lynxctl pointed at the follower creates one too.
#  2. sockperf under-load through the frontend; the leader killed (-9)
#     during it: the follower leads within the etcd lease (2 s) + 1 s, the
#     API takes changes again on it, the agent registers with it and the
#     frontend gets its tables from it (agents' lease 8 s: longer than a
#     failover can take, docs/etcd.md). Traffic never stops: the frontend
#     answers every request it receives, none dropped (it keeps its last
#     table while the leaders change, and the agent keeps its instances).
#     The new leader gives the frontend back the instances it produces into
#     with the epochs it has (Hello.produces): the data plane does not move.
#  3. The leader stopped cleanly (SIGTERM) revokes its lease: the other
#     (restarted) leads within a second, not after the lease.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init coord_ha
it_require_coord
it_require etcd etcdctl sockperf
pick_ports CA CA_API CB CB_API METRICS_PORT UDP_PORT UDP_PORT2 UDP_PORT3
PFX=/it-$IT_NODE/
TTL=2

start_etcd
# start_coord X CTL API: coordinator X on etcd; sets PID_X and LOG_X
start_coord() {
  start_coord_as "$1" "$2" "$3" --state-dir "$IT_DIR/state-$1" --lease-ms 8000 \
    --etcd "$ETCD_URL" --etcd-prefix "$PFX" --etcd-lease-s "$TTL" \
    --etcd-timeout-ms 800
}

start_coord A "$CA" "$CA_API"
wait_role "$CA_API" leader 5000 || fail "coordinator A does not lead alone"
start_coord B "$CB" "$CB_API"
sleep 0.5
assert_str "$(coord_role "$CB_API")" follower "B's role while A leads"
assert_str "$(curl -sf "http://127.0.0.1:$CB_API/readyz" | jq -r .leader_api)" \
  "127.0.0.1:$CA_API" "where B says the leader's API is"

node_ids N1
COORD_PORT=$CA
# B first: it refuses, the agent moves on to A (the later --coordinator wins)
start_node_agent "$N1" --cpu-accels 2 --coordinator "127.0.0.1:$CB,127.0.0.1:$CA"
assert_log "$AGENT_LOG" "does not lead" "the agent was refused by the follower first"
API_PORT=$CA_API
start_coord_frontend --coordinator "127.0.0.1:$CB,127.0.0.1:$CA"

# ---- 1. the follower ------------------------------------------------------------------
log "== 1. the follower redirects changes, answers reads"
API_PORT=$CB_API
api POST /v1/services -d "{\"name\":\"echo\",\"port\":$UDP_PORT,\"app\":\"sockperf-echo\"}"
assert_eq "$API_STATUS" 307 "POST /v1/services on the follower: HTTP status"
loc=$(tr -d '\r' <"$API_HEADERS" | awk 'tolower($1) == "location:" {print $2}')
assert_str "$loc" "http://127.0.0.1:$CA_API/v1/services" "the redirect's Location"
api GET "/v1/watch?since=1&timeout_ms=10"
assert_eq "$API_STATUS" 307 "GET /v1/watch on the follower (runtime state: the leader's)"
loc=$(tr -d '\r' <"$API_HEADERS" | awk 'tolower($1) == "location:" {print $2}')
assert_str "$loc" "http://127.0.0.1:$CA_API/v1/watch?since=1&timeout_ms=10" \
  "the redirect keeps the query"
st=$(curl -sL --max-time 5 -o "$IT_DIR/nodes.json" -w '%{http_code}' \
  "http://127.0.0.1:$CB_API/v1/nodes")
assert_eq "$st" 200 "GET /v1/nodes through the follower with curl -L"
assert_str "$(jq -r '.items[0].id' "$IT_DIR/nodes.json")" "$N1" "the node, as the leader knows it"
st=$(curl -sL --max-time 5 -o /dev/null -w '%{http_code}' -X POST \
  "http://127.0.0.1:$CB_API/v1/services" \
  -d "{\"name\":\"echo\",\"port\":$UDP_PORT,\"app\":\"sockperf-echo\"}")
assert_eq "$st" 201 "POST through the follower with curl -L: HTTP status"
# the follower holds the intent from etcd (lynx_coordinator_services on
# its own /metrics), and sends reads of a service, whose state and
# instances only the leader knows, to the leader
end=$(($(now_ms) + 3000))
until [[ $(METRICS_PORT=$CB_API metric lynx_coordinator_services 2>/dev/null) == 1 ]]; do
  (($(now_ms) < end)) || { it_check_failed "the follower does not hold service echo"; break; }
  sleep 0.05
done
log "ok: the follower holds service echo"
st=$(curl -s --max-time 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$CB_API/v1/services/echo")
assert_eq "$st" 307 "GET /v1/services/echo on the follower (its state: the leader's)"
st=$(curl -sL --max-time 5 -o "$IT_DIR/svc.json" -w '%{http_code}' "http://127.0.0.1:$CB_API/v1/services/echo")
assert_eq "$st" 200 "GET /v1/services/echo through the follower with curl -L"
assert_eq "$(jq -r .port "$IT_DIR/svc.json")" "$UDP_PORT" "service echo's port, as the leader knows it"
# lynxctl follows the redirect too
"$LYNX_BIN_DIR/lynxctl" --api "http://127.0.0.1:$CB_API" service create \
  --name viactl --port "$UDP_PORT3" --app sockperf-echo >"$IT_DIR/lynxctl.out" 2>&1 ||
  it_check_failed "lynxctl service create through the follower: $(cat "$IT_DIR/lynxctl.out")"
API_PORT=$CA_API
api GET /v1/services/viactl
assert_eq "$API_STATUS" 200 "the service lynxctl created through the follower, on the leader"
wait_log "$FRONTEND_LOG" "service echo" 10 1 "$FRONTEND_PID"
API_PORT=$CA_API

# ---- 2. the leader killed under load ---------------------------------------------------
log "== 2. the leader killed (-9) under sockperf under-load"
out=$IT_DIR/underload.out
underload_start "$out" 8
sp=$UNDERLOAD_PID
# each mqueue of echo: its producer and the epoch it produces with
producers() {
  api_json /v1/mqueues '[.items[] | select(.service == "echo") | "\(.id)=\(.frontend)@\(.epoch)"] | sort | join(" ")'
}
before=$(producers)
[[ $before == *@[1-9]* && $before != *@0* ]] || fail "echo's mqueues under A have no producer epoch: $before"
sleep 2
t_kill=$(now_ms)
kill -KILL "$PID_A"
wait "$PID_A" 2>/dev/null
untrack "$PID_A"
wait_role "$CB_API" leader $(((TTL + 3) * 1000)) || fail "B does not lead after A died"
lead_ms=$(($(now_ms) - t_kill))
log "B leads $lead_ms ms after A was killed"
assert_le "$lead_ms" $((TTL * 1000 + $(ts_ms 1000))) "ms from the kill to B leading (lease ${TTL} s + $(ts_s 1) s)"
API_PORT=$CB_API
end=$(($(now_ms) + 5000))
until api POST /v1/services -d "{\"name\":\"echo2\",\"port\":$UDP_PORT2,\"app\":\"sockperf-echo\"}" &&
  [[ $API_STATUS == 201 ]]; do
  (($(now_ms) < end)) || { it_check_failed "B takes no change: HTTP $API_STATUS $(cat "$API_BODY")"; break; }
  sleep 0.05
done
log "B took a change $(($(now_ms) - t_kill)) ms after the kill"
wait_log "$AGENT_LOG" "registered with coordinator" 10 2 "$AGENT_PID"
wait "$sp"
wait_node_state "$N1" ready 5000 || it_check_failed "$N1 not ready on B: $NODE_STATE"
check_sockperf_served "$out"
end=$(($(now_ms) + 10000))
until [[ $(api_json /v1/frontends '.items[0].instances') -gt 0 ]]; do
  (($(now_ms) < end)) || fail "B gave the frontend no instance: $(cat "$API_BODY")"
  sleep 0.1
done
assert_str "$(producers)" "$before" "echo's mqueues' producers and epochs under B (as under A)"

# ---- 3. a clean stop hands over at once ---------------------------------------------------
log "== 3. the leader stopped cleanly: the other leads within a second"
start_coord A "$CA" "$CA_API"
sleep 0.5
assert_str "$(coord_role "$CA_API")" follower "A's role after its restart"
t0=$(now_ms)
stop "$PID_B"
wait_role "$CA_API" leader 5000 || fail "A does not lead after B stopped"
assert_lt $(($(now_ms) - t0)) "$(ts_ms 1500)" "ms from B's SIGTERM to A leading (its lease revoked)"
exit 0
