#!/usr/bin/env bash
# api_slowloris: slow clients cannot lock operators out of the coordinator's
# JSON API (docs/api.md "Connections").
#
#  1. A coordinator with its default connection limits and --token-file.
#     lynx-slowloris opens 300 connections from 127.0.0.2 (more than the
#     default per-client cap of 32, and more than the default total of 256)
#     and trickles one header byte per connection every second, never
#     finishing its headers. While it runs, /healthz and an authenticated
#     service create + delete from 127.0.0.1 are answered every time, each
#     within curl --max-time 5. The connections over the per-client cap are
#     closed at once; the 32 accepted ones are closed by the server once the
#     header timeout (default 10 s) passes, however the bytes trickle. The
#     coordinator's /metrics counts 268 refused and 32 header timeouts.
#  2. A coordinator with --http-conn-per-client 4 --http-header-timeout-ms
#     2000 --http-body-timeout-ms 2000: six clients from 127.0.0.3 send whole
#     headers (with the token) announcing a 60000-byte body for POST
#     /v1/services (under --body-max)
#     and trickle the body; two are refused,
#     four are closed after the body timeout (counted phase="body"). A
#     /v1/watch long poll of 5 s, longer than both timeouts, is answered 200
#     with its version (a request being handled has no deadline).
#  3. SIGTERM: both coordinators exit 0.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init api_slowloris
it_require curl jq
it_require_coord
SLOW=$LYNX_BIN_DIR/lynx-slowloris
[[ -x $SLOW ]] || fail "$SLOW is missing: build first (make)"
pick_ports COORD_PORT API_PORT B_COORD_PORT B_API_PORT SVC_PORT
IT_SOFT=1

TOKEN="slow-$RANDOM$RANDOM"
echo "$TOKEN" >"$IT_DIR/token" && chmod 600 "$IT_DIR/token"
AUTH="Authorization: Bearer $TOKEN"

# slow_summary FILE: sets SL_<key> for every key=value of the summary line.
slow_summary() {
  summary_vars "$1" slowloris conns SL_
  log "lynx-slowloris: $SUMMARY"
}

# start_slow OUT ARGS...: lynx-slowloris in the background; waits until its
# connections are open. Sets SLOW_PID.
start_slow() {
  local out=$1
  shift
  "$SLOW" "$@" >"$out" 2>&1 </dev/null &
  SLOW_PID=$!
  track "$SLOW_PID" lynx-slowloris
  log "started lynx-slowloris pid $SLOW_PID: $*"
  wait_log "$out" "slowloris: ready" 20 1 "$SLOW_PID"
  log "$(grep -m1 'slowloris: ready' "$out")"
}

# ---- 1. header trickle against the defaults ------------------------------------
log "== 1. 300 slow header connections from 127.0.0.2 (default limits)"
start_coordinator --lease-ms 1000 --token-file "$IT_DIR/token"
A_PID=$COORD_PID A_LOG=$COORD_LOG
METRICS_PORT=$API_PORT # metric() scrapes the coordinator's /metrics

PER_CLIENT=32 HEADER_MS=10000 # the coordinator's defaults (docs/api.md)
# (lynx-slowloris counts a connection "long" when it lived at least
# --long-ms, from when its connect() returned: half the timeout, as on a
# loaded machine that moment may come after the server started the
# connection's deadline; a refusal comes within milliseconds)
NCONN=300
start_slow "$IT_DIR/slow-1.out" --port "$API_PORT" --source 127.0.0.2 \
  --conns "$NCONN" --interval-ms 1000 --long-ms $((HEADER_MS / 2)) \
  --duration-ms 60000 --mode header

# operators keep being served while the slow clients hold their connections
rounds=0 bad=0
svc='{"name":"slow-svc","port":'$SVC_PORT',"app":"echo","slots":64}'
while is_alive "$SLOW_PID" || ((rounds < 3)); do
  rounds=$((rounds + 1))
  st=$(curl -s --max-time 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$API_PORT/healthz")
  [[ $st == 200 ]] || { bad=$((bad + 1)); it_check_failed "round $rounds: GET /healthz: HTTP ${st:-none} (want 200 within 5 s)"; }
  st=$(curl -s --max-time 5 -o /dev/null -w '%{http_code}' -X POST -H "$AUTH" \
    -d "$svc" "http://127.0.0.1:$API_PORT/v1/services")
  [[ $st == 201 ]] || { bad=$((bad + 1)); it_check_failed "round $rounds: POST /v1/services with the token: HTTP ${st:-none} (want 201 within 5 s)"; }
  st=$(curl -s --max-time 5 -o /dev/null -w '%{http_code}' -X DELETE -H "$AUTH" \
    "http://127.0.0.1:$API_PORT/v1/services/slow-svc")
  [[ $st == 200 ]] || { bad=$((bad + 1)); it_check_failed "round $rounds: DELETE /v1/services/slow-svc with the token: HTTP ${st:-none} (want 200 within 5 s)"; }
  ((rounds < 200)) || break
  sleep 0.2
done
log "operators: $rounds rounds of healthz + create + delete while the slow clients ran, $bad failed"
assert_eq "$bad" 0 "operator calls that failed during the slow attack"

wait_exit "$SLOW_PID" 70 || fail "lynx-slowloris did not end"
slow_summary "$IT_DIR/slow-1.out"
assert_eq "$SL_connected" "$NCONN" "slow connections that connected"
assert_eq "$SL_open" 0 "slow connections still open when lynx-slowloris ended"
assert_eq "$SL_long" "$PER_CLIENT" "slow connections accepted, then closed by the server after the ${HEADER_MS} ms header timeout"
assert_eq "$SL_short" $((NCONN - PER_CLIENT)) "slow connections closed at once (over the per-client cap)"
v=$(metric lynx_coordinator_api_connections_refused_total 'reason="per_client"')
assert_eq "${v:-none}" $((NCONN - PER_CLIENT)) "lynx_coordinator_api_connections_refused_total{reason=\"per_client\"}"
v=$(metric lynx_coordinator_api_connections_timed_out_total 'phase="header"')
assert_eq "${v:-none}" "$PER_CLIENT" "lynx_coordinator_api_connections_timed_out_total{phase=\"header\"}"
api GET /healthz
assert_eq "$API_STATUS" 200 "GET /healthz after the attack"

# ---- 2. body trickle, and a watch longer than every timeout --------------------------
log "== 2. slow bodies from 127.0.0.3, and a 5 s watch (--http-conn-per-client 4, 2 s timeouts)"
COORD_PORT=$B_COORD_PORT API_PORT=$B_API_PORT COORD_STATE=$IT_DIR/state-b \
  start_coordinator --lease-ms 1000 --token-file "$IT_DIR/token" \
  --http-conn-per-client 4 --http-header-timeout-ms 2000 --http-body-timeout-ms 2000
B_PID=$COORD_PID
METRICS_PORT=$B_API_PORT

ver=$(curl -sf --max-time 5 "http://127.0.0.1:$B_API_PORT/v1/watch" | jq -r .version)
is_uint "$ver" || fail "GET /v1/watch: no version"
t0=$(now_ms)
curl -s --max-time 20 -o "$IT_DIR/watch.out" -w '%{http_code}' \
  "http://127.0.0.1:$B_API_PORT/v1/watch?since=$ver&timeout_ms=5000" >"$IT_DIR/watch.status" 2>&1 &
WATCH_PID=$!
track "$WATCH_PID" curl-watch

start_slow "$IT_DIR/slow-2.out" --port "$B_API_PORT" --source 127.0.0.3 \
  --conns 6 --interval-ms 500 --long-ms 1000 --duration-ms 30000 --mode body \
  --path /v1/services --header "$AUTH"
wait_exit "$SLOW_PID" 40 || fail "lynx-slowloris did not end"
slow_summary "$IT_DIR/slow-2.out"
assert_eq "$SL_open" 0 "slow bodies still open when lynx-slowloris ended"
assert_eq "$SL_long" 4 "slow bodies accepted, then closed by the server after the 2000 ms body timeout"
assert_eq "$SL_short" 2 "slow bodies closed at once (over the per-client cap of 4)"
v=$(metric lynx_coordinator_api_connections_timed_out_total 'phase="body"')
assert_eq "${v:-none}" 4 "lynx_coordinator_api_connections_timed_out_total{phase=\"body\"}"
v=$(metric lynx_coordinator_api_connections_refused_total 'reason="per_client"')
assert_eq "${v:-none}" 2 "lynx_coordinator_api_connections_refused_total{reason=\"per_client\"}"

wait_exit "$WATCH_PID" 25 || fail "the watch did not end"
dt=$(($(now_ms) - t0))
st=$(cat "$IT_DIR/watch.status")
[[ $st == 200 ]] || it_check_failed "the 5 s watch: HTTP ${st:-none} (want 200): $(head -c 300 "$IT_DIR/watch.out")"
assert_eq "$(jq -r .version "$IT_DIR/watch.out" 2>/dev/null)" "$ver" "version the 5 s watch answered at its timeout"
assert_ge "$dt" 5000 "ms the watch was held (its timeout_ms, past both 2 s timeouts)"

# ---- 3. shutdown --------------------------------------------------------------------
stop "$B_PID" 10
assert_eq "$WAIT_RC" 0 "coordinator B exit status on SIGTERM"
stop "$A_PID" 10
assert_eq "$WAIT_RC" 0 "coordinator A exit status on SIGTERM"
it_done
