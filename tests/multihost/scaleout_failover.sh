#!/usr/bin/env bash
# scaleout_failover: a cluster spread over network namespaces ("hosts"
# joined by a bridge, 10.77.0.0/24, see netns.sh):
#
#   coord  10.77.0.1   lynx-coordinator (control on 10.77.0.1, API on the
#                      namespace's loopback, a cluster token, lease 1.5 s)
#   fe     10.77.0.2   lynx-frontend, and an agent with 1 CPU accelerator
#                      (same host and network namespace as the frontend)
#   client 10.77.0.3   sockperf
#   h1..h4 10.77.0.11-14  an agent each, 2 CPU accelerators
#
# Every agent runs with its default transport (auto): each region is
# served over tcp and is a shared-memory file too. The namespaces share
# /dev/shm, so the files of h1..h4 open in fe as well: only the identity
# (host and network namespace) tells the frontend which are its own.
#
# 9 accelerators; one sockperf-echo service, placement "all", on UDP 9000 of
# the frontend's 10.77 address, created through the API.
#
#  1. The descriptors advertised: every mqueue offers tcp and shm
#     (/v1/mqueues .transports); those of h1..h4 are reached over tcp, at
#     their 10.77 address, those of the frontend's host over shm
#     (/v1/mqueues .transport, as the frontend reports, and its log; the
#     tcp locator from the API when it lists one, else from the agent's
#     log).
#  2. sockperf ping-pong from client, one flow then 3 flows at once: none
#     dropped, duplicated or out of order; every one of the 9 accelerators'
#     `requests` grows; no request lost or expired, no lease expired.
#  3. Every process of h2 is killed with SIGKILL: the coordinator marks h2
#     down (one lease expiry) and its accelerators leave the frontend's
#     dispatch; sockperf again: none lost, and the 7 others serve.
#  4. h2's agent starts again with the same node id: h2 is ready with a new
#     epoch, back in dispatch, and its accelerators' `requests` grow under
#     new traffic; sockperf none lost.
#
# usage: scaleout_failover.sh [BIN_DIR]   (ctest passes build/bin; root)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# assertions and sockperf report parsing of the integration tests
# shellcheck source-path=SCRIPTDIR source=../integration/lib.sh
source "$HERE/../integration/lib.sh" "$@"
set -e
# shellcheck source-path=SCRIPTDIR source=netns.sh
source "$HERE/netns.sh"

IT_NAME=multihost_scaleout_failover
mh_begin "$IT_NAME" 160

COORD_PORT=7700
API_PORT=7780
METRICS_PORT=7790
UDP_PORT=9000
LEASE_MS=${LEASE_MS:-1500}
HOSTS=(h1 h2 h3 h4)
TOKEN=$MH_DIR/token
head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TOKEN"
echo >>"$TOKEN"
chmod 600 "$TOKEN"

declare -A NODE=() ALOG=()

# ---- helpers ------------------------------------------------------------------

step() { log "==== $* ($((($(mh_now_ms) - T0) / 1000)) s)"; }

# ctl ARG...: lynxctl inside coord (the API listens on its loopback).
ctl() {
  mh_exec coord "$BIN/lynxctl" --api "http://127.0.0.1:$API_PORT" --token-file "$TOKEN" "$@"
}
# api_get PATH: the API's JSON answer (must be 200).
api_get() {
  mh_exec coord curl -sf --max-time 5 "http://127.0.0.1:$API_PORT$1"
}
# fe_scrape: the frontend's /metrics.
fe_scrape() {
  mh_exec fe curl -sf --max-time 5 "http://127.0.0.1:$METRICS_PORT/metrics"
}
# shellcheck disable=SC2317 # called by netns.sh's cleanup
on_fail() {
  fe_scrape 2>/dev/null | grep -v -e '^#' -e ' 0$' >"$MH_DIR/metrics-at-failure.txt"
  for p in nodes accelerators mqueues services frontends; do
    api_get "/v1/$p" >"$MH_DIR/api-$p-at-failure.json" 2>/dev/null
  done
}
# shellcheck disable=SC2034 # read by netns.sh's cleanup
MH_ON_FAIL=on_fail

# fe_accels: "node/accel" of every accelerator in the frontend's dispatch
# (its per-mqueue series), one a line, sorted.
fe_accels() {
  local text
  text=$(fe_scrape) || return 1
  sed -n 's/^lynx_mqueue_dispatched_total{.*node="\([^"]*\)",.*accel="\([0-9]*\)".*/\1\/\2/p' \
    <<<"$text" | sort -u
}
# wait_fe_accels N TIMEOUT_S: until the frontend has N accelerators in dispatch.
wait_fe_accels() {
  local end=$(($(mh_now_ms) + $2 * 1000)) n
  for (( ; ; )); do
    n=$(fe_accels | grep -c .) || n=0
    ((n == $1)) && { log "ok: the frontend has $n accelerators in dispatch"; return 0; }
    (($(mh_now_ms) < end)) ||
      fail "the frontend has $n accelerators in dispatch after ${2}s, want $1: $(fe_accels | tr '\n' ' ')"
    sleep 0.1
  done
}

# node_state NODE: its state in /v1/nodes ("" when not listed).
node_state() {
  api_get /v1/nodes 2>/dev/null | jq -r --arg n "$1" '.items[] | select(.id == $n) | .state' 2>/dev/null || true
}
# wait_node_state NODE STATE TIMEOUT_MS: sets NODE_STATE (the last state
# seen); 1 on timeout.
wait_node_state() {
  local t0 end
  t0=$(mh_now_ms)
  end=$((t0 + $3))
  for (( ; ; )); do
    NODE_STATE=$(node_state "$1")
    [[ $NODE_STATE == "$2" ]] && return 0
    (($(mh_now_ms) < end)) || return 1
    sleep 0.05
  done
}

# accel_requests: "id requests" of every accelerator.
accel_requests() {
  api_get /v1/accelerators | jq -r '.items[] | "\(.id) \(.requests)"'
}

# pingpong NAME SECONDS: sockperf ping-pong from client to the frontend;
# every message answered, none duplicated or out of order.
pingpong() { mh_pingpong "$1" client "$FE_IP" "$UDP_PORT" "$2"; }

# flows NAME SECONDS N: N sockperf ping-pong clients at once (N flows, each
# with one request in flight, so the dispatcher spreads every flow over the
# accelerators), each checked like pingpong. Ping-pong blocks in recvfrom,
# so the clients leave the 2 cores to the daemons.
flows() {
  local name=$1 t=$2 n=$3 i rc
  local -a pids=()
  log "$n x sockperf ping-pong -i $FE_IP -p $UDP_PORT -m 64 -t $t at once (from client)"
  for ((i = 1; i <= n; i++)); do
    mh_exec client timeout -k 3 $((40 * MH_TS)) sockperf ping-pong -i "$FE_IP" -p "$UDP_PORT" \
      -m 64 -t "$t" >"$MH_DIR/sockperf-$name-$i.out" 2>&1 </dev/null &
    pids+=("$!")
  done
  for ((i = 1; i <= n; i++)); do
    rc=0
    wait "${pids[i - 1]}" || rc=$?
    ((rc == 0)) || { cat "$MH_DIR/sockperf-$name-$i.out"; fail "sockperf ping-pong #$i exited $rc"; }
  done
  for ((i = 1; i <= n; i++)); do check_sockperf "$MH_DIR/sockperf-$name-$i.out"; done
}

# coord_metric NAME: a sample of the coordinator's /metrics.
coord_metric() {
  mh_exec coord curl -sf --max-time 5 "http://127.0.0.1:$API_PORT/metrics" |
    awk -v n="$1" '$1 == n { print $2; found = 1 } END { exit !found }'
}
# expiries_check WANT WHAT: the coordinator expired WANT leases so far (a
# healthy agent that misses its lease under load would drop the requests in
# flight on it).
expiries_check() {
  local v
  v=$(coord_metric lynx_coordinator_lease_expiries_total) ||
    fail "no lynx_coordinator_lease_expiries_total on the coordinator"
  assert_eq "$v" "$1" "$2: leases expired (coordinator)"
}

# fe_metric NAME [LABEL_PART]: sum of the frontend's samples of NAME whose
# labels contain LABEL_PART.
fe_metric() {
  fe_scrape | awk -v n="$1" -v l="${2:-}" '
    $1 ~ /^#/ { next }
    { name = $1; sub(/\{.*/, "", name) }
    name == n && index($1, l) { s += $2; found = 1 }
    END { if (!found) exit 1; printf "%.0f\n", s }'
}
# lost_check WHAT: the frontend counted no request lost or expired.
lost_check() {
  local v
  v=$(fe_metric lynx_frontend_dropped_total 'reason="lost"') || v=0
  assert_eq "$v" 0 "$1: frontend dropped_total{reason=\"lost\"}"
  v=$(fe_metric lynx_frontend_dropped_total 'reason="expired"') || v=0
  assert_eq "$v" 0 "$1: frontend dropped_total{reason=\"expired\"}"
}

# start_host_agent HOST: the agent of HOST (2 accelerators, transport
# auto: its frontend is elsewhere, so tcp).
start_host_agent() {
  local h=$1
  mh_spawn "$h" "agent-$h" "$BIN/lynx-agent" --coordinator "$COORD_IP:$COORD_PORT" \
    --node-id "${NODE[$h]}" --cpu-accels 2 --token-file "$TOKEN"
  ALOG[$h]=$MH_LOG
  mh_wait_log "$MH_LOG" "registered with coordinator" 10 1 "$MH_PID"
}

# ---- set-up -------------------------------------------------------------------
step "set-up: 7 hosts on one bridge"
mh_host coord 10.77.0.1
mh_host fe 10.77.0.2
mh_host client 10.77.0.3
for i in 1 2 3 4; do
  mh_host "h$i" "10.77.0.1$i"
  NODE[h$i]=$(mh_node_id "h$i")
done
NODE[fe]=$(mh_node_id local)
COORD_IP=$(mh_ip coord)
FE_IP=$(mh_ip fe)
for h in fe client "${HOSTS[@]}"; do mh_wait_reachable "$h" coord; done
mh_wait_reachable client fe

step "coordinator in coord, agents in h1..h4 and fe, frontend in fe"
mh_spawn coord coordinator "$BIN/lynx-coordinator" --listen "$COORD_IP:$COORD_PORT" \
  --http "127.0.0.1:$API_PORT" --state-dir "$MH_DIR/state" --lease-ms "$LEASE_MS" \
  --token-file "$TOKEN"
COORD_PID=$MH_PID
mh_wait_log "$MH_LOG" "serving control on" 10 1 "$COORD_PID"
end=$(($(mh_now_ms) + 5000))
until api_get /readyz >/dev/null 2>&1; do
  mh_alive "$COORD_PID" || fail "the coordinator exited before it was ready"
  (($(mh_now_ms) < end)) || fail "the coordinator's /readyz is not 200 within 5 s"
  sleep 0.05
done
for h in "${HOSTS[@]}"; do start_host_agent "$h"; done
mh_spawn fe agent-local "$BIN/lynx-agent" --coordinator "$COORD_IP:$COORD_PORT" \
  --node-id "${NODE[fe]}" --cpu-accels 1 --token-file "$TOKEN"
ALOG[fe]=$MH_LOG
mh_wait_log "$MH_LOG" "registered with coordinator" 10 1 "$MH_PID"
mh_spawn fe frontend "$BIN/lynx-frontend" --coordinator "$COORD_IP:$COORD_PORT" \
  --frontend-id "mh${MH_ID}fe" --bind "$FE_IP" --metrics "127.0.0.1:$METRICS_PORT" \
  --token-file "$TOKEN"
FE_PID=$MH_PID FE_LOG=$MH_LOG
mh_wait_log "$FE_LOG" " applied" 10 1 "$FE_PID"
for h in fe "${HOSTS[@]}"; do
  st=$(node_state "${NODE[$h]}")
  [[ $st == ready ]] || fail "node ${NODE[$h]} ($h) is '$st' after registration, want ready"
done
log "ok: 5 nodes ready"

step "service echo (sockperf-echo, placement all) on UDP $FE_IP:$UDP_PORT"
ctl service create --name echo --port "$UDP_PORT" --app sockperf-echo --placement all \
  >"$MH_DIR/service-create.out" 2>&1 ||
  { cat "$MH_DIR/service-create.out"; fail "lynxctl service create failed"; }
mh_wait_log "$FE_LOG" "serving service echo" 10 1 "$FE_PID"
wait_fe_accels 9 10
assert_eq "$(api_get /v1/services/echo | jq -r .instances.wanted)" 9 "service echo: instances wanted"
assert_eq "$(api_get /v1/services/echo | jq -r .instances.ready)" 9 "service echo: instances ready"
assert_eq "$(api_get /v1/accelerators | jq '.items | length')" 9 "accelerators listed by /v1/accelerators"

# ---- 1. descriptors -----------------------------------------------------------
step "1. descriptors: tcp at the hosts' 10.77 addresses, shm on the frontend's host"
# .transport is what the frontend reports it uses (its status reports,
# about every second): until it has, the descriptor's
end=$(($(mh_now_ms) + 5000))
until api_get /v1/mqueues >"$MH_DIR/mqueues.json" &&
  [[ $(jq -r --arg n "${NODE[fe]}" '[.items[] | select(.node == $n) | .transport] | unique | join(",")' "$MH_DIR/mqueues.json") == shm ]]; do
  (($(mh_now_ms) < end)) || break
  sleep 0.1
done
api_get /v1/nodes >"$MH_DIR/nodes.json"
has_locator=$(jq '[.items[] | has("locator")] | any' "$MH_DIR/mqueues.json")
for h in "${HOSTS[@]}" fe; do
  n=${NODE[$h]}
  if [[ $h == fe ]]; then want=shm; else want=tcp; fi
  ts=$(jq -r --arg n "$n" '[.items[] | select(.node == $n) | .transport] | unique | join(",")' "$MH_DIR/mqueues.json")
  [[ $ts == "$want" ]] || fail "mqueues of $h ($n) are reached over '$ts', want $want"
  offer=$(jq -r --arg n "$n" '[.items[] | select(.node == $n) | .transports | join("+")] | unique | join(",")' "$MH_DIR/mqueues.json")
  [[ $offer == tcp+shm ]] || fail "the mqueues of $h ($n) offer '$offer', want tcp+shm"
  nmq=$(jq --arg n "$n" '[.items[] | select(.node == $n)] | length' "$MH_DIR/mqueues.json")
  # the frontend's log says the same, with why
  if [[ $want == shm ]]; then
    pat="accelerator $n/0 (instance [0-9]*) in dispatch over shm (on its agent's host and network namespace; offered tcp too)"
  else
    pat="accelerator $n/[01] (instance [0-9]*) in dispatch over tcp:"
  fi
  grep -q "$pat" "$FE_LOG" || fail "the frontend's log does not say: $pat"
  log "ok: $h: $nmq mqueues, offered $offer, reached over $ts"
  addr=$(jq -r --arg n "$n" '.items[] | select(.id == $n) | .address' "$MH_DIR/nodes.json")
  [[ $addr == "$(mh_ip "$h")":* ]] ||
    fail "node $n ($h) has control address '$addr', want $(mh_ip "$h"):PORT"
  log "ok: $h: control connection from $addr"
  [[ $want == tcp ]] || continue
  if [[ $has_locator == true ]]; then
    locs=$(jq -r --arg n "$n" '[.items[] | select(.node == $n) | .locator] | unique | join(" ")' "$MH_DIR/mqueues.json")
    src="/v1/mqueues"
    [[ -n $locs ]] || fail "$h: no tcp locator in $src"
    for l in $locs; do
      [[ $l == "$(mh_ip "$h")":[0-9]* ]] ||
        fail "$h advertises tcp locator '$l' ($src), want $(mh_ip "$h"):PORT"
    done
  else
    # The API lists no locator (yet): the frontend must be connected, over
    # tcp, to the agent's data port at the host's 10.77 address, which it
    # can only have taken from the advertised descriptor.
    port=$(sed -n 's/.*; transport tcp on [^;]*:\([0-9][0-9]*\);.*/\1/p' "${ALOG[$h]}" | tail -n 1)
    is_uint "$port" || fail "$h: no 'transport tcp on ADDR:PORT' in the agent's log"
    locs="$(mh_ip "$h"):$port"
    src="the frontend's established connections (ss in fe; /v1/mqueues lists no locator)"
    mh_exec fe ss -tnpH state established >"$MH_DIR/ss-fe.txt"
    nconn=$(grep -F " $locs " "$MH_DIR/ss-fe.txt" | grep -cF "pid=$FE_PID,") || nconn=0
    assert_ge "$nconn" 1 "$h: frontend data connections to $locs"
  fi
  log "ok: $h: tcp locator(s) $locs ($src)"
done

# ---- 2. every accelerator serves ------------------------------------------------
step "2. traffic from client: no loss, every one of the 9 accelerators serves"
declare -a base=()
while read -r id v; do base+=("$id=$v"); done < <(accel_requests)
assert_eq "${#base[@]}" 9 "accelerators with a request counter"
pingpong all 2
flows all 2 3
wait_requests_grow 5 "${base[@]}" || fail "not every accelerator got traffic"
lost_check "after traffic on 9 accelerators"
expiries_check 0 "after traffic on 9 accelerators"

# ---- 3. host h2 dies ------------------------------------------------------------
VICTIM=h2
VN=${NODE[$VICTIM]}
step "3. kill -9 of every process of host $VICTIM ($VN)"
old_epoch=$(api_get "/v1/nodes/$VN" | jq -r .epoch)
leaves0=$(grep -c 'leaves dispatch' "$FE_LOG") || leaves0=0
t_kill=$(mh_now_ms)
mh_kill_host "$VICTIM"
limit=$((LEASE_MS + 2000))
if wait_node_state "$VN" down "$limit"; then
  log "ok: $VN is down $(($(mh_now_ms) - t_kill)) ms after the kill (lease $LEASE_MS ms)"
else
  log "note: $VN not down within $limit ms of the kill (lease $LEASE_MS ms; state '$NODE_STATE')"
  wait_node_state "$VN" down 10000 || fail "$VN never went down (state '$NODE_STATE')"
fi
for (( ; ; )); do
  fe_accels >"$MH_DIR/fe-accels.txt" || fail "cannot scrape the frontend"
  grep -q "^$VN/" "$MH_DIR/fe-accels.txt" || break
  (($(mh_now_ms) - t_kill < 10000)) ||
    fail "$VN still in the frontend's dispatch 10 s after the kill: $(tr '\n' ' ' <"$MH_DIR/fe-accels.txt")"
  sleep 0.05
done
log "ok: $VN out of the frontend's dispatch $(($(mh_now_ms) - t_kill)) ms after the kill"
assert_eq "$(fe_accels | grep -c .)" 7 "accelerators left in the frontend's dispatch"
assert_eq "$(api_get /v1/mqueues | jq --arg n "$VN" '[.items[] | select(.node == $n)] | length')" 0 \
  "/v1/mqueues entries of $VN"
assert_ge "$(grep -c 'leaves dispatch' "$FE_LOG")" $((leaves0 + 2)) \
  "frontend log: accelerators that left dispatch (2 of $VN)"
declare -a base=()
while read -r id v; do
  [[ $id == "$VN"/* ]] || base+=("$id=$v")
done < <(accel_requests)
assert_eq "${#base[@]}" 7 "accelerators of the hosts alive"
pingpong after-kill 2
flows after-kill 2 3
wait_requests_grow 5 "${base[@]}" || fail "not every accelerator got traffic"
lost_check "after the kill of $VICTIM (no traffic was in flight)"
expiries_check 1 "after the kill of $VICTIM"
assert_eq "$(node_state "$VN" | grep -c '^down$')" 1 "$VN stays down"

# ---- 4. h2 rejoins ----------------------------------------------------------------
step "4. the agent of $VICTIM starts again (node id $VN)"
start_host_agent "$VICTIM"
wait_node_state "$VN" ready 5000 || fail "$VN not ready after its agent restarted (state '$NODE_STATE')"
log "ok: $VN ready again"
new_epoch=$(api_get "/v1/nodes/$VN" | jq -r .epoch)
assert_gt "$new_epoch" "$old_epoch" "$VN's epoch after the restart"
wait_fe_accels 9 10
ts=$(api_get /v1/mqueues | jq -r --arg n "$VN" '[.items[] | select(.node == $n) | .transport] | unique | join(",")')
[[ $ts == tcp ]] || fail "mqueues of the rejoined $VN advertise transport '$ts', want tcp"
declare -a base=()
while read -r id v; do
  [[ $id == "$VN"/* ]] && base+=("$id=$v")
done < <(accel_requests)
assert_eq "${#base[@]}" 2 "accelerators of the rejoined $VN"
pingpong after-rejoin 2
flows after-rejoin 2 3
wait_requests_grow 5 "${base[@]}" || fail "not every accelerator got traffic"
lost_check "after $VICTIM rejoined"
expiries_check 1 "after $VICTIM rejoined"

step "done: every check passed in $((($(mh_now_ms) - T0) / 1000)) s"
it_done
