#!/usr/bin/env bash
# cluster: the control plane with real processes on loopback: one
# coordinator (lease 1 s), three agents with two CPU accelerators each, one
# frontend, and a sockperf-echo service with placement "all" created through
# the JSON API. `lynxctl --json watch` records every node table on the side.
#
#  1. sockperf ping-pong is answered (none dropped, duplicated or out of
#     order) and every one of the 6 accelerators' `requests` grows
#     (/v1/accelerators, from the agents' heartbeats).
#  2. kill -9 of one agent: within lease + 1 s its node is `down` and its
#     accelerators are out of the frontend's dispatch (their mqueue series
#     leave /metrics, /v1/mqueues drops them); sockperf afterwards sees no
#     loss.
#  3. The agent restarts with the same node id: it removes the dead agent's
#     regions, the node is `ready` again with a new epoch, and its
#     accelerators' `requests` grow again.
#  4. Drain, while sockperf under-load (5000 msg/s, every message answered)
#     runs, of the node that carries the load: `draining`, then `drained`,
#     its instances stopped; sockperf sees 0 dropped and the frontend counts
#     no drop (lost, expired or any other). Undrain: `ready` and served again.
#  5. kill -9 of the coordinator under load: traffic goes on (0 dropped);
#     restarted on the same state dir, all 3 nodes come back `ready`, the
#     service is listed (from the state dir) with every instance adopted (no
#     instance restarted, nothing left the frontend's dispatch), and sockperf
#     is answered.
#  6. SIGTERM: every process exits 0; no /dev/shm/lynx-<node>-* file is left.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init cluster
it_require sockperf curl timeout
it_require_coord
pick_ports COORD_PORT API_PORT METRICS_PORT UDP_PORT
LEASE_MS=1000
node_ids N1 N2 N3
NODES=("$N1" "$N2" "$N3")
declare -A APID=() ALOG=()

# ---- helpers ------------------------------------------------------------------

# pingpong NAME [SECONDS]: sockperf ping-pong that must get every answer.

# underload_start NAME SECONDS: sockperf under-load in the background (every
# message a ping); sets SP_PID and SP_OUT.
# (5000 msg/s divided by the time scale: loss and order are checked, not
# speed)
UL_MPS=$((5000 / TS))
underload_start() {
  SP_OUT=$IT_DIR/underload-$1.out
  UL_FF0=$(metric lynx_frontend_dropped_total 'reason="flow_full"') || fail "no flow_full drop counter"
  log "sockperf under-load -t $2 --mps $UL_MPS --reply-every 1 (background)"
  timeout -k 3 "$(ts_s 40)" sockperf under-load -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t "$2" \
    --mps "$UL_MPS" --reply-every 1 --buffer-size 4194304 >"$SP_OUT" 2>&1 </dev/null &
  SP_PID=$!
  track "$SP_PID" "sockperf-under-load-$1"
}
# underload_check [noloss]: waits for the background sockperf, checks its
# report: every answer, none dropped, duplicated or out of order. With
# noloss, out-of-order answers are only reported: a drain moves a client flow
# that has requests in flight to another mqueue, so its later answers may
# overtake the earlier ones (docs/design.md, "Flow order"). An accelerator
# the machine stalls long enough for the flow's ring (256 slots, 50 ms at
# 5000/s) to fill makes the frontend drop the excess as flow_full rather
# than reorder: losses up to those counted drops are the overload's, not
# the failure's, and are logged; any other loss fails.
underload_check() {
  local what ff
  wait_exit "$SP_PID" 20 || fail "sockperf under-load did not finish"
  ((WAIT_RC == 0)) || { cat "$SP_OUT"; fail "sockperf under-load exited $WAIT_RC"; }
  what="sockperf ($(basename "$SP_OUT"))"
  sockperf_stats "$SP_OUT" || return 1
  ff=$(($(metric lynx_frontend_dropped_total 'reason="flow_full"') - UL_FF0))
  assert_gt "$SP_VRCVD" 0 "$what: messages received in the valid duration"
  ((ff == 0)) ||
    log "note: an accelerator fell behind: the frontend dropped $ff requests as flow_full (its ring was full)"
  assert_le "$SP_DROP" "$ff" "$what: dropped messages (at most those dropped as flow_full)"
  assert_eq "$SP_DUP" 0 "$what: duplicated messages"
  if [[ ${1:-} != noloss ]]; then
    assert_eq "$SP_OOO" 0 "$what: out-of-order messages"
    return
  fi
  log "$what: $SP_OOO out-of-order messages (a drain may reorder a busy flow)"
}

# fe_accels: "node/accel" of every accelerator the frontend has in dispatch
# (its per-mqueue series), one a line, sorted.
fe_accels() {
  local text
  text=$(curl -sf --max-time 5 "http://127.0.0.1:$METRICS_PORT/metrics") || return 1
  sed -n 's/^lynx_mqueue_dispatched_total{.*node="\([^"]*\)",.*accel="\([0-9]*\)".*/\1\/\2/p' \
    <<<"$text" | sort -u
}
# wait_fe_accels N TIMEOUT_S: until the frontend has N accelerators in dispatch.
wait_fe_accels() {
  local end=$(($(now_ms) + $2 * 1000)) n
  for (( ; ; )); do
    n=$(fe_accels | grep -c .)
    ((n == $1)) && { log "ok: frontend has $n accelerators in dispatch"; return 0; }
    (($(now_ms) < end)) ||
      fail "frontend has $n accelerators in dispatch after ${2}s, want $1: $(fe_accels | tr '\n' ' ')"
    sleep 0.05
  done
}

# requests_of ID: the accelerator's `requests` from /v1/accelerators.
requests_of() {
  ctl accelerators --json | jq -r --arg a "$1" '.items[] | select(.id == $a) | .requests'
}

# drops_check WHAT: the frontend counted no drop of any reason (lost and
# expired named on their own) but flow_full, an accelerator the machine
# stalled (underload_check), which is logged.
drops_check() {
  local snap=$IT_DIR/metrics-$1.txt v ff
  scrape "$snap"
  ff=$(METRICS_FROM=$snap metric lynx_frontend_dropped_total 'reason="flow_full"') || fail "no dropped_total{flow_full}"
  ((ff == 0)) || log "note: $1: $ff requests dropped as flow_full so far (an accelerator fell behind)"
  v=$(METRICS_FROM=$snap metric lynx_frontend_dropped_total 'reason="lost"') || fail "no dropped_total{lost}"
  assert_eq "$v" 0 "$1: frontend dropped_total{reason=\"lost\"}"
  v=$(METRICS_FROM=$snap metric lynx_frontend_dropped_total 'reason="expired"') || fail "no dropped_total{expired}"
  assert_eq "$v" 0 "$1: frontend dropped_total{reason=\"expired\"}"
  v=$(METRICS_FROM=$snap metric lynx_frontend_dropped_total) || fail "no dropped_total"
  assert_eq $((v - ff)) 0 "$1: frontend dropped_total, every reason but flow_full" ||
    grep '^lynx_frontend_dropped_total' "$snap" | grep -v ' 0$' >&2
}

# node_epoch NODE
node_epoch() { api_json "/v1/nodes/$1" .epoch; }

# history NODE: the node's states as `lynxctl --json watch` saw them, one
# word per change ("absent" while the node is not listed).
history() {
  jq -r --arg n "$1" '[.items[] | select(.id == $n) | .state][0] // "absent"' \
    "$IT_DIR/watch.jsonl" 2>/dev/null | uniq | tr '\n' ' '
}

# ---- set-up -------------------------------------------------------------------
log "== set-up: coordinator, 3 agents, frontend, service echo (placement all)"
start_coordinator --lease-ms "$LEASE_MS"
C1=$COORD_PID
for n in "${NODES[@]}"; do
  start_node_agent "$n"
  APID[$n]=$AGENT_PID ALOG[$n]=$AGENT_LOG
done
start_coord_frontend
FE=$FRONTEND_PID FE_LOG=$FRONTEND_LOG
# (lynxctl itself, not the ctl function: $! must be lynxctl's pid)
"$LYNX_BIN_DIR/lynxctl" --api "http://127.0.0.1:$API_PORT" --json watch \
  >"$IT_DIR/watch.jsonl" 2>"$IT_DIR/watch.err" </dev/null &
WATCH=$!
track "$WATCH" lynxctl-watch

for n in "${NODES[@]}"; do
  assert_eq "$(node_state "$n" | grep -c '^ready$')" 1 "node $n is ready after registration"
done
api POST /v1/services -d "{\"name\":\"echo\",\"port\":$UDP_PORT,\"app\":\"sockperf-echo\",\"placement\":\"all\"}"
[[ $API_STATUS == 201 ]] || fail "POST /v1/services: HTTP $API_STATUS: $(cat "$API_BODY")"
assert_eq "$(jq -r '.port' "$API_BODY")" "$UDP_PORT" "service created: port in the answer"
grep -qi '^location: /v1/services/echo' "$API_HEADERS" ||
  it_check_failed "201 without 'Location: /v1/services/echo'"
wait_log "$FE_LOG" "serving service echo" 5 1 "$FE"
wait_fe_accels 6 5
wanted=$(api_json /v1/services/echo .instances.wanted)
assert_eq "$wanted" 6 "service echo: instances wanted"
ready=$(api_json /v1/services/echo .instances.ready)
assert_eq "$ready" 6 "service echo: instances ready"

# ---- 1. served by every accelerator -----------------------------------------
log "== 1. ping-pong: every accelerator's requests grow"
declare -a base=()
while read -r id v; do base+=("$id=$v"); done < <(accel_requests)
assert_eq "${#base[@]}" 6 "accelerators listed by /v1/accelerators"
pingpong all
wait_requests_grow 3 "${base[@]}"
drops_check after-pingpong

# ---- 2. kill -9 of an agent ---------------------------------------------------
VICTIM=$N2
log "== 2. kill -9 of the agent of $VICTIM"
old_epoch=$(node_epoch "$VICTIM")
exp0=$(METRICS_PORT=$API_PORT metric lynx_coordinator_lease_expiries_total) ||
  fail "no lynx_coordinator_lease_expiries_total on the coordinator"
dead_pid=${APID[$VICTIM]}
t_kill=$(now_ms)
kill9 "$dead_pid"
limit=$((LEASE_MS + $(ts_ms 1000))) # the lease, and 1 s (scaled) of slack
if wait_node_state "$VICTIM" down "$limit"; then
  DOWN_MS=$(($(now_ms) - t_kill))
  log "ok: $VICTIM is down ${DOWN_MS} ms after kill -9 (lease ${LEASE_MS} ms, limit ${limit} ms)"
else
  it_check_failed "$VICTIM not down within ${limit} ms of kill -9 (state '$NODE_STATE')"
  wait_node_state "$VICTIM" down 5000 || fail "$VICTIM never went down (state '$NODE_STATE')"
  DOWN_MS=$(($(now_ms) - t_kill))
  log "$VICTIM went down after ${DOWN_MS} ms"
fi
# out of the frontend's dispatch: its mqueue series leave /metrics
for (( ; ; )); do
  fe_accels >"$IT_DIR/fe-accels.txt" || fail "cannot scrape the frontend"
  grep -q "^$VICTIM/" "$IT_DIR/fe-accels.txt" || break
  (($(now_ms) - t_kill < $(ts_ms 5000))) || fail "$VICTIM still in the frontend's dispatch $(ts_s 5) s after kill -9"
  sleep 0.02
done
OUT_MS=$(($(now_ms) - t_kill))
log "$VICTIM out of the frontend's dispatch ${OUT_MS} ms after kill -9"
assert_le "$OUT_MS" "$limit" "ms from kill -9 to out of dispatch (lease + $(ts_s 1) s)"
assert_eq "$(fe_accels | grep -c .)" 4 "accelerators left in the frontend's dispatch"
assert_eq "$(grep -cE "accelerator $VICTIM/[0-9]+ \(instance [0-9]+\) leaves dispatch" "$FE_LOG")" 2 \
  "frontend log: $VICTIM's 2 accelerators left dispatch"
assert_eq "$(api_json /v1/mqueues "[.items[] | select(.node == \"$VICTIM\")] | length")" 0 \
  "/v1/mqueues entries of $VICTIM"
assert_eq "$(api_json /v1/services/echo .instances.ready)" 4 "service echo: instances ready"
exp1=$(METRICS_PORT=$API_PORT metric lynx_coordinator_lease_expiries_total)
assert_eq "$exp1" $((exp0 + 1)) "coordinator lease_expiries_total"
pingpong after-kill9
drops_check after-kill9

# ---- 3. the agent comes back ---------------------------------------------------
log "== 3. the agent of $VICTIM restarts with the same node id"
start_node_agent "$VICTIM"
APID[$VICTIM]=$AGENT_PID ALOG[$VICTIM]=$AGENT_LOG
# an agent removes the regions of dead agents when it starts (this one, or
# any other agent starting on the machine at the same time)
if [[ -z $(node_shm "$VICTIM" "$dead_pid") ]]; then
  log "ok: the killed agent's regions are gone$(grep -q "removed stale region /lynx-$VICTIM-$dead_pid-" "$AGENT_LOG" && echo ' (removed by the new agent)')"
else
  it_check_failed "regions of the killed agent left after a new agent started: $(node_shm "$VICTIM" "$dead_pid")"
fi
wait_node_state "$VICTIM" ready 3000 || it_check_failed "$VICTIM not ready again (state '$NODE_STATE')"
log "$VICTIM ready again (${WAITED_MS} ms after the agent registered)"
new_epoch=$(node_epoch "$VICTIM")
assert_gt "$new_epoch" "$old_epoch" "$VICTIM's epoch after the restart"
wait_fe_accels 6 5
declare -a base=()
for a in 0 1; do base+=("$VICTIM/$a=$(requests_of "$VICTIM/$a")"); done
pingpong after-rejoin
wait_requests_grow 3 "${base[@]}"
drops_check after-rejoin

# ---- 4. drain under load --------------------------------------------------------
log "== 4. drain under sockperf under-load"
underload_start drain 5
wait_metric lynx_frontend_responded_total "" \
  $(($(metric lynx_frontend_responded_total) + 1000)) 10 # load is flowing
# the node that carries the load now: the one whose mqueues move most
scrape "$IT_DIR/metrics-drain-a.txt"
sleep 0.3
scrape "$IT_DIR/metrics-drain-b.txt"
DRAIN=$(
  for n in "${NODES[@]}"; do
    a=$(METRICS_FROM=$IT_DIR/metrics-drain-a.txt metric lynx_mqueue_dispatched_total "node=\"$n\"" 2>/dev/null || echo 0)
    b=$(METRICS_FROM=$IT_DIR/metrics-drain-b.txt metric lynx_mqueue_dispatched_total "node=\"$n\"" 2>/dev/null || echo 0)
    echo "$((b - a)) $n"
  done | sort -rn | head -n 1
)
log "load per node over 300 ms (dispatched, node): $DRAIN"
DRAIN=${DRAIN#* }
is_alive "$SP_PID" || fail "sockperf under-load ended before the drain"
t_drain=$(now_ms)
ctl --json node drain "$DRAIN" >"$IT_DIR/drain.json" 2>"$IT_DIR/drain.err" ||
  fail "lynxctl node drain $DRAIN failed: $(cat "$IT_DIR/drain.err")"
st=$(jq -r .state "$IT_DIR/drain.json")
[[ $st == draining ]] || it_check_failed "drain of $DRAIN answered state '$st', want draining"
log "ok: drain of $DRAIN answered '$st'"
if wait_node_state "$DRAIN" drained 5000; then
  log "ok: $DRAIN drained $(($(now_ms) - t_drain)) ms after the drain call"
else
  fail "$DRAIN not drained 5 s after the drain call (state '$NODE_STATE')"
fi
is_alive "$SP_PID" || log "note: sockperf ended before $DRAIN was drained"
wait_log "${ALOG[$DRAIN]}" "stopped:" 5 2 "${APID[$DRAIN]}" # its 2 instances
[[ -z $(node_shm "$DRAIN") ]] ||
  it_check_failed "drained node $DRAIN still has regions: $(node_shm "$DRAIN")"
underload_check noloss
fe_accels >"$IT_DIR/fe-accels.txt"
assert_eq "$(grep -c "^$DRAIN/" "$IT_DIR/fe-accels.txt")" 0 "$DRAIN's accelerators in the frontend's dispatch"
assert_eq "$(node_state "$DRAIN" | grep -c '^drained$')" 1 "$DRAIN stays drained"
drops_check after-drain

log "== 4b. undrain $DRAIN"
ctl --json node undrain "$DRAIN" >"$IT_DIR/undrain.json" 2>"$IT_DIR/undrain.err" ||
  fail "lynxctl node undrain $DRAIN failed: $(cat "$IT_DIR/undrain.err")"
assert_eq "$(jq -r .state "$IT_DIR/undrain.json" | grep -c '^ready$')" 1 "undrain answered state ready"
wait_node_state "$DRAIN" ready 3000 || it_check_failed "$DRAIN not ready after undrain"
# every transition, in order, from the coordinator's events (lynxctl watch
# below shows the node table at each change it wakes for: a drain that
# ends within one of its polls is seen drained, never draining)
ev=$(api_json '/v1/events?since=0&limit=1000' \
  '[.items[] | select(.subject == "'"$DRAIN"'" and (.kind | IN("node_draining", "node_drained", "node_undrained"))) | .kind] | join(" ")')
[[ " $ev " == *" node_draining node_drained node_undrained "* ]] ||
  it_check_failed "the coordinator's events of $DRAIN lack draining, drained, undrained in order: $ev"
wait_fe_accels 6 5
declare -a base=()
for a in 0 1; do base+=("$DRAIN/$a=$(requests_of "$DRAIN/$a")"); done
pingpong after-undrain
wait_requests_grow 3 "${base[@]}"

# ---- 5. kill -9 of the coordinator under load -------------------------------
log "== 5. kill -9 of the coordinator under load"
declare -A starts=()
for n in "${NODES[@]}"; do starts[$n]=$(grep -c '(echo, app ' "${ALOG[$n]}"); done
leaves0=$(grep -c 'leaves dispatch' "$FE_LOG")
applied0=$(grep -c ' applied' "$FE_LOG")
underload_start coord 6
wait_metric lynx_frontend_responded_total "" \
  $(($(metric lynx_frontend_responded_total) + 1000)) 10
kill9 "$C1"
t_ckill=$(now_ms)
r0=$(metric lynx_frontend_responded_total)
sleep 2 # (long enough for the agents' reconnect backoff to grow past the lease)
r1=$(metric lynx_frontend_responded_total)
assert_gt "$r1" $((r0 + UL_MPS)) "responses sent in the 2 s without a coordinator (at least half the offered $UL_MPS/s)"
assert_log "$FE_LOG" "no coordinator; serving the last table" "the frontend serves its last table"
for n in "${NODES[@]}"; do
  wait_log "${ALOG[$n]}" "lost the coordinator" 3 1 "${APID[$n]}"
done
start_coordinator --lease-ms "$LEASE_MS"
C2=$COORD_PID C2_LOG=$COORD_LOG
t_up=$(now_ms)
for n in "${NODES[@]}"; do
  wait_node_state "$n" ready 6000 || it_check_failed "$n not ready after the coordinator restart (state '$NODE_STATE')"
done
log "all 3 nodes ready $(($(now_ms) - t_up)) ms after the coordinator restarted ($(($(now_ms) - t_ckill)) ms after kill -9)"
assert_eq "$(api_json /v1/services '[.items[] | select(.name == "echo")] | length')" 1 \
  "service echo listed after the restart (from the state dir)"
assert_eq "$(api_json /v1/services/echo .port)" "$UDP_PORT" "service echo's port after the restart"
end=$(($(now_ms) + $(ts_ms 5000)))
until [[ $(api_json /v1/services/echo .instances.ready) == 6 ]]; do
  (($(now_ms) < end)) || { it_check_failed "service echo: $(api_json /v1/services/echo .instances.ready) instances ready 5 s after the restart, want 6"; break; }
  sleep 0.1
done
wait_log "$FE_LOG" " applied" 5 $((applied0 + 1)) "$FE" # the new coordinator's table
assert_eq "$(api_json /v1/frontends '[.items[] | select(.connected)] | length')" 1 "frontends connected"
underload_check noloss
for n in "${NODES[@]}"; do
  assert_eq "$(grep -c '(echo, app ' "${ALOG[$n]}")" "${starts[$n]}" \
    "$n: instances started (the restarted coordinator adopts the running ones)"
done
# the frontend keeps serving its last table until the restarted coordinator
# has heard from the agents: the service stays, no accelerator leaves
assert_eq "$(grep -c 'no longer served here' "$FE_LOG")" 0 \
  "times the frontend stopped serving the service"
assert_eq "$(grep -c 'leaves dispatch' "$FE_LOG")" "$leaves0" \
  "accelerators that left the frontend's dispatch over the coordinator restart" ||
  { grep 'leaves dispatch' "$FE_LOG" | tail -n +$((leaves0 + 1)) >&2
    grep -E 'registered|table' "$C2_LOG" | head -10 >&2; }
wait_fe_accels 6 2
pingpong after-coordinator-restart
drops_check after-coordinator-restart

# ---- 6. SIGTERM everything --------------------------------------------------------
log "== 6. SIGTERM: every process exits 0"
stop "$WATCH" 5
assert_eq "$WAIT_RC" 0 "lynxctl watch exit status on SIGTERM"
stop "$FE" 10
assert_eq "$WAIT_RC" 0 "frontend exit status on SIGTERM"
for n in "${NODES[@]}"; do
  stop "${APID[$n]}" 10
  assert_eq "$WAIT_RC" 0 "agent $n exit status on SIGTERM"
  assert_log "${ALOG[$n]}" "leaving the cluster" "agent $n left the cluster"
done
stop "$C2" 10
assert_eq "$WAIT_RC" 0 "coordinator exit status on SIGTERM"
for n in "${NODES[@]}"; do
  [[ -z $(node_shm "$n") ]] || it_check_failed "region files left: $(node_shm "$n")"
done
log "ok: no /dev/shm/lynx-<node>-* file left"

# ---- what the watch saw -----------------------------------------------------------
h=$(history "$VICTIM")
log "states of $VICTIM seen by lynxctl watch: $h"
[[ " $h" =~ \ ready\ (.*\ )?down\ (.*\ )?ready\  ]] ||
  it_check_failed "watch did not see $VICTIM go ready -> down -> ready: $h"
h=$(history "$DRAIN")
log "states of $DRAIN seen by lynxctl watch: $h"
[[ " $h" =~ \ ready\ (.*\ )?drained\ (.*\ )?ready\  ]] ||
  it_check_failed "watch did not see $DRAIN go ready -> (draining ->) drained -> ready: $h"
log "timings: down ${DOWN_MS} ms and out of dispatch ${OUT_MS} ms after kill -9 (lease ${LEASE_MS} ms)"
it_done
