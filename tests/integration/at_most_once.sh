#!/usr/bin/env bash
# at_most_once: a request the frontend counted lost never runs later, and a
# coordinator that did not run expires nobody (docs/design.md, "Delivery
# guarantees"). Coordinator (lease 1 s), one agent with one CPU
# accelerator, a frontend whose request timeout (20 s) outlasts the test, a
# sockperf-echo service.
#
#  1. Served: every request the frontend sent is one the accelerator took
#     (its `requests` in the API equals the frontend's dispatched count).
#  2. The agent is stopped (SIGSTOP) and requests arrive: the frontend
#     writes them into the accelerator's mqueues; the coordinator declares
#     the node down after its lease and the frontend counts them lost.
#  3. The agent resumes (SIGCONT): its accelerator took none of them (its
#     lease fence stopped it before the coordinator could declare it down);
#     the coordinator refuses the old epoch, the agent discards the old
#     instance with its queued requests and registers as a new
#     incarnation; the accelerator's `requests` still equals what the
#     frontend dispatched before the stop. Served again afterwards.
#  4. The coordinator is stopped for 2.6 s (more than two leases) while the
#     agent heartbeats: after SIGCONT it extends the leases by the pause,
#     reads the waiting heartbeats, and no node expires or leaves dispatch;
#     served again, nothing lost.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init at_most_once
it_require_coord
it_require sockperf
pick_ports COORD_PORT API_PORT METRICS_PORT UDP_PORT
LEASE_MS=1000


# accel_reqs: the accelerator's `requests` (from its heartbeats) in the API.
accel_reqs() {
  ctl accelerators --json | jq -r '[.items[].requests] | add // 0'
}

# wait_accel_reqs WANT TIMEOUT_S: until the API reports WANT requests (the
# agent reports every lease/3); fails when it reports more, or on timeout.
wait_accel_reqs() {
  local end=$(($(now_ms) + $2 * 1000)) v
  for (( ; ; )); do
    v=$(accel_reqs)
    is_uint "$v" && ((v == $1)) && return 0
    is_uint "$v" && ((v > $1)) &&
      fail "the accelerator took $v requests, the frontend dispatched $1"
    (($(now_ms) < end)) || fail "the API reports ${v:-no} requests after ${2}s, want $1"
    sleep 0.1
  done
}

is_stopped() { [[ $(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) == T ]]; }

# ---- set-up ---------------------------------------------------------------------
start_coordinator --lease-ms "$LEASE_MS"
C=$COORD_PID
node_ids N1
start_node_agent "$N1" --cpu-accels 1
A=$AGENT_PID A_LOG=$AGENT_LOG
start_coord_frontend --request-timeout-ms 20000
FE=$FRONTEND_PID FE_LOG=$FRONTEND_LOG
serve_service echo "\"port\":$UDP_PORT,\"app\":\"sockperf-echo\",\"mqueues_per_accel\":2"

# ---- 1. served ----------------------------------------------------------------
log "== 1. served: the accelerator took what the frontend dispatched"
pingpong before
d0=$(metric lynx_frontend_dispatched_total) || fail "no dispatched_total"
assert_gt "$d0" 0 "requests dispatched"
wait_accel_reqs "$d0" 5
log "ok: accelerator took $d0 requests, the frontend dispatched $d0"
epoch0=$(api_json "/v1/nodes/$N1" .epoch)

# ---- 2. the agent stops; requests arrive; counted lost ----------------------------
log "== 2. SIGSTOP of the agent; requests arrive and are counted lost"
kill -STOP "$A"
until is_stopped "$A"; do sleep 0.01; done
exp0=$(METRICS_PORT=$API_PORT metric lynx_coordinator_lease_expiries_total)
# (the probe sends a pong request every 5 ms for 400 ms, well within the
# lease, and gets no answer)
"$LYNX_BIN_DIR/lynx-udp-probe" --port "$UDP_PORT" --interval-ms 5 --timeout-ms 400 \
  >"$IT_DIR/stopped.out" 2>&1 </dev/null && fail "the stopped agent answered: $(cat "$IT_DIR/stopped.out")"
d1=$(metric lynx_frontend_dispatched_total)
assert_gt "$d1" "$d0" "requests dispatched to the stopped agent's accelerator"
wait_node_state "$N1" down 5000 || fail "$N1 not down within 5 s of SIGSTOP (state '$NODE_STATE')"
wait_metric lynx_frontend_dropped_total 'reason="lost"' $((d1 - d0)) 5
lost=$(metric lynx_frontend_dropped_total 'reason="lost"')
assert_eq "$lost" $((d1 - d0)) "requests counted lost (all that were in flight)"
log "ok: $lost requests in the stopped agent's mqueues counted lost"

# ---- 3. the agent resumes: a new incarnation; the lost never run -----------------
log "== 3. SIGCONT: a new incarnation; the lost requests never run"
kill -CONT "$A"
wait_node_state "$N1" ready 10000 || fail "$N1 not ready again (state '$NODE_STATE')"
# a few heartbeats of the agent report the accelerator's total
sleep_until=$(($(now_ms) + LEASE_MS))
while (($(now_ms) < sleep_until)); do sleep 0.1; done
wait_accel_reqs "$d0" 5
log "ok: after SIGCONT the accelerator's requests are still $d0: none of the $lost lost ran"
assert_log "$A_LOG" "registering again as a new incarnation" "the agent became a new incarnation"
assert_log "$COORD_LOG" "register as a new incarnation" "the coordinator refused the old epoch"
epoch1=$(api_json "/v1/nodes/$N1" .epoch)
assert_gt "$epoch1" "$epoch0" "epoch of the new incarnation"
assert_eq "$(METRICS_PORT=$API_PORT metric lynx_coordinator_new_incarnations_total)" 1 \
  "coordinator new_incarnations_total"
end=$(($(now_ms) + 10000))
until "$LYNX_BIN_DIR/lynx-udp-probe" --port "$UDP_PORT" --timeout-ms 500 >/dev/null 2>&1; do
  (($(now_ms) < end)) || fail "the new incarnation does not answer within 10 s"
done
pingpong after-resume
d2=$(metric lynx_frontend_dispatched_total)
wait_accel_reqs $((d2 - (d1 - d0))) 5
log "ok: served again; the accelerator took exactly the $((d2 - d1)) requests dispatched since"

# ---- 4. the coordinator stops for 2.6 s ------------------------------------------
log "== 4. SIGSTOP of the coordinator for 2.6 s"
exp1=$(METRICS_PORT=$API_PORT metric lynx_coordinator_lease_expiries_total)
leaves0=$(grep -c 'out of dispatch' "$FE_LOG")
kill -STOP "$C"
until is_stopped "$C"; do sleep 0.01; done
sleep 2.6
kill -CONT "$C"
wait_log "$COORD_LOG" "did not run for" 5 1 "$C"
# a few leases later nobody has expired: the waiting heartbeats renewed them
t_end=$(($(now_ms) + 3 * LEASE_MS))
while (($(now_ms) < t_end)); do sleep 0.1; done
assert_eq "$(METRICS_PORT=$API_PORT metric lynx_coordinator_lease_expiries_total)" "$exp1" \
  "leases expired over the coordinator's pause"
st=$(node_state "$N1")
[[ $st == ready ]] || it_check_failed "$N1's state after the coordinator's pause: '$st', want ready"
assert_eq "$(grep -c 'out of dispatch' "$FE_LOG")" "$leaves0" \
  "accelerators out of the frontend's dispatch over the pause"
pause=$(METRICS_PORT=$API_PORT metric lynx_coordinator_pauses_total)
assert_ge "$pause" 1 "coordinator pauses_total"
pingpong after-coordinator-pause
assert_eq "$(METRICS_PORT=$API_PORT metric lynx_coordinator_lease_expiries_total)" $((exp0 + 1)) \
  "leases expired in the whole test (the stopped agent's only)"

stop "$FE" 10
assert_eq "$WAIT_RC" 0 "frontend exit status on SIGTERM"
stop "$A" 10
assert_eq "$WAIT_RC" 0 "agent exit status on SIGTERM"
stop "$C" 10
assert_eq "$WAIT_RC" 0 "coordinator exit status on SIGTERM"
exit 0
