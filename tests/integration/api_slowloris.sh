#!/usr/bin/env bash
# api_slowloris: slow, stuck or leaking clients cannot lock operators out of
# the coordinator's JSON API or the daemons' /metrics endpoints, even from
# the operator's own address (docs/api.md "Connections").
#
#  1. Defaults. lynx-slowloris opens 300 connections from 127.0.0.1 (the
#     address lynxctl, the console's tunnel, a local Prometheus and every
#     script share) to the coordinator's API, and as many to an agent's and
#     a frontend's /metrics, each sending a partial request and one more
#     byte every 5 s (what a stuck script or a client leaking connections
#     does). Meanwhile /healthz, /readyz and an authenticated service create
#     + delete on the API, and /healthz + /metrics of both daemons, all from
#     127.0.0.1, are answered every time, each within curl --max-time 5.
#     The API holds all 300 (under its caps) until the header timeout
#     (10 s) closes them, however the bytes trickle; the /metrics endpoints
#     (1024 connections, 256 per address) shed the oldest incomplete one
#     for each of the 44 over the per-address cap and for each operator's
#     request meanwhile, and close the rest at their header timeout (10 s);
#     each counts what it shed and timed out.
#  2. Caps reached and kept full: --http-conn-max 48 --http-conn-per-client
#     32 --http-header-timeout-ms 3000; 300 trickling connections from
#     127.0.0.1 (over its per-client cap) and 31 from 127.0.0.2 (under it,
#     but together over the total) that reopen whatever is closed. The
#     operators from 127.0.0.1 are answered every time; the coordinator
#     shed incomplete connections at both caps and refused none.
#  3. --http-conn-per-client 4 --http-header-timeout-ms 2000
#     --http-body-timeout-ms 2000: six clients from 127.0.0.3 send whole
#     headers (with the token) announcing a 60000-byte body for POST
#     /v1/services (under --body-max) and trickle the body; the fifth and
#     sixth take the first two's places, the other four are closed after the
#     body timeout (counted phase="body"). A /v1/watch long poll of 5 s,
#     longer than both timeouts, is answered 200 with its version (a request
#     being answered has no deadline).
#  4. SIGTERM: every daemon exits 0.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init api_slowloris
it_require curl jq
it_require_coord
SLOW=$LYNX_BIN_DIR/lynx-slowloris
[[ -x $SLOW ]] || fail "$SLOW is missing: build first (make)"
pick_ports COORD_PORT API_PORT B_COORD_PORT B_API_PORT C_COORD_PORT C_API_PORT \
  SVC_PORT AGENT_PORT AGENT_METRICS METRICS_PORT UDP_PORT
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

# status_of URL [CURL_ARG...]: the HTTP status of one call within 5 s
# ("000" when nothing answered). A connection closed with no answer at
# all (curl's exit 52: shed before its request was in) is tried again,
# twice at most, as lynxctl does (docs/api.md "Connections"); each resend
# a line of $IT_DIR/resent.
status_of() {
  local url=$1 st try
  shift
  for try in 1 2 3; do
    st=$(curl -s --max-time 5 -o /dev/null -w '%{http_code}' "$@" "$url" 2>/dev/null)
    (($? == 52)) || break
    ((try < 3)) && echo "$url" >>"$IT_DIR/resent"
  done
  echo "$st"
}

# operators API ROUND [DAEMON_PORT...]: one round of what operators ask
# from 127.0.0.1: the API's /healthz, /readyz, an authenticated service
# create and delete, and each daemon's /healthz and /metrics. Counts the
# calls not answered as asked in BAD.
operators() {
  local api=http://127.0.0.1:$1 round=$2 st p
  shift 2
  local svc='{"name":"slow-svc","port":'$SVC_PORT',"app":"echo","slots":64}'
  check() { # WANT WHAT STATUS
    [[ $3 == "$1" ]] && return 0
    BAD=$((BAD + 1))
    it_check_failed "round $round: $2: HTTP ${3:-none} (want $1 within 5 s)"
  }
  check 200 "GET /healthz" "$(status_of "$api/healthz")"
  check 200 "GET /readyz" "$(status_of "$api/readyz")"
  check 201 "POST /v1/services with the token" \
    "$(status_of "$api/v1/services" -X POST -H "$AUTH" -d "$svc")"
  check 200 "DELETE /v1/services/slow-svc with the token" \
    "$(status_of "$api/v1/services/slow-svc" -X DELETE -H "$AUTH")"
  for p in "$@"; do
    check 200 "GET :$p/healthz" "$(status_of "http://127.0.0.1:$p/healthz")"
    check 200 "GET :$p/metrics" "$(status_of "http://127.0.0.1:$p/metrics")"
  done
}

# ---- 1. the operator's own address, defaults ----------------------------------
log "== 1. 300 trickling connections from 127.0.0.1 to each of the API and two /metrics (defaults)"
start_coordinator --lease-ms 1000 --token-file "$IT_DIR/token"
A_PID=$COORD_PID
start_agent --metrics "127.0.0.1:$AGENT_METRICS" --cpu-accels 1
start_frontend
HEADER_MS=10000  # the header timeout of the API and of /metrics (docs/api.md)
PROM_PER_CLIENT=256 # /metrics: 1024 connections, a quarter per address
NCONN=300
# (a connection is "long" when it lived at least --long-ms from when its
# connect() returned: half the timeout, as on a loaded machine that moment
# may come after the server started the connection's deadline; a shed one
# is closed within milliseconds)
SLOW_PIDS=()
for target in "API:$API_PORT" "agent:$AGENT_METRICS" "frontend:$METRICS_PORT"; do
  start_slow "$IT_DIR/slow-1-${target%%:*}.out" --port "${target#*:}" \
    --source 127.0.0.1 --conns "$NCONN" --interval-ms 5000 \
    --long-ms $((HEADER_MS / 2)) --duration-ms 30000 --mode header
  SLOW_PIDS+=("$SLOW_PID")
done

rounds=0 BAD=0
while is_alive "${SLOW_PIDS[0]}" || ((rounds < 3)); do
  rounds=$((rounds + 1))
  operators "$API_PORT" "$rounds" "$AGENT_METRICS" "$METRICS_PORT"
  ((rounds < 200)) || break
  sleep 0.2
done
log "operators: $rounds rounds while the slow clients ran, $BAD calls failed"
assert_eq "$BAD" 0 "operator calls that failed during the slow attack on 127.0.0.1"

for pid in "${SLOW_PIDS[@]}"; do
  wait_exit "$pid" 40 || fail "lynx-slowloris did not end"
done
slow_summary "$IT_DIR/slow-1-API.out"
assert_eq "$SL_connected" "$NCONN" "slow connections to the API that connected"
assert_eq "$SL_open" 0 "slow connections to the API still open when lynx-slowloris ended"
assert_eq "$SL_long" "$NCONN" "slow connections to the API held until the ${HEADER_MS} ms header timeout"
METRICS_PORT_SAVED=$METRICS_PORT
METRICS_PORT=$API_PORT # metric() scrapes the coordinator's /metrics
v=$(metric lynx_coordinator_api_connections_timed_out_total 'phase="header"')
assert_eq "${v:-none}" "$NCONN" "lynx_coordinator_api_connections_timed_out_total{phase=\"header\"}"
v=$(metric lynx_coordinator_api_connections_refused_total)
assert_eq "${v:-none}" 0 "lynx_coordinator_api_connections_refused_total"
v=$(metric lynx_coordinator_api_connections_max)
assert_eq "${v:-none}" 4096 "lynx_coordinator_api_connections_max (--http-conn-max's default)"
for d in agent frontend; do
  if [[ $d == agent ]]; then METRICS_PORT=$AGENT_METRICS; else METRICS_PORT=$METRICS_PORT_SAVED; fi
  slow_summary "$IT_DIR/slow-1-$d.out"
  assert_eq "$SL_connected" "$NCONN" "slow connections to the $d's /metrics that connected"
  assert_eq "$SL_open" 0 "slow connections to the $d's /metrics still open at the end"
  # the 44 over the per-address cap each shed one (the oldest), and so did
  # each of the operators' requests while the cap was full; every other
  # one was closed at the header timeout
  shed=$(metric "lynx_${d}_metrics_connections_shed_total" 'reason="per_client",kind="incomplete"')
  assert_ge "${shed:-0}" $((NCONN - PROM_PER_CLIENT)) "lynx_${d}_metrics_connections_shed_total{reason=\"per_client\",kind=\"incomplete\"}"
  assert_ge "$SL_short" $((NCONN - PROM_PER_CLIENT)) "slow connections to the $d's /metrics shed at once for newer ones"
  v=$(metric "lynx_${d}_metrics_connections_timed_out_total" 'phase="header"')
  assert_eq $((${shed:-0} + ${v:-0})) "$NCONN" "slow connections to the $d's /metrics shed or timed out (lynx_${d}_metrics_connections_shed_total + _timed_out_total)"
  v=$(metric "lynx_${d}_metrics_connections_per_client_max")
  assert_eq "${v:-none}" "$PROM_PER_CLIENT" "lynx_${d}_metrics_connections_per_client_max"
done
METRICS_PORT=$METRICS_PORT_SAVED
stop_daemons

# ---- 2. both caps full, and kept full ------------------------------------------
log "== 2. 300 + 31 reopening connections from 127.0.0.1 and 127.0.0.2 (--http-conn-max 48, per client 32)"
COORD_PORT=$C_COORD_PORT API_PORT=$C_API_PORT COORD_STATE=$IT_DIR/state-c \
  start_coordinator --lease-ms 1000 --token-file "$IT_DIR/token" \
  --http-conn-max 48 --http-conn-per-client 32 --http-header-timeout-ms 3000
C_PID=$COORD_PID
start_slow "$IT_DIR/slow-2a.out" --port "$C_API_PORT" --source 127.0.0.1 \
  --conns 300 --interval-ms 500 --long-ms 1500 --duration-ms 8000 \
  --mode header --reopen 1
SLOW_A=$SLOW_PID
start_slow "$IT_DIR/slow-2b.out" --port "$C_API_PORT" --source 127.0.0.2 \
  --conns 31 --interval-ms 500 --long-ms 1500 --duration-ms 8000 \
  --mode header --reopen 1
SLOW_B=$SLOW_PID
rounds=0 BAD=0
while is_alive "$SLOW_A" || is_alive "$SLOW_B"; do
  rounds=$((rounds + 1))
  operators "$C_API_PORT" "$rounds"
  ((rounds < 200)) || break
  sleep 0.2
done
log "operators: $rounds rounds while the caps were full, $BAD calls failed, $(cat "$IT_DIR/resent" 2>/dev/null | wc -l) requests sent again after a close with no answer"
assert_eq "$BAD" 0 "operator calls that failed while both caps were full"
assert_ge "$rounds" 3 "rounds of operator calls while both caps were full"
wait_exit "$SLOW_A" 20 || fail "lynx-slowloris (127.0.0.1) did not end"
wait_exit "$SLOW_B" 20 || fail "lynx-slowloris (127.0.0.2) did not end"
slow_summary "$IT_DIR/slow-2a.out"
assert_gt "$SL_reopened" 0 "connections from 127.0.0.1 reopened after the server shed them"
METRICS_PORT=$C_API_PORT
v=$(metric lynx_coordinator_api_connections_shed_total 'reason="per_client",kind="incomplete"')
assert_gt "${v:-0}" 0 "lynx_coordinator_api_connections_shed_total{reason=\"per_client\",kind=\"incomplete\"}"
v=$(metric lynx_coordinator_api_connections_shed_total 'reason="total",kind="incomplete"')
assert_gt "${v:-0}" 0 "lynx_coordinator_api_connections_shed_total{reason=\"total\",kind=\"incomplete\"}"
v=$(metric lynx_coordinator_api_connections_refused_total)
assert_eq "${v:-none}" 0 "lynx_coordinator_api_connections_refused_total (nobody refused: there was always one to shed)"
v=$(metric lynx_coordinator_api_connections)
assert_le "${v:-99999}" 48 "lynx_coordinator_api_connections after the attack (at most --http-conn-max)"

# ---- 3. body trickle, and a watch longer than every timeout --------------------------
log "== 3. slow bodies from 127.0.0.3, and a 5 s watch (--http-conn-per-client 4, 2 s timeouts)"
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

start_slow "$IT_DIR/slow-3.out" --port "$B_API_PORT" --source 127.0.0.3 \
  --conns 6 --interval-ms 500 --long-ms 1000 --duration-ms 30000 --mode body \
  --path /v1/services --header "$AUTH"
wait_exit "$SLOW_PID" 40 || fail "lynx-slowloris did not end"
slow_summary "$IT_DIR/slow-3.out"
assert_eq "$SL_open" 0 "slow bodies still open when lynx-slowloris ended"
assert_eq "$SL_long" 4 "slow bodies accepted, then closed by the server after the 2000 ms body timeout"
assert_eq "$SL_short" 2 "slow bodies shed at once (the two oldest, for the two over the per-client cap of 4)"
v=$(metric lynx_coordinator_api_connections_timed_out_total 'phase="body"')
assert_eq "${v:-none}" 4 "lynx_coordinator_api_connections_timed_out_total{phase=\"body\"}"
v=$(metric lynx_coordinator_api_connections_shed_total 'reason="per_client",kind="incomplete"')
assert_eq "${v:-none}" 2 "lynx_coordinator_api_connections_shed_total{reason=\"per_client\",kind=\"incomplete\"}"

wait_exit "$WATCH_PID" 25 || fail "the watch did not end"
dt=$(($(now_ms) - t0))
st=$(cat "$IT_DIR/watch.status")
[[ $st == 200 ]] || it_check_failed "the 5 s watch: HTTP ${st:-none} (want 200): $(head -c 300 "$IT_DIR/watch.out")"
assert_eq "$(jq -r .version "$IT_DIR/watch.out" 2>/dev/null)" "$ver" "version the 5 s watch answered at its timeout"
assert_ge "$dt" 5000 "ms the watch was held (its timeout_ms, past both 2 s timeouts)"

# ---- 4. shutdown --------------------------------------------------------------------
for pid in "$B_PID" "$C_PID" "$A_PID"; do
  stop "$pid" 10
  assert_eq "$WAIT_RC" 0 "coordinator (pid $pid) exit status on SIGTERM"
done
it_done
