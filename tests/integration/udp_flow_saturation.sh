#!/usr/bin/env bash
# udp_flow_saturation: at saturation the excess of a client flow is dropped
# at the frontend and counted, and its answers still never overtake each
# other (issue 13; flow order, docs/design.md).
#
# Two CPU accelerators with one 8-slot mqueue each emulate 4 ms of work per
# request by sleeping (--work-mode sleep, so the cores stay free for
# sockperf and the frontend): one mqueue serves at most 250 requests/s, and a
# loaded machine only serves fewer. One sockperf flow offers 4000 msg/s for
# 3 s, sixteen times that: its ring is full nearly all the time, by
# construction rather than by the scheduler's whim.
#
# The flow always has requests in flight, so it stays on its mqueue (flow
# order). Moving it to the other accelerator's free ring would let the
# answers of the two race (the old behaviour: sockperf saw hundreds out of
# order); instead the frontend drops the request and counts it as
# dropped_total{reason="flow_full"}.
#
#  1. the run saturated: the frontend received more than twice what it
#     answered (checked, not assumed, before the drop counter is judged).
#  2. sockperf: answers arrive, none duplicated or out of order.
#  3. metrics: dropped{flow_full} > 0 and no flow moved (flow_moves == 0);
#     every request received was dispatched or dropped at the frontend,
#     and every one dispatched was answered.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init udp_flow_saturation
it_require sockperf curl timeout
pick_ports AGENT_PORT UDP_PORT METRICS_PORT

start_agent --cpu-accels 2 --mqueues 1 --slots 8 --work-us 4000 \
  --work-mode sleep
start_frontend

# ---- the saturating run ------------------------------------------------------
out=$IT_DIR/underload-saturated.out
rcv0=$(metric lynx_frontend_received_total) || fail "cannot read received_total"
run_sockperf "$out" under-load -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 3 \
  --mps 4000 --reply-every 1 --buffer-size 4194304
# the answers still in flight (at most 16 requests of 4 ms each)
snap=$IT_DIR/metrics-final.txt
scrape_stable "$snap"
export METRICS_FROM=$snap
rcv=$(metric lynx_frontend_received_total) || fail "no received_total"
disp=$(metric lynx_frontend_dispatched_total) || fail "no dispatched_total"
resp=$(metric lynx_frontend_responded_total) || fail "no responded_total"
moves=$(metric lynx_frontend_flow_moves_total) || fail "no flow_moves_total"
declare -A D=()
fe_drops=0
for reason in flow_full ring_full no_mqueue tag_full oversize shutdown; do
  D[$reason]=$(metric lynx_frontend_dropped_total "reason=\"$reason\"") ||
    fail "no lynx_frontend_dropped_total{reason=\"$reason\"}"
  fe_drops=$((fe_drops + D[$reason]))
done
unset METRICS_FROM
log "frontend: received $((rcv - rcv0)) dispatched $disp responded $resp" \
  "flow_moves $moves; dropped: flow_full ${D[flow_full]}" \
  "ring_full ${D[ring_full]} tag_full ${D[tag_full]}"

# ---- 1. it saturated -----------------------------------------------------------
# (fails rather than skips: a run that did not saturate tests nothing)
assert_gt $((rcv - rcv0)) $((2 * resp)) \
  "requests received in the run (more than twice those answered: saturated)"

# ---- 2. sockperf: in order ------------------------------------------------------
IT_SOFT=1
sockperf_stats "$out"
assert_gt "$SP_RCVD" 0 "sockperf: answers received"
assert_eq "$SP_DUP" 0 "sockperf: duplicated answers"
assert_eq "$SP_OOO" 0 "sockperf: out-of-order answers"

# ---- 3. the frontend's account ----------------------------------------------------
assert_gt "${D[flow_full]}" 0 "dropped{flow_full} (the flow's ring was full)"
assert_eq "$moves" 0 "flows moved with requests in flight"
assert_eq "$disp" $((rcv - fe_drops)) \
  "dispatched == received - dropped at the frontend"
assert_eq "$resp" "$disp" "responded == dispatched"
it_done
