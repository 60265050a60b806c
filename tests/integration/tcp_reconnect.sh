#!/usr/bin/env bash
# tcp_reconnect: the frontend's data connections to an agent's regions over
# the tcp transport break while the agent stays up (ss -K kills the sockets,
# as a middlebox reset or a flapping link would).
#
#  1. sockperf is answered over tcp; the frontend says each accelerator is
#     in dispatch over tcp.
#  2. every data connection is killed under load: the frontend logs each
#     accelerator out of dispatch with the transport error, counts the
#     requests that were in flight in doubt (the live accelerator may still
#     run them; none is `lost`), reconnects with backoff (no restart, no new
#     descriptors) and says it is back in dispatch.
#  3. afterwards sockperf is answered with nothing dropped, and both
#     accelerators served requests again.
#  4. the agent logged no refusal: the frontend came back with the same
#     region key and epoch.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init tcp_reconnect
it_require sockperf curl timeout ss
pick_ports AGENT_PORT DATA_PORT UDP_PORT METRICS_PORT

# can this kernel destroy sockets (CONFIG_INET_DIAG_DESTROY)?
python3 - "$DATA_PORT" <<'PY' &
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(1)
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
time.sleep(3)
PY
probe=$!
sleep 0.3
if ! ss -K dst 127.0.0.1 dport = "$DATA_PORT" >/dev/null 2>&1 ||
   ss -tn state established "( dport = :$DATA_PORT )" | grep -q ESTAB; then
  kill "$probe" 2>/dev/null; wait "$probe" 2>/dev/null
  skip "this kernel cannot kill sockets (ss -K needs CONFIG_INET_DIAG_DESTROY)"
fi
kill "$probe" 2>/dev/null; wait "$probe" 2>/dev/null

start_agent --transport tcp --data-listen "127.0.0.1:$DATA_PORT"
start_frontend
# (each accelerator's connection comes up on its own, after "serving UDP")
wait_log "$FRONTEND_LOG" 'in dispatch over tcp' 10 2 "$FRONTEND_PID"
assert_eq "$(grep -c 'in dispatch over tcp' "$FRONTEND_LOG")" 2 \
  "accelerators in dispatch over tcp (2 accelerators x 1 worker)"

# ---- 1. served over tcp ------------------------------------------------------
out=$IT_DIR/before.out
run_sockperf "$out" ping-pong -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 1
check_sockperf "$out"

# ---- 2. kill every data connection under load ------------------------------------
log "killing the data connections to 127.0.0.1:$DATA_PORT under load"
r0=$(metric lynx_frontend_received_total) || fail "cannot read received_total"
timeout -k 3 "$(ts_s 20)" sockperf under-load -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 3 \
  --mps 5000 >"$IT_DIR/during.out" 2>&1 </dev/null &
load=$!
wait_metric lynx_frontend_received_total "" $((r0 + 500)) 10 # load is flowing
ss -K dst 127.0.0.1 dport = "$DATA_PORT" >/dev/null
wait "$load" || true
wait_log "$FRONTEND_LOG" "out of dispatch: transport error" 5 2 "$FRONTEND_PID"
wait_log "$FRONTEND_LOG" "back in dispatch over tcp" 10 2 "$FRONTEND_PID"
assert_eq "$(grep -cF ': starting in ' "$FRONTEND_LOG")" 1 "frontend starts (no restart)"
# the accelerator lives on and may still run them: in doubt, never lost
doubt=$(metric lynx_frontend_dropped_total 'reason="in_doubt"') || fail "no dropped_total{in_doubt}"
log "requests in flight when the connections broke, counted in doubt: $doubt"
assert_eq "$(metric lynx_frontend_dropped_total 'reason="lost"')" 0 \
  "requests counted lost (no node was declared down)"

# ---- 3. served again -------------------------------------------------------------
before=$(curl -sf "http://127.0.0.1:$METRICS_PORT/metrics" | grep -E '^lynx_mqueue_responded_total' || true)
out=$IT_DIR/after.out
run_sockperf "$out" ping-pong -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 2
check_sockperf "$out"
after=$(curl -sf "http://127.0.0.1:$METRICS_PORT/metrics" | grep -E '^lynx_mqueue_responded_total' || true)
grew=0
for acc in 0 1; do
  b=$(awk -v a="accel=\"$acc\"" 'index($0, a) {s += $2} END {print s + 0}' <<<"$before")
  a=$(awk -v a="accel=\"$acc\"" 'index($0, a) {s += $2} END {print s + 0}' <<<"$after")
  ((a > b)) && grew=$((grew + 1))
done
assert_eq "$grew" 2 "accelerators whose responses grew after the reconnect"

# ---- 4. no refusal at the agent ------------------------------------------------------
if grep -q 'refused' "$AGENT_LOG"; then
  it_check_failed "the agent refused a reconnect: $(grep refused "$AGENT_LOG" | head -3)"
else
  log "ok: the agent accepted every reconnect"
fi
it_done
