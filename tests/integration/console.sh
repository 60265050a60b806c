#!/usr/bin/env bash
# console: the web console (/ui/, docs/console.md) in headless Chromium
# (console_check.py, through chromedriver) against a coordinator with:
#   n1     a real agent (2 CPU accelerators, sockperf-fault) one of whose
#          accelerators is hung by a 'LYNX-HANG' request: stalled;
#   n2     a real agent killed with -9: down after its lease;
#   sim*   simulated nodes (lynx-simnodes, 4 accelerators each, taking
#          requests at known rates), one of which is drained and undrained
#          through the page's buttons, and the last of which asks to be
#          drained to leave, as a stopping agent does (--leaving 1);
# a frontend producing into n1's mqueues, and an API token (the buttons
# need it). Then the same page over ~10,000 simulated accelerators.
# Screenshots: <build>/test-output/console/*.png.
# Skipped (77) without chromium, chromedriver or python3-selenium (Debian
# packages: deploy/install-deps.sh test); an installed Chromium that does
# not start is a failure.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init console
it_require_coord
PY=/usr/bin/python3 # Debian's, with its python3-selenium
[[ -x $PY ]] || skip "no /usr/bin/python3"
for b in chromium chromedriver; do
  command -v "$b" >/dev/null || skip "$b is not installed (deploy/install-deps.sh)"
done
$PY -c 'import selenium' 2>/dev/null ||
  skip "python3-selenium is not installed (deploy/install-deps.sh)"
[[ -x $LYNX_BIN_DIR/lynx-simnodes ]] || fail "$LYNX_BIN_DIR/lynx-simnodes is missing: build first (make)"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SHOTS=$(cd "$LYNX_BIN_DIR/.." && pwd)/test-output/console
mkdir -p "$SHOTS"
ulimit -n 8192 2>/dev/null || true # 1,000 simulated nodes: a descriptor each
pick_ports COORD_PORT API_PORT METRICS_PORT UDP_PORT
TOKEN=console-test-token
printf '%s\n' "$TOKEN" >"$IT_DIR/token"
chmod 600 "$IT_DIR/token"
AUTH=(-H "Authorization: Bearer $TOKEN")

start_coordinator --token-file "$IT_DIR/token" --lease-ms 1500
node_ids N1 N2
start_node_agent "$N1" --stall-ms 300 --token-file "$IT_DIR/token" --labels role=hang
start_node_agent "$N2" --token-file "$IT_DIR/token"
N2_PID=$AGENT_PID
start_coord_frontend --token-file "$IT_DIR/token"
api POST /v1/services "${AUTH[@]}" -d "{\"name\":\"sf\",\"port\":$UDP_PORT,\"app\":\"sockperf-fault\",\"placement\":{\"selector\":{\"role\":\"hang\"}}}"
[[ $API_STATUS == 201 ]] || fail "POST /v1/services: HTTP $API_STATUS: $(cat "$API_BODY")"
spawn_daemon lynx-simnodes simnodes "" --coordinator "127.0.0.1:$COORD_PORT" \
  --nodes 6 --accels 4 --prefix "${IT_NODE}sim" --token-file "$IT_DIR/token" \
  --rate 100 --leaving 1
SIM_PID=$SPAWN_PID
wait_log "$SPAWN_LOG" "simnodes: registered" 20 1 "$SIM_PID"

# n1's instances ready (in the frontend's dispatch), then n2 goes
end=$(($(now_ms) + 10000))
until [[ $(api_json /v1/mqueues "[.items[] | select(.node == \"$N1\" and .frontend != \"\")] | length") -gt 0 ]]; do
  (($(now_ms) < end)) || fail "no mqueue of $N1 in the frontend's dispatch within 10 s"
  sleep 0.1
done
stop "$N2_PID" 5 KILL
end=$(($(now_ms) + 10000))
until [[ $(api_json "/v1/nodes/$N2" .state) == down ]]; do
  (($(now_ms) < end)) || fail "$N2 not declared down within 10 s of its kill"
  sleep 0.1
done
# one of n1's accelerators hangs (the request goes to one of its mqueues)
printf 'LYNX-HANG %d' 120000 >"/dev/udp/127.0.0.1/$UDP_PORT"
end=$(($(now_ms) + 10000))
until [[ $(api_json /v1/accelerators "[.items[] | select(.node == \"$N1\" and .health.stalled_mqueues > 0)] | length") == 1 ]]; do
  (($(now_ms) < end)) || fail "no accelerator of $N1 reported stalled within 10 s of the hang"
  sleep 0.1
done

log "== the page over $(api_json /v1/nodes '.items | length') nodes"
timeout -k 5 "$(ts_s 240)" "$PY" "$ROOT/tests/integration/console_check.py" \
  --api "$(api_url)" --token "$TOKEN" --service sf --stalled-node "$N1" \
  --down-node "$N2" --drain-node "${IT_NODE}sim00001" --drain-accels 4 \
  --drain-index 1 --rate 100 --leaving-node "${IT_NODE}sim00005" --shots "$SHOTS"
rc=$?
((rc == 77)) && skip "console_check.py: a module it needs is missing (said above)"
((rc == 0)) || fail "the console does not show the cluster as the API does (FAIL above)"

log "== the page over 10,000 simulated accelerators"
stop "$SIM_PID" 10
spawn_daemon lynx-simnodes simnodes "" --coordinator "127.0.0.1:$COORD_PORT" \
  --nodes 1000 --accels 10 --prefix "${IT_NODE}big" --token-file "$IT_DIR/token" \
  --concurrency 128
SIM_PID=$SPAWN_PID
wait_log "$SPAWN_LOG" "simnodes: registered" 60 1 "$SIM_PID"
timeout -k 5 "$(ts_s 240)" "$PY" "$ROOT/tests/integration/console_check.py" \
  --api "$(api_url)" --token "$TOKEN" --service sf --stalled-node "$N1" \
  --down-node "$N2" --drain-node - --drain-accels 0 \
  --scale-probe "${IT_NODE}big00999" --shots "$SHOTS"
rc=$?
((rc == 0)) || fail "the console over 10,000 accelerators (FAIL above)"
is_alive "$COORD_PID" || fail "the coordinator died"
log "screenshots: $SHOTS"
it_done
