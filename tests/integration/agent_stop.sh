#!/usr/bin/env bash
# agent_stop: an agent stopped with SIGTERM under a coordinator has its
# node drained before it exits, and stops anyway when the drain cannot
# finish (docs/design.md, "An agent stopped with SIGTERM or SIGINT drains
# first"). Coordinator (drain timeout and frontend timeout 60 s, longer
# than the test: only the agent's own limits end a drain that cannot
# finish), one frontend, a sockperf-echo service on the agent's one CPU
# accelerator. tests/faults/agent.sh checks the same drain under load
# (every request answered).
#
#  1. SIGTERM: the node drains to leave (an event says so), the agent
#     exits 0 once its instance is stopped, the node goes down (left).
#  2. A new agent for the node: ready, not drained (the drain was the
#     agent's, not an operator's intent: the state file has no drain), and
#     serves.
#  3. The frontend stopped (SIGSTOP), so the drain cannot finish: the
#     agent exits after its --stop-timeout-ms (1.5 s), saying so.
#  4. Again, with a long --stop-timeout-ms: the API shows the node
#     leaving and refuses to undrain it; a second SIGTERM stops it at once.
#  5. Again: the coordinator killed while the node drains, and started
#     again: the agent registers with it, asks it again for the drain (a
#     drain lives in the leader's memory only), and leaves drained, though
#     not before the frontend that holds its instance is back.
#  6. Again, the coordinator killed and not back: the agent stops once no
#     coordinator answered for a lease (1 s here; 2 s at most), well before
#     its --stop-timeout-ms (60 s).
#  7. Nothing to drain (no service, no instance): SIGTERM stops at once.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init agent_stop
it_require_coord
it_require sockperf
pick_ports COORD_PORT API_PORT METRICS_PORT UDP_PORT

# serves: until the service answers (the new agent's instance is in the
# frontend's table), 10 s at most.
serves() {
  local end=$(($(now_ms) + 10000))
  until "$LYNX_BIN_DIR/lynx-udp-probe" --port "$UDP_PORT" --timeout-ms 500 >/dev/null 2>&1; do
    (($(now_ms) < end)) || fail "the new agent's instance does not answer within 10 s"
  done
}

# new_agent STOP_TIMEOUT_MS: a new agent for N1 (A, A_LOG), serving.
new_agent() {
  start_node_agent "$N1" --cpu-accels 1 --stop-timeout-ms "$1"
  A=$AGENT_PID A_LOG=$AGENT_LOG
  serves
}

# stuck_drain: the frontend stopped (it reports nothing, so a drain cannot
# finish), SIGTERM to the agent; waits for the agent to say it drains.
# Sets T0 (the SIGTERM's time).
stuck_drain() {
  kill -STOP "$FE"
  T0=$(now_ms)
  kill -TERM "$A"
  wait_log "$A_LOG" "draining before stopping" 5 1 "$A"
}

# stopped_in PID LOG PATTERN MIN_MS MAX_MS T0: PID exits 0 between MIN_MS
# and MAX_MS after T0, its log saying PATTERN.
stopped_in() {
  local pid=$1 lg=$2 pat=$3 min=$4 max=$5 t0=$6 took
  wait_exit "$pid" $((max / 1000 + 5)) || fail "the agent did not exit"
  took=$(($(now_ms) - t0))
  assert_eq "$WAIT_RC" 0 "agent exit status"
  assert_ge "$took" "$min" "ms from SIGTERM to the agent's exit"
  # (MAX_MS is the bound at time scale 1: its slack above MIN_MS scales)
  assert_le "$took" $((min + (max - min) * TS)) "ms from SIGTERM to the agent's exit"
  assert_log "$lg" "$pat" "the agent says why it stopped"
}

start_coordinator --lease-ms 1000 --drain-timeout-ms 60000 --frontend-timeout-ms 60000
C=$COORD_PID
node_ids N1
start_node_agent "$N1" --cpu-accels 1
A=$AGENT_PID A_LOG=$AGENT_LOG
start_coord_frontend
FE=$FRONTEND_PID FE_LOG=$FRONTEND_LOG
serve_service echo "\"port\":$UDP_PORT,\"app\":\"sockperf-echo\",\"mqueues_per_accel\":2"
pingpong before

# ---- 1. SIGTERM drains, then the agent leaves ---------------------------------
log "== 1. SIGTERM: the node drains to leave, then the agent exits"
t0=$(now_ms)
kill -TERM "$A"
stopped_in "$A" "$A_LOG" "drained: every instance stopped; leaving" 0 5000 "$t0"
log "ok: the agent drained and exited $(($(now_ms) - t0)) ms after SIGTERM"
assert_log "$A_LOG" "draining before stopping" "the agent said it drains"
assert_log "$A_LOG" "leaving the cluster" "the agent left"
assert_log "$COORD_LOG" "node $N1 drains to leave" "the coordinator drained the node for its agent"
wait_node_state "$N1" down 5000 || fail "$N1 not down after its agent left (state '$NODE_STATE')"
kinds=$(api_json /v1/events "[.items[] | select(.subject == \"$N1\") | .kind] | join(\" \")")
[[ $kinds == *"node_draining node_drained node_left"* ]] ||
  fail "events of $N1: '$kinds', want node_draining node_drained node_left in that order"
api_json /v1/events '.items[] | select(.kind == "node_draining") | .message' |
  grep -q "to leave (its agent is stopping)" || fail "the node_draining event does not say why"
log "ok: events of $N1: $kinds"

# ---- 2. a new agent: ready, not drained ---------------------------------------
log "== 2. a new agent for $N1: ready and serving, no drain kept"
new_agent 1500
# (an operator's drain would have it registered drained)
wait_node_state "$N1" ready 5000 || fail "$N1 not ready after a new agent (state '$NODE_STATE')"
assert_eq "$(jq -r '.drained | length' "$COORD_STATE/state.json")" 0 "nodes kept drained in state.json"
pingpong after-restart

# ---- 3. a drain that cannot finish: --stop-timeout-ms -------------------------
log "== 3. the frontend stopped: the agent stops after --stop-timeout-ms"
stuck_drain
stopped_in "$A" "$A_LOG" "the drain did not finish within 1500 ms" 1400 6000 "$T0"
kill -CONT "$FE"
log "ok: stopped $(($(now_ms) - T0)) ms after SIGTERM, the drain unfinished"

# ---- 4. a second signal --------------------------------------------------------
log "== 4. a second SIGTERM stops a draining agent at once"
new_agent 60000
stuck_drain
# meanwhile the API says why it drains, and an undrain is refused
assert_str "$(api_json "/v1/nodes/$N1" .leaving)" true "$N1 leaving while its agent drains"
if ctl node undrain "$N1" >"$IT_DIR/undrain.out" 2>&1; then
  fail "undrain of a node whose agent is stopping was accepted"
fi
grep -q "its agent is stopping" "$IT_DIR/undrain.out" || fail "undrain refused without the reason: $(cat "$IT_DIR/undrain.out")"
t0=$(now_ms)
kill -TERM "$A"
stopped_in "$A" "$A_LOG" "Terminated, shutting down" 0 3000 "$t0"
kill -CONT "$FE"
log "ok: stopped $(($(now_ms) - t0)) ms after the second SIGTERM"

# ---- 5. the coordinator restarted while draining --------------------------------
log "== 5. the coordinator killed and started again while the node drains"
new_agent 60000
stuck_drain
wait_log "$COORD_LOG" "node $N1 drains to leave" 5 3 "$C"
kill9 "$C"
start_coordinator --lease-ms 1000 --drain-timeout-ms 60000 --frontend-timeout-ms 60000
C=$COORD_PID
wait_log "$A_LOG" "again to drain the node before stopping" 10 1 "$A"
wait_log "$COORD_LOG" "node $N1 drains to leave" 5 1 "$C"
# the frontend that holds the node's instance has not come back: a second
# later the drain still waits for it (the restarted coordinator settles)
sleep 1
is_alive "$A" || fail "the drain finished while the frontend holding the node's instance was away"
t0=$(now_ms)
kill -CONT "$FE" # the drain can finish now
stopped_in "$A" "$A_LOG" "drained: every instance stopped; leaving" 0 10000 "$t0"
assert_log "$A_LOG" "lost the coordinator while draining; reconnecting" "the agent rode out the restart"
wait_node_state "$N1" down 5000 || fail "$N1 not down after its agent left (state '$NODE_STATE')"
log "ok: the restarted coordinator finished the drain; the agent left $(($(now_ms) - t0)) ms after the frontend resumed"

# ---- 6. the coordinator lost while draining ------------------------------------
log "== 6. the coordinator killed and not back: the agent waits a lease, then stops"
new_agent 60000
stuck_drain
wait_log "$COORD_LOG" "node $N1 drains to leave" 5 2 "$C"
t0=$(now_ms)
kill9 "$C"
stopped_in "$A" "$A_LOG" "no coordinator answered again while draining" 900 5000 "$t0"
assert_log "$A_LOG" "lost the coordinator while draining; reconnecting" "the agent waited for a coordinator"
kill -CONT "$FE"
log "ok: stopped $(($(now_ms) - t0)) ms after the coordinator's kill (lease 1000 ms)"

# ---- 7. nothing to drain ----------------------------------------------------------
log "== 7. an agent with no instance stops at once"
start_coordinator --lease-ms 1000
C=$COORD_PID
api DELETE /v1/services/echo
[[ $API_STATUS == 200 ]] || fail "DELETE /v1/services/echo: HTTP $API_STATUS"
start_node_agent "$N1" --cpu-accels 1 --stop-timeout-ms 60000
A=$AGENT_PID A_LOG=$AGENT_LOG
t0=$(now_ms)
kill -TERM "$A"
stopped_in "$A" "$A_LOG" "Terminated, shutting down" 0 3000 "$t0"
grep -q "draining before stopping" "$A_LOG" && fail "an agent with nothing to drain drained"
log "ok: no instance: stopped $(($(now_ms) - t0)) ms after SIGTERM"

stop "$FE" 10
assert_eq "$WAIT_RC" 0 "frontend exit status on SIGTERM"
stop "$C" 10
assert_eq "$WAIT_RC" 0 "coordinator exit status on SIGTERM"
it_done
