#!/usr/bin/env bash
# shellcheck disable=SC2317 # the fault functions are called through window()
# faults/agent: the faults of an agent (its node), each under sockperf
# load, judged by the fault suite's counts (lib.sh; docs/faults.md).
#
#   coord  10.77.0.1   lynx-coordinator (lease 1 s)
#   h1, h2 10.77.0.11-12  an agent each, 2 CPU accelerators over tcp
#   fe1    10.77.0.2   lynx-frontend (request timeout 10 s: longer than a
#                      lease, so requests to a stopped node end lost)
#   client 10.77.0.9   sockperf under-load, 1000 msg/s, every message
#                      answered by design
#
# Every fault hits h1 while sockperf runs; h2 survives. After each: fe1
# answered or dropped every request it received, dropped only for the
# reasons the fault explains, none on h2's mqueues, and no more than
# reached h1 between the fault and h1 declared down (at the load's rate);
# h2 ran exactly what fe1 gave it; sockperf saw no duplicate. The reasons:
# a killed or restarted agent's requests end in doubt (connection reset) or
# lost (node down); a stopped or cut-off node's too, and while it is not
# yet declared down, a flow whose mqueue is on it fills that mqueue and
# then drops (flow_full: a flow keeps its mqueue while requests are in
# flight, so its answers keep their order; ring_full where no other mqueue
# has room).
#
#  0. no fault: nothing dropped.
#  1. kill -9 of h1's agent, then a new one: h1's connections reset (its
#     requests in doubt), the node goes down, comes back as a new
#     incarnation and serves; it runs exactly what it is given.
#  2. SIGSTOP of h1's agent past its lease, then SIGCONT: the node goes
#     down, its requests are lost; the agent finds its lease expired, fences
#     itself and comes back as a new incarnation. Ledger: the accelerators
#     ran every request dispatched except the lost ones, none of which ran
#     (a fenced incarnation answers nothing).
#  3. restart of h1's agent (SIGTERM, start): the agent has its node
#     drained before it exits (--stop-timeout-ms), so nothing is dropped:
#     every request fe1 received is answered; back as a new incarnation.
#  4. h1 loses its network (its link down, 3 s), then gets it back: the
#     node goes down, its requests are lost (or in doubt: written before the
#     link went), the agent fences itself and comes back. Ledger as in 2.
#
# usage: agent.sh [BIN_DIR]   (ctest passes build/bin; root)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

IT_NAME=faults_agent
mh_begin "$IT_NAME" 240

step "set-up: coordinator, agents h1 and h2, frontend fe1, client"
fl_cluster 2 1

# window NAME SECONDS FAULT_FN: sockperf for SECONDS through fe1 with
# FAULT_FN run 1 s into the load; then fe1's counts are judged.
window() {
  local name=$1
  fl_fault_window "$1" fe1 "$2" "$3" "${@:4}"
  assert_eq "$(fl_node_drops fe1 h2)" 0 "$name: requests fe1 dropped on h2 (which stayed up)"
  # what reached h1 while it was failed but not yet declared down, at most
  assert_le "$FL_DROPPED" $((FL_RATE * (FL_OUT_MS + $(ts_ms 500)) / 1000)) "$name: requests dropped (at $FL_RATE/s, h1 failed for $FL_OUT_MS ms before it was declared down)"
}
FL_OUT_MS=0

back_in_dispatch() { # h1 ready again and in fe1's dispatch
  mh_wait_until 20 "h1 ready again" fl_node_ready h1
  fl_wait_dispatch fe1 4
}

step "0. no fault"
window none 3 true
fl_check_once h1 fe1
fl_check_once h2 fe1

step "1. kill -9 of h1's agent, then a new agent"
fault_kill() {
  local t
  t=$(mh_now_ms)
  mh_stop "${FL_PID[h1]}" 5 KILL
  mh_wait_until 10 "h1 declared down" fl_node_down h1
  FL_OUT_MS=$(($(mh_now_ms) - t))
  log "h1 down $FL_OUT_MS ms after the kill (lease $FL_LEASE_MS ms)"
  fl_agent h1
  back_in_dispatch
  log "h1 back in dispatch $(($(mh_now_ms) - t)) ms after the kill"
}
window kill9 8 fault_kill lost in_doubt
fl_check_once h2 fe1
fl_check_once h1 fe1 # the new incarnation: counted from its start

step "2. SIGSTOP of h1's agent past its lease, then SIGCONT"
fault_stop() {
  local t n
  t=$(mh_now_ms)
  n=$(grep -c "registered with coordinator" "${FL_LOG[h1]}")
  kill -STOP "${FL_PID[h1]}"
  mh_wait_until 10 "h1 declared down" fl_node_down h1
  FL_OUT_MS=$(($(mh_now_ms) - t))
  sleep 1
  kill -CONT "${FL_PID[h1]}"
  log "h1 stopped for $(($(mh_now_ms) - t)) ms (lease $FL_LEASE_MS ms)"
  mh_wait_log "${FL_LOG[h1]}" "registered with coordinator" 15 $((n + 1)) "${FL_PID[h1]}"
  back_in_dispatch
}
fl_ledger_save fe1 h1 h2
window sigstop 8 fault_stop lost in_doubt flow_full ring_full
fl_check_ledger sigstop fe1 h1 h2
fl_check_once h2 fe1

step "3. restart of h1's agent (SIGTERM, then a new one)"
fault_restart() {
  local t
  t=$(mh_now_ms)
  mh_stop "${FL_PID[h1]}" 20 # its --stop-timeout-ms is 15 s
  log "h1's agent drained and exited $(($(mh_now_ms) - t)) ms after SIGTERM"
  assert_log "${FL_LOG[h1]}" "drained: every instance stopped; leaving" "h1's agent waited for its drain"
  assert_log "${FL_LOG[coord]}" "node ${FL_NODE[h1]} drains to leave" "the coordinator drained h1 for its agent"
  FL_OUT_MS=0 # nothing was in flight on it when it went
  fl_agent h1
  back_in_dispatch
}
window restart 8 fault_restart
fl_check_once h2 fe1
fl_check_once h1 fe1

step "4. h1's link down for 3 s, then up"
fault_link() {
  local n t
  t=$(mh_now_ms)
  n=$(grep -c "registered with coordinator" "${FL_LOG[h1]}")
  mh_exec h1 ip link set eth0 down
  mh_wait_until 10 "h1 declared down" fl_node_down h1
  FL_OUT_MS=$(($(mh_now_ms) - t))
  sleep 2
  mh_exec h1 ip link set eth0 up
  mh_wait_log "${FL_LOG[h1]}" "registered with coordinator" 20 $((n + 1)) "${FL_PID[h1]}"
  back_in_dispatch
}
fl_ledger_save fe1 h1 h2
window linkdown 10 fault_link lost in_doubt flow_full ring_full
fl_check_ledger linkdown fe1 h1 h2
fl_check_once h2 fe1
it_done
