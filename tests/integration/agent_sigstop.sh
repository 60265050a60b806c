#!/usr/bin/env bash
# agent_sigstop: an agent stopped (SIGSTOP) past its lease and continued
# (SIGCONT) never serves with its old epoch: it comes back as a new
# incarnation, and only its new instances get traffic (docs/design.md,
# "Delivery guarantees"). One coordinator (lease 2 s), two agents with two
# CPU accelerators each, a frontend, a sockperf-echo service on every
# accelerator (placement all).
#
#  1. Under sockperf under-load, agent 1 is stopped: the coordinator
#     declares its node down within its lease (+ slack). What sockperf lost
#     is accounted for by the frontend (at most what it dropped: requests
#     in flight on the stopped node, counted lost, or held for a flow
#     whose answers must stay in order); nothing was answered twice.
#  2. While agent 1 stays stopped (twice its lease in all), a second run is
#     answered in full by agent 2.
#  3. SIGCONT: agent 1's lease fence had stopped its accelerators (it logs
#     so before anything else); the coordinator refuses its old epoch, it
#     discards its instances and registers as a new incarnation (another
#     epoch, in the API and its metrics).
#  4. A third run is answered in full, none twice, and agent 1's new
#     instances take part of it (its accelerators' requests grow).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init agent_sigstop
it_require_coord
it_require sockperf
pick_ports COORD_PORT API_PORT METRICS_PORT UDP_PORT AM1 AM2
LEASE_MS=2000

# the agent's metric NAME on port PORT ("" when it does not answer)
agent_metric() {
  curl -sf --max-time 2 "http://127.0.0.1:$1/metrics" 2>/dev/null |
    awk -v n="$2" '$1 == n {print $2}'
}
# requests the frontend wrote into node $1's mqueues (any incarnation's)
node_requests() {
  metric lynx_mqueue_dispatched_total "node=\"$1\"" 2>/dev/null || echo 0
}
node_epoch() { api_json "/v1/nodes/$1" .epoch; }
# the frontend's drops by reason since the base scrape DROPS0
drops_since() {
  local now
  now=$(metric lynx_frontend_dropped_total "reason=\"$1\"") || now=0
  echo $((now - ${DROPS0[$1]:-0}))
}
declare -A DROPS0=()
drops_base() {
  local r
  for r in lost flow_full expired stale_tag; do
    DROPS0[$r]=$(metric lynx_frontend_dropped_total "reason=\"$r\"") || DROPS0[$r]=0
  done
}
is_stopped() { [[ $(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) == T ]]; }
STOPPED=''
trap 'rc=$?; [[ -n $STOPPED ]] && kill -CONT "$STOPPED" 2>/dev/null; (exit $rc); it_cleanup' EXIT

# ---- set-up -------------------------------------------------------------------
start_coordinator --lease-ms "$LEASE_MS"
node_ids N1 N2
start_node_agent "$N1" --metrics "127.0.0.1:$AM1"
A1=$AGENT_PID A1_LOG=$AGENT_LOG
start_node_agent "$N2" --metrics "127.0.0.1:$AM2"
start_coord_frontend
api POST /v1/services -d "{\"name\":\"echo\",\"port\":$UDP_PORT,\"app\":\"sockperf-echo\",\"placement\":\"all\",\"mqueues_per_accel\":2}"
assert_eq "$API_STATUS" 201 "POST /v1/services"
end=$(($(now_ms) + 15000))
until [[ $(api_json /v1/services/echo .instances.ready) == 4 ]]; do
  (($(now_ms) < end)) || fail "echo not ready on the 4 accelerators: $(cat "$API_BODY")"
  sleep 0.1
done
wait_log "$FRONTEND_LOG" "serving service echo" 10 1 "$FRONTEND_PID"
epoch0=$(node_epoch "$N1")
assert_eq "$(agent_metric "$AM1" lynx_agent_epoch)" "$epoch0" "agent 1's epoch: its metric and the API"

# ---- 1. agent 1 stopped under load ----------------------------------------------------
log "== 1. SIGSTOP of agent 1 under sockperf under-load"
out1=$IT_DIR/run1.out
sockperf_base
drops_base
sockperf under-load -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 6 --mps 1000 \
  --reply-every 1 --buffer-size 4194304 >"$out1" 2>&1 &
sp=$!
track "$sp" sockperf-run1
# traffic on agent 1 (its heartbeats report it) for 2 s at least; a loaded
# machine may take seconds before sockperf's first request
t_run=$(now_ms)
end=$((t_run + 15000))
until r1=$(node_requests "$N1") && ((r1 > 0 && $(now_ms) - t_run >= 2000)); do
  (($(now_ms) < end)) || break
  sleep 0.1
done
assert_gt "$r1" 0 "requests the frontend sent agent 1 before the stop"
kill -STOP "$A1"
STOPPED=$A1
until is_stopped "$A1"; do sleep 0.01; done
t_stop=$(now_ms)
wait_node_state "$N1" down $((LEASE_MS + 5000)) ||
  fail "$N1 not down within $((LEASE_MS + 5000)) ms of SIGSTOP (state '$NODE_STATE')"
log "$N1 declared down $(($(now_ms) - t_stop)) ms after SIGSTOP (lease $LEASE_MS ms)"
assert_str "$(node_state "$N2")" ready "agent 2's node while agent 1 is down"
wait_exit "$sp" 30 || fail "sockperf run 1 did not finish"
sockperf_stats "$out1"
assert_eq "$SP_DUP" 0 "run 1: answers sockperf got twice"
# until every request the frontend received is answered or dropped (the
# stopped node's expire or are counted lost a while after the run)
M1=$IT_DIR/metrics-run1.txt
end=$(($(now_ms) + 10000))
for (( ; ; )); do
  scrape "$M1"
  all=$(($(METRICS_FROM=$M1 metric lynx_frontend_dropped_total) - SPB_DROP))
  rcv=$(($(METRICS_FROM=$M1 metric lynx_frontend_received_total) - SPB_RCV))
  resp=$(($(METRICS_FROM=$M1 metric lynx_frontend_responded_total) - SPB_RESP))
  ((resp + all >= rcv)) && break
  (($(now_ms) < end)) || break
  sleep 0.1
done
lost=$(METRICS_FROM=$M1 drops_since lost) held=$(METRICS_FROM=$M1 drops_since flow_full)
expired=$(METRICS_FROM=$M1 drops_since expired)
nr=$(METRICS_FROM=$M1 drops_since app_dropped) # sockperf's messages that ask no reply
log "frontend: received $rcv, answered $resp, dropped $all (lost $lost, flow_full $held, expired $expired, no reply asked $nr); sockperf sent $SP_SENT, missed $((SP_SENT - SP_RCVD))"
assert_gt "$lost" 0 "requests in flight on the stopped node the frontend counted lost"
# the stopped node's share: in its mqueues (lost once it was declared
# down, or expired before), or held back for a flow whose earlier requests
# sit there (answers of a flow stay in order: docs/design.md)
assert_eq "$all" $((lost + held + expired + nr)) \
  "run 1: requests the frontend dropped (lost, flow_full, expired or no reply asked: no other reason)"
assert_eq $((resp + all)) "$rcv" "run 1: requests the frontend answered or dropped (each once, of those it received)"
# (answers sockperf counts dropped beyond that were late: check_sockperf_served)
assert_ge "$resp" "$SP_RCVD" "run 1: answers the frontend sent (at least those sockperf got)"

# ---- 2. agent 2 serves alone ---------------------------------------------------------
log "== 2. agent 1 still stopped: agent 2 answers everything"
out2=$IT_DIR/run2.out
sockperf_base
run_sockperf "$out2" under-load -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 2 --mps 1000 \
  --reply-every 1 --buffer-size 4194304
check_sockperf_served "$out2"
while (($(now_ms) < t_stop + 2 * LEASE_MS)); do sleep 0.1; done
is_stopped "$A1" || fail "agent 1 is not stopped any more"

# ---- 3. SIGCONT: a new incarnation -----------------------------------------------------
log "== 3. SIGCONT of agent 1 ($(($(now_ms) - t_stop)) ms after the stop)"
nreg=$(grep -cF "registered with coordinator" "$A1_LOG")
kill -CONT "$A1"
STOPPED=''
wait_log "$A1_LOG" "registering again as a new incarnation" 10 1 "$A1"
wait_log "$A1_LOG" "registered with coordinator" 10 $((nreg + 1)) "$A1"
# the fence acted first: libuv runs the overdue fence timer before it reads
# the coordinator's refusal, so the warning precedes the new incarnation
fl=$(grep -nF "no heartbeat answered within the lease" "$A1_LOG" | head -1 | cut -d: -f1)
nl=$(grep -nF "registering again as a new incarnation" "$A1_LOG" | head -1 | cut -d: -f1)
is_uint "$fl" || it_check_failed "agent 1 never logged its lease fence"
assert_lt "${fl:-0}" "${nl:-0}" "line of agent 1's fence warning (before its new incarnation's)"
assert_log "$A1_LOG" "discarding 2 instances of epoch $epoch0" "agent 1 discarded its old instances"
assert_log "$COORD_LOG" "register as a new incarnation" "the coordinator refused the old epoch"
wait_node_state "$N1" ready 10000 || fail "$N1 not ready again (state '$NODE_STATE')"
epoch1=$(node_epoch "$N1")
[[ $epoch1 != "$epoch0" ]] || it_check_failed "agent 1's epoch is still $epoch0 after its new incarnation"
log "ok: agent 1's epoch $epoch0 -> $epoch1"
assert_eq "$(agent_metric "$AM1" lynx_agent_epoch)" "$epoch1" "agent 1's epoch metric after its new incarnation"
assert_eq "$(agent_metric "$AM1" lynx_agent_lease_fenced)" 0 "agent 1's lease_fenced once registered again"
assert_eq "$(METRICS_PORT=$API_PORT metric lynx_coordinator_new_incarnations_total)" 1 \
  "coordinator new_incarnations_total"
end=$(($(now_ms) + 15000))
until [[ $(api_json /v1/services/echo .instances.ready) == 4 ]]; do
  (($(now_ms) < end)) || fail "echo not ready on the 4 accelerators again: $(cat "$API_BODY")"
  sleep 0.1
done

# ---- 4. agent 1's new instances serve ------------------------------------------------
log "== 4. served by both agents again"
base1=$(node_requests "$N1")
out3=$IT_DIR/run3.out
sockperf_base
run_sockperf "$out3" under-load -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 3 --mps 1000 \
  --reply-every 1 --buffer-size 4194304
check_sockperf_served "$out3"
end=$(($(now_ms) + 5000))
until r=$(node_requests "$N1") && is_uint "$r" && ((r > base1)); do
  (($(now_ms) < end)) || { it_check_failed "the frontend sent agent 1's new instances no request ($base1 -> ${r:-none})"; break; }
  sleep 0.1
done
log "ok: the frontend sent agent 1's new instances requests ($base1 -> $r)"
it_done
