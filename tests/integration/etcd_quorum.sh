#!/usr/bin/env bash
# etcd_quorum: etcd loses its quorum under load (docs/etcd.md, "etcd
# without a quorum"). Three etcd members, three coordinators on them, an
# agent and a frontend given the three coordinators' addresses, sockperf
# under-load through the frontend for the whole test.
#
#  1. Two of the three etcd members stopped (SIGSTOP): the leader steps
#     down, no coordinator can win, and every coordinator soon knows of no
#     leader (/readyz says no_leader and why). A change, on any of them,
#     gets 503 no_leader naming etcd, not a redirect; the agent, refused
#     with no_leader, keeps its lease (lynx_agent_lease_fenced stays 0,
#     polled through its lease and 2 s more) and says so in its log once.
#  2. The members continued (SIGCONT): a coordinator leads within 20 s and
#     takes a change; the agent registers with it.
#  3. Every request sockperf sent over the whole outage was answered: the
#     frontend answered every request it received and dropped none; after
#     the recovery, traffic still flows (a second run, every request
#     answered).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init etcd_quorum
it_require_coord
it_require etcd etcdctl sockperf
pick_ports EC1 EP1 EC2 EP2 EC3 EP3 CA CA_API CB CB_API CC CC_API \
  METRICS_PORT AGENT_METRICS UDP_PORT UDP_PORT2 UDP_PORT3
PFX=/it-$IT_NODE/
TTL=2
# the agents' lease: shorter than the outage below, as short as rides out
# a failover (heartbeats every 333 ms; --lease-ms: two of them, the
# election lease and 3.5 s, docs/etcd.md)
SUSPECT_MS=1000
LEASE_MS=6200

# stopped etcd members are continued before the cleanup signals them (a
# stopped process does not act on SIGTERM)
STOPPED=()
trap 'rc=$?; ((${#STOPPED[@]})) && kill -CONT "${STOPPED[@]}" 2>/dev/null; (exit $rc); it_cleanup' EXIT

# ---- etcd: three members -------------------------------------------------------
cluster="e1=http://127.0.0.1:$EP1,e2=http://127.0.0.1:$EP2,e3=http://127.0.0.1:$EP3"
ENDPOINTS="http://127.0.0.1:$EC1,http://127.0.0.1:$EC2,http://127.0.0.1:$EC3"
declare -A ETCD_PIDS=()
for i in 1 2 3; do
  c=EC$i p=EP$i
  etcd --name "e$i" --data-dir "$IT_DIR/etcd-e$i" \
    --listen-client-urls "http://127.0.0.1:${!c}" \
    --advertise-client-urls "http://127.0.0.1:${!c}" \
    --listen-peer-urls "http://127.0.0.1:${!p}" \
    --initial-advertise-peer-urls "http://127.0.0.1:${!p}" \
    --initial-cluster "$cluster" --initial-cluster-state new \
    --initial-cluster-token "lynx-it-$IT_NODE" \
    >"$IT_DIR/etcd-e$i.log" 2>&1 </dev/null &
  ETCD_PIDS[$i]=$!
  track "$!" "etcd(e$i)"
  log "started etcd(e$i) pid $! on http://127.0.0.1:${!c}"
done
end=$(($(now_ms) + 20000))
until ETCDCTL_API=3 etcdctl --endpoints "$ENDPOINTS" --command-timeout=2s \
  endpoint health >/dev/null 2>&1; do
  (($(now_ms) < end)) || fail "the etcd cluster is not healthy within 20 s: $(tail -3 "$IT_DIR/etcd-e1.log")"
  sleep 0.2
done
log "etcd: 3 members healthy"

# ---- three coordinators, an agent, a frontend --------------------------------------
# start_coord X CTL API: coordinator X on etcd; sets PID_X and LOG_X
start_coord() {
  start_coord_as "$1" "$2" "$3" --state-dir "$IT_DIR/state-$1" \
    --lease-ms "$LEASE_MS" --suspect-ms "$SUSPECT_MS" --etcd "$ENDPOINTS" \
    --etcd-prefix "$PFX" --etcd-lease-s "$TTL" --etcd-timeout-ms 800
}
readyz() { curl -sf --max-time 2 "http://127.0.0.1:$1/readyz" 2>/dev/null; }
APIS=("$CA_API" "$CB_API" "$CC_API")
# leader_api: the API port of the coordinator that leads ("" when none)
leader_api() {
  local a
  for a in "${APIS[@]}"; do
    [[ $(readyz "$a" | jq -r '.role // ""' 2>/dev/null) == leader ]] && { echo "$a"; return; }
  done
}
# wait_leader TIMEOUT_MS: until one leads; sets LEADER (its API port)
wait_leader() {
  local end=$(($(now_ms) + $1))
  for (( ; ; )); do
    LEADER=$(leader_api)
    [[ -n $LEADER ]] && return 0
    (($(now_ms) < end)) || return 1
    sleep 0.1
  done
}
start_coord A "$CA" "$CA_API"
start_coord B "$CB" "$CB_API"
start_coord C "$CC" "$CC_API"
wait_leader 10000 || fail "no coordinator leads"
log "coordinator on API port $LEADER leads"
COORDS="127.0.0.1:$CA,127.0.0.1:$CB,127.0.0.1:$CC"
node_ids N1
COORD_PORT=$CA # (the helpers' --coordinator; the later one, all three, wins)
start_node_agent "$N1" --coordinator "$COORDS" --metrics "127.0.0.1:$AGENT_METRICS"
start_coord_frontend --coordinator "$COORDS"
API_PORT=$LEADER
api POST /v1/services -d "{\"name\":\"echo\",\"port\":$UDP_PORT,\"app\":\"sockperf-echo\"}"
assert_eq "$API_STATUS" 201 "POST /v1/services on the leader"
wait_log "$FRONTEND_LOG" "service echo" 15 1 "$FRONTEND_PID"
probe_udp "before the outage" 3 50

fenced() {
  curl -sf --max-time 2 "http://127.0.0.1:$AGENT_METRICS/metrics" |
    awk '$1 == "lynx_agent_lease_fenced" {print $2}'
}
assert_eq "$(fenced)" 0 "lynx_agent_lease_fenced before the outage"

# ---- 1. quorum lost under load -----------------------------------------------------
log "== 1. two of three etcd members stopped under sockperf under-load"
out=$IT_DIR/underload.out
sockperf_base
# long enough to span the outage, its checks and a recovery of up to ~10 s
sockperf under-load -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 28 --mps 1000 \
  --reply-every 1 --buffer-size 4194304 >"$out" 2>&1 &
sp=$!
sleep 2
STOPPED=("${ETCD_PIDS[1]}" "${ETCD_PIDS[2]}")
kill -STOP "${STOPPED[@]}"
t_stop=$(now_ms)
log "SIGSTOP to etcd members e1 and e2 (pids ${STOPPED[*]})"

# every coordinator comes to know of no leader; the agent's fence polled
# all along, until its lease and 2 s more have passed
declare -A NOLEAD=()
maxf=0 nf=0
end=$((t_stop + LEASE_MS + 2000))
while (($(now_ms) < end)); do
  f=$(fenced)
  if is_uint "$f"; then
    ((f > maxf)) && maxf=$f
    nf=$((nf + 1))
  fi
  for a in "${APIS[@]}"; do
    [[ -n ${NOLEAD[$a]:-} ]] && continue
    if [[ $(readyz "$a" | jq -r '.no_leader // false' 2>/dev/null) == true ]]; then
      NOLEAD[$a]=$(($(now_ms) - t_stop))
      log "API port $a knows of no leader $((NOLEAD[$a])) ms after the stop: $(readyz "$a" | jq -r .why)"
    fi
  done
  sleep 0.1
done
# the leader that stepped down may take a little longer (its lease's 2/3
# TTL, then a request timed out); any coordinator still unsure by now gets
# until 10 s after the stop
end=$((t_stop + 10000))
while ((${#NOLEAD[@]} < 3 && $(now_ms) < end)); do
  for a in "${APIS[@]}"; do
    [[ -n ${NOLEAD[$a]:-} ]] && continue
    [[ $(readyz "$a" | jq -r '.no_leader // false' 2>/dev/null) == true ]] &&
      NOLEAD[$a]=$(($(now_ms) - t_stop)) && log "API port $a knows of no leader $((NOLEAD[$a])) ms after the stop"
  done
  sleep 0.1
done
assert_ge "$nf" 3 "scrapes of the agent's metrics during the outage"
assert_eq "$maxf" 0 "lynx_agent_lease_fenced during $((LEASE_MS + 2000)) ms without quorum (max of $nf scrapes)"
# and between the scrapes: the fence logs when it passes (agent/link.c)
assert_never_fenced "$AGENT_LOG" "without quorum"
assert_eq "${#NOLEAD[@]}" 3 "coordinators that know of no leader"
[[ -z $(leader_api) ]] || it_check_failed "a coordinator leads without etcd's quorum"
for a in "${APIS[@]}"; do
  assert_str "$(readyz "$a" | jq -r '"\(.role) \(.leader_api)"')" "follower " \
    "role and leader_api of API port $a"
  API_PORT=$a
  api POST /v1/services -d "{\"name\":\"echo2\",\"port\":$UDP_PORT2,\"app\":\"sockperf-echo\"}"
  json_error_check "POST /v1/services on API port $a without quorum" 503 no_leader \
    "etcd cannot be reached from here"
  api DELETE /v1/services/echo
  json_error_check "DELETE /v1/services/echo on API port $a without quorum" 503 no_leader \
    "an election waits for its quorum"
done
# lynxctl says so too (and does not loop on redirects)
if ctl service delete echo >"$IT_DIR/ctl-noq.out" 2>&1; then
  it_check_failed "lynxctl service delete succeeded without quorum"
else
  assert_log "$IT_DIR/ctl-noq.out" "no coordinator leads" "lynxctl's error without quorum"
fi
assert_log "$AGENT_LOG" "no coordinator leads (etcd without quorum?)" \
  "the agent says why it keeps serving"
n=$(grep -cF "no coordinator leads (etcd without quorum?)" "$AGENT_LOG")
assert_eq "$n" 1 "times the agent logged it in this episode"

# ---- 2. quorum back ---------------------------------------------------------------
log "== 2. the members continued"
nreg=$(grep -cF "registered with coordinator" "$AGENT_LOG")
kill -CONT "${STOPPED[@]}"
t_cont=$(now_ms)
STOPPED=()
wait_leader 20000 || fail "no coordinator leads within 20 s of the quorum's return"
log "API port $LEADER leads $(($(now_ms) - t_cont)) ms after SIGCONT"
API_PORT=$LEADER
end=$((t_cont + 20000))
until api POST /v1/services -d "{\"name\":\"echo2\",\"port\":$UDP_PORT2,\"app\":\"sockperf-echo\"}" &&
  [[ $API_STATUS == 201 ]]; do
  (($(now_ms) < end)) || { it_check_failed "no change taken within 20 s of the quorum's return: HTTP $API_STATUS $(head -c 300 "$API_BODY")"; break; }
  sleep 0.2
done
log "a change taken $(($(now_ms) - t_cont)) ms after SIGCONT"
wait_log "$AGENT_LOG" "registered with coordinator" 20 $((nreg + 1)) "$AGENT_PID"
wait_node_state "$N1" ready 20000 || it_check_failed "$N1 not ready on the new leader: $NODE_STATE"

# ---- 3. every request answered ----------------------------------------------------------
log "== 3. traffic over the whole outage, and after"
wait "$sp"
check_sockperf_served "$out"
assert_eq "$(fenced)" 0 "lynx_agent_lease_fenced after the recovery"
wait_log "$FRONTEND_LOG" "service echo2" 15 1 "$FRONTEND_PID"
out2=$IT_DIR/after.out
sockperf_base
run_sockperf "$out2" under-load -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 3 --mps 1000 \
  --reply-every 1 --buffer-size 4194304
check_sockperf_served "$out2"
it_done
