#!/usr/bin/env bash
# tcp_service: TCP services through the frontend (docs/tcp-services.md),
# driven by lynx-tcp-load, which checks every answer byte for byte and in
# order on its own connection.
#
#  1. len32 echo with 1, 100 and 2,000 concurrent connections: every answer
#     right; afterwards no connection is left open.
#  2. clients that close with requests in flight: the frontend stays up and
#     accounts for every request (answered, or dropped as client_gone).
#     Frames up to the 1 MiB cap (msg_max) through the rings' large-message
#     areas: every size from empty to 1 MiB, in order, byte for byte.
#  3. bad clients: a length word of 0xFFFFFFFF and a frame larger than the
#     cap each get their connection closed, counted as oversize; a client
#     that never reads its answers is closed as a slow reader once 4 MiB of
#     them wait; well-behaved clients are served right after.
#  4. fixed framing (fixed:64): 64-byte messages without length words.
#  5. coordinator mode: `lynxctl service create --proto tcp` is served, with
#     1 MiB frames by default; a framing on a udp service and fixed frames
#     longer than msg_max are refused with a clear 400.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init tcp_service
it_require curl timeout jq
pick_ports AGENT_PORT TCP_PORT METRICS_PORT COORD_PORT API_PORT SVC_PORT

LOAD=$LYNX_BIN_DIR/lynx-tcp-load

# load NAME ARGS...: runs lynx-tcp-load against $TCP_PORT; fails on exit != 0
load() {
  local name=$1 out
  shift
  out=$IT_DIR/load-$name.out
  timeout -k 3 "$(ts_s 60)" "$LOAD" --target "127.0.0.1:${LOAD_PORT:-$TCP_PORT}" "$@" \
    >"$out" 2>&1 || { cat "$out"; it_check_failed "lynx-tcp-load $name: $*"; return 1; }
  log "$(tail -1 "$out")"
}

# tcp_metric EVENT: lynx_frontend_tcp_connections_total{event=EVENT}
tcp_metric() { metric lynx_frontend_tcp_connections_total "event=\"$1\""; }

start_frontend_tcp() {
  spawn_daemon lynx-frontend frontend "" --agent "127.0.0.1:$AGENT_PORT" \
    --tcp "127.0.0.1:$TCP_PORT" --metrics "127.0.0.1:$METRICS_PORT" "$@"
  FRONTEND_PID=$SPAWN_PID FRONTEND_LOG=$SPAWN_LOG
  wait_log "$FRONTEND_LOG" "serving TCP" 10 1 "$FRONTEND_PID"
}

start_agent --app echo --slots 256 --slot-size 2048
start_frontend_tcp

# ---- 1. len32 echo at 1, 100, 2000 connections ---------------------------------
load one --conns 1 --messages 2000 --window 8 --size-max 2000 --seed 1
load hundred --conns 100 --messages 100 --window 4 --size-max 2000 --seed 2
load twothousand --conns 2000 --messages 10 --window 2 --size-max 512 --seed 3 \
  --timeout-ms 50000
acc=$(tcp_metric accepted) || fail "no tcp metrics"
assert_ge "$acc" 2101 "connections accepted"
for _ in $(seq 50); do
  open=$(metric lynx_frontend_tcp_clients) || fail "no tcp_clients gauge"
  ((open == 0)) && break
  sleep 0.1
done
assert_eq "$open" 0 "connections still open after the clients left"
# large frames: 2 KiB slots, the agent's default cap of 1 MiB
load large --conns 4 --messages 40 --window 4 --size-max 1048576 --seed 9 \
  --timeout-ms 50000

# ---- 2. clients leaving with requests in flight ----------------------------------
load disconnect --conns 50 --mode disconnect --window 16 --size-max 1000 --seed 4
sleep 1
rcv=$(metric lynx_frontend_received_total) || fail "no received_total"
rsp=$(metric lynx_frontend_responded_total) || fail "no responded_total"
gone=$(metric lynx_frontend_dropped_total 'reason="client_gone"') || fail "no client_gone"
log "requests received $rcv, answered $rsp, answers whose client had gone $gone"
assert_eq "$((rsp + gone))" "$rcv" "received = answered + client_gone"
assert_gt "$gone" 0 "answers discarded because their client had gone"
is_alive "$FRONTEND_PID" || fail "frontend died"

# ---- 3. bad clients ----------------------------------------------------------------
over0=$(tcp_metric oversize)
load garbage --conns 10 --mode garbage
load oversize --conns 10 --mode oversize --size-max 1048577
over=$(tcp_metric oversize)
assert_eq "$((over - over0))" 20 "connections closed for oversize frames"
# a client that never reads: 16 MB of answers against a 4 MiB bound
load slowreader --conns 2 --mode slowreader --messages 8000 --size-max 2000
slow=$(tcp_metric slow_reader)
assert_eq "$slow" 2 "connections closed as slow readers"
load after-bad --conns 10 --messages 100 --window 4 --size-max 2000 --seed 5
for r in ring_full flow_full no_mqueue tag_full oversize write_error expired \
  lost in_doubt; do
  v=$(metric lynx_frontend_dropped_total "reason=\"$r\"") || fail "no drop counter $r"
  assert_eq "$v" 0 "requests dropped ($r)"
done
assert_eq "$(grep -cF ': starting in ' "$FRONTEND_LOG")" 1 "frontend starts (no restart)"
stop "$FRONTEND_PID"; assert_eq "$WAIT_RC" 0 "frontend exit status"

# ---- 4. fixed framing ---------------------------------------------------------------
start_frontend_tcp --framing fixed:64
load fixed --conns 20 --messages 200 --window 4 --framing fixed:64 --seed 6
stop "$FRONTEND_PID"; assert_eq "$WAIT_RC" 0 "frontend exit status"
stop "$AGENT_PID"; assert_eq "$WAIT_RC" 0 "agent exit status"

# ---- 5. coordinator mode --------------------------------------------------------------
start_coordinator --lease-ms 3000
node_ids N1
start_node_agent "$N1" --transport tcp
start_coord_frontend
ctl service create --name tcpecho --port "$SVC_PORT" --app echo --proto tcp \
  >/dev/null || fail "lynxctl service create --proto tcp failed"
wait_log "$FRONTEND_LOG" "on TCP 127.0.0.1:$SVC_PORT" 10 1 "$FRONTEND_PID"
for _ in $(seq 100); do
  n=$(grep -c 'in dispatch over tcp' "$FRONTEND_LOG")
  ((n >= 2)) && break
  sleep 0.05
done
LOAD_PORT=$SVC_PORT load coord --conns 20 --messages 100 --window 4 --size-max 2000 --seed 7
LOAD_PORT=$SVC_PORT load coord-large --conns 2 --messages 20 --window 4 \
  --size-max 1048576 --seed 10 --timeout-ms 50000
api POST /v1/services -H 'Content-Type: application/json' \
  -d '{"name":"bad","port":1,"app":"echo","framing":"len32"}' || fail "API down"
assert_eq "$API_STATUS" 400 "framing on a udp service"
grep -q 'framing' "$API_BODY" || it_check_failed "the 400 does not name the field: $(cat "$API_BODY")"
api POST /v1/services -H 'Content-Type: application/json' \
  -d '{"name":"bad","port":1,"app":"echo","proto":"tcp","framing":{"fixed":100000},"msg_max":50000}' ||
  fail "API down"
assert_eq "$API_STATUS" 400 "fixed framing longer than msg_max"
grep -q 'msg_max' "$API_BODY" || it_check_failed "the 400 does not name msg_max: $(cat "$API_BODY")"
it_done
