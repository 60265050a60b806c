#!/usr/bin/env bash
# liveness: an accelerator whose application stops consuming its mqueue
# (what a hung GPU kernel looks like) is reported by its agent and taken out
# of dispatch by the coordinator, and put back when it consumes again. CPU
# accelerators run the same check a GPU does; the sockperf-fault app's
# "LYNX-HANG <ms>" request holds the accelerator that receives it.
#
# One coordinator, one agent with 2 CPU accelerators (--stall-ms 500), one
# frontend, a sockperf-fault service on both accelerators.
#  1. sockperf ping-pong under load is answered and no accelerator is ever
#     reported stalled (no false alarm from a busy accelerator).
#  2. "LYNX-HANG 5000" is sent: within a few seconds exactly one accelerator
#     is reported stalled (/v1/accelerators health, agent log), leaves the
#     frontend's dispatch, and sockperf is answered by the other one with
#     nothing dropped.
#  3. When the hang ends the accelerator consumes again: it is dispatchable,
#     back in the frontend's dispatch with the same instance (not
#     restarted), its requests grow again, and the coordinator counted one
#     health outage for it.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init liveness
it_require sockperf curl timeout
it_require_coord
pick_ports COORD_PORT API_PORT METRICS_PORT UDP_PORT AMETRICS_PORT
node_ids N1
HANG_MS=5000

# fe_accels: "node/accel" of every accelerator in the frontend's dispatch.
fe_accels() {
  curl -sf --max-time 5 "http://127.0.0.1:$METRICS_PORT/metrics" |
    sed -n 's/^lynx_mqueue_dispatched_total{.*node="\([^"]*\)",.*accel="\([0-9]*\)".*/\1\/\2/p' |
    sort -u
}
# stalled: "id stalled_mqueues dispatchable" of every accelerator.
accel_health() {
  ctl accelerators --json |
    jq -r '.items[] | "\(.id) \(.health.stalled_mqueues) \(.health.dispatchable) \(.health.outages) \(.requests)"'
}
# the agent's service-time histogram count of accelerator $1 with at least
# $2 seconds (its le buckets are powers of two of ns: 4.294967296 = 2^32 ns)
slow_services() {
  curl -sf --max-time 5 "http://127.0.0.1:$AMETRICS_PORT/metrics" | awk -v a="$1" -v le="$2" '
    $1 ~ "^lynx_agent_accel_service_seconds_bucket[{]accel=\"" a "\"" {
      if ($1 ~ "le=\"" le "\"") below = $2
      if ($1 ~ "le=\"[+]Inf\"") all = $2 }
    END { print all - below }'
}

start_coordinator --lease-ms 1500
start_node_agent "$N1" --stall-ms 500 --metrics "127.0.0.1:$AMETRICS_PORT"
AGENT_LOG_N1=$AGENT_LOG
start_coord_frontend
api POST /v1/services -d "{\"name\":\"sf\",\"port\":$UDP_PORT,\"app\":\"sockperf-fault\",\"placement\":\"all\",\"mqueues_per_accel\":2}"
[[ $API_STATUS == 201 ]] || fail "POST /v1/services: HTTP $API_STATUS: $(cat "$API_BODY")"
end=$(($(now_ms) + 5000))
until [[ $(fe_accels | grep -c .) == 2 ]]; do
  (($(now_ms) < end)) || fail "the frontend never had both accelerators in dispatch"
  sleep 0.05
done
api_json /v1/mqueues '[.items[] | "\(.node)/\(.accel) \(.instance)"] | unique | .[]' \
  >"$IT_DIR/instances-before.txt"

# ---- 1. busy, not stalled ---------------------------------------------------------
log "== 1. load without a hang: no accelerator reported stalled"
# (5000 msg/s divided by the time scale, sockperf's receive buffer 4 MiB:
# every answer is checked, not speed; at 5000/s beside two CPU hogs 47 of
# 15,003 never reached an accelerator)
timeout -k 3 "$(ts_s 20)" sockperf under-load -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 3 \
  --mps $((5000 / TS)) --reply-every 1 --buffer-size 4194304 >"$IT_DIR/load.out" 2>&1 </dev/null ||
  { cat "$IT_DIR/load.out"; fail "sockperf under-load failed"; }
check_sockperf "$IT_DIR/load.out"
sleep 1 # a heartbeat after the load
accel_health >"$IT_DIR/health-1.txt"
cat "$IT_DIR/health-1.txt"
assert_eq "$(awk '$2 != 0 || $3 != "true" || $4 != 0' "$IT_DIR/health-1.txt" | grep -c .)" 0 \
  "accelerators reported stalled, not dispatchable or with an outage under plain load"
assert_eq "$(grep -c 'stopped consuming' "$AGENT_LOG_N1")" 0 "agent stall warnings under plain load"

# accelerator-stamped latency (docs/metrics.md): each accelerator took
# requests in the agent's window, quantiles ordered; the agent's service
# histogram counts every request its heartbeat reported
ctl accelerators --json | jq -r '.items[] | "\(.id) \(.latency.window_requests) \(.latency.queue_p50_ns) \(.latency.queue_p99_ns) \(.latency.service_p50_ns) \(.latency.service_p99_ns) \(.requests)"' \
  >"$IT_DIR/latency-1.txt"
cat "$IT_DIR/latency-1.txt"
assert_eq "$(awk '$2 > 0 && $4 >= $3 && $5 > 0 && $6 >= $5' "$IT_DIR/latency-1.txt" | grep -c .)" 2 \
  "accelerators with requests, a service time and ordered quantiles in their latency window"
curl -sf --max-time 5 "http://127.0.0.1:$AMETRICS_PORT/metrics" >"$IT_DIR/agent-metrics-1.txt" ||
  fail "cannot read the agent's --metrics"
for i in 0 1; do
  n=$(sed -n "s/^lynx_agent_accel_service_seconds_count{accel=\"$i\",kind=\"cpu\"} //p" "$IT_DIR/agent-metrics-1.txt")
  assert_eq "$n" "$(awk -v a="$N1/$i" '$1 == a {print $7}' "$IT_DIR/latency-1.txt")" \
    "accelerator $i: service times counted vs requests reported"
done
assert_eq "$(grep -c '^lynx_agent_accel_copies_total{accel="[01]",kind="cpu"} 0$' "$IT_DIR/agent-metrics-1.txt")" 2 \
  "CPU accelerators over shm: no copies by the agent"
ctl accelerators >"$IT_DIR/accels-1.txt"
grep -q 'QUEUE-P50/P99 *SERVICE-P50/P99' "$IT_DIR/accels-1.txt" ||
  fail "lynxctl accelerators shows no latency columns: $(cat "$IT_DIR/accels-1.txt")"
assert_eq "$(grep -cE '[0-9.]+(ns|us|ms)/[0-9.]+(ns|us|ms) +[0-9.]+(ns|us|ms)/[0-9.]+(ns|us|ms) *$' "$IT_DIR/accels-1.txt")" 2 \
  "lynxctl accelerators rows with queueing and service p50/p99"
assert_eq "$(slow_services 0 4.294967296)$(slow_services 1 4.294967296)" 00 \
  "service times over 4.29 s before any hang"

# ---- 2. one accelerator hangs -------------------------------------------------------
log "== 2. LYNX-HANG $HANG_MS: one accelerator stops consuming"
t_hang=$(now_ms)
printf 'LYNX-HANG %d' "$HANG_MS" >"/dev/udp/127.0.0.1/$UDP_PORT"
STALLED=''
for (( ; ; )); do
  accel_health >"$IT_DIR/health-2.txt"
  STALLED=$(awk '$2 >= 1 && $3 == "false" {print $1}' "$IT_DIR/health-2.txt")
  [[ -n $STALLED ]] && break
  (($(now_ms) - t_hang < 4000)) ||
    { cat "$IT_DIR/health-2.txt"; fail "no accelerator reported stalled within 4 s of the hang"; }
  sleep 0.05
done
DETECT_MS=$(($(now_ms) - t_hang))
log "ok: $STALLED reported stalled and out of dispatch ${DETECT_MS} ms after the hang (stall period 500 ms)"
assert_eq "$(grep -c . <<<"$STALLED")" 1 "accelerators reported stalled"
wait_log "$AGENT_LOG_N1" "stopped consuming" 2 1
# out of the frontend's dispatch
end=$(($(now_ms) + 2000))
while fe_accels | grep -qx "$STALLED"; do
  (($(now_ms) < end)) || fail "$STALLED still in the frontend's dispatch 2 s after it was reported stalled"
  sleep 0.02
done
assert_eq "$(fe_accels | grep -c .)" 1 "accelerators left in the frontend's dispatch"
(($(now_ms) - t_hang < HANG_MS - 1500)) ||
  log "warning: less than 1.5 s of the hang left for the check that the other accelerator serves"
pingpong during-hang 1

# ---- 3. it consumes again -------------------------------------------------------------
log "== 3. the hang ends: $STALLED consumes and is back in dispatch"
for (( ; ; )); do
  accel_health >"$IT_DIR/health-3.txt"
  awk -v a="$STALLED" '$1 == a && $2 == 0 && $3 == "true"' "$IT_DIR/health-3.txt" | grep -q . && break
  (($(now_ms) - t_hang < HANG_MS + 4000)) ||
    { cat "$IT_DIR/health-3.txt"; fail "$STALLED not dispatchable again 4 s after the hang ended"; }
  sleep 0.05
done
BACK_MS=$(($(now_ms) - t_hang))
log "ok: $STALLED dispatchable again ${BACK_MS} ms after the hang began (hang ${HANG_MS} ms)"
assert_ge "$BACK_MS" "$HANG_MS" "ms from the hang to dispatchable again (not before the app consumes)"
wait_log "$AGENT_LOG_N1" "consumes again" 2 1
# the hung request's service time, stamped by the accelerator: over 4.29 s
end=$(($(now_ms) + 2000))
until [[ $(slow_services "${STALLED##*/}" 4.294967296) == 1 ]]; do
  (($(now_ms) < end)) || fail "$STALLED: no service time of at least 4.29 s in the agent's histogram after a ${HANG_MS} ms hang"
  sleep 0.1
done
end=$(($(now_ms) + 3000))
until [[ $(fe_accels | grep -c .) == 2 ]]; do
  (($(now_ms) < end)) || fail "$STALLED not back in the frontend's dispatch"
  sleep 0.05
done
api_json /v1/mqueues '[.items[] | "\(.node)/\(.accel) \(.instance)"] | unique | .[]' \
  >"$IT_DIR/instances-after.txt"
diff "$IT_DIR/instances-before.txt" "$IT_DIR/instances-after.txt" >/dev/null ||
  fail "instances changed (restarted?): $(cat "$IT_DIR/instances-before.txt") -> $(cat "$IT_DIR/instances-after.txt")"
outages=$(awk -v a="$STALLED" '$1 == a {print $4}' "$IT_DIR/health-3.txt")
assert_eq "$outages" 1 "health outages counted for $STALLED"
base=$(awk -v a="$STALLED" '$1 == a {print $5}' "$IT_DIR/health-3.txt")
# several clients so that both accelerators get flows
declare -a sp=()
for i in 1 2 3 4; do
  timeout -k 3 "$(ts_s 10)" sockperf ping-pong -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 2 \
    >"$IT_DIR/after-$i.out" 2>&1 </dev/null &
  sp+=($!)
  track "$!" "sockperf-after-$i"
done
for i in 1 2 3 4; do
  wait_exit "${sp[$((i - 1))]}" 15 || fail "sockperf #$i did not finish"
  check_sockperf "$IT_DIR/after-$i.out"
done
end=$(($(now_ms) + 3000))
for (( ; ; )); do
  now=$(accel_health | awk -v a="$STALLED" '$1 == a {print $5}')
  ((now > base)) && break
  (($(now_ms) < end)) || fail "$STALLED served no request after it came back ($base -> $now)"
  sleep 0.1
done
log "ok: $STALLED served again ($base -> $now requests)"
it_done
