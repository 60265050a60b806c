#!/usr/bin/env bash
# plugin_faults: a plug-in that crashes takes down nothing but itself
# (docs/writing-apps.md, "Faults").
#
# One agent (two CPU accelerators) runs three services: steady
# (sockperf-echo, built in), kv (the kv-lookup plug-in, a process of its
# own) and crashy (a plug-in whose process segfaults on every 100th
# request it takes). While sockperf loads steady and a client checks every
# kv answer, crashy is sent 320 requests:
#
#  1. crashy's process dies three times; each time the agent drops what it
#     had in hand (counted: lynx_agent_app_lost_requests_total), starts a
#     new process after a backoff (lynx_agent_app_restarts_total) and that
#     process takes the same instances over: crashy answers again, with
#     nothing it answered lost but the requests in hand;
#  2. steady and kv lose nothing: sockperf's every request answered, none
#     dropped by the frontend, every kv answer right, kv's process never
#     restarted; the agent keeps running and registered, and the
#     coordinator shows the faults; stopping the agent stops every plug-in
#     process with it.
# The other faults (an exit, a hang, a fork, a scribbled header, a slow
# start) are integration.plugin_faults_more.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init plugin_faults
it_require_coord
it_require python3 sockperf
pick_ports COORD_PORT API_PORT METRICS_PORT AGENT_METRICS P_STEADY P_KV P_CRASHY
IT_SOFT=1

BUILD=$(cd "$LYNX_BIN_DIR/.." && pwd)
PLUGINS=$BUILD/plugins
for p in kv-lookup crashy; do
  [[ -f $PLUGINS/$p.so ]] || fail "$PLUGINS/$p.so is missing: build first (make)"
done
FLAVOR=$(cat "$BUILD/lynx-test-flavor" 2>/dev/null || echo plain)
agent_metric() { curl -sf --max-time 5 "http://127.0.0.1:$AGENT_METRICS/metrics" |
  awk -v n="$1" -v m="$2" 'index($1, n "{") == 1 && index($1, m) { s += $NF; f = 1 } END { if (!f) exit 1; printf "%.0f\n", s }'; }
svc_metric() { metric "$1" "service=\"$2\""; }

start_coordinator
node_ids N1
start_node_agent "$N1" --cpu-accels 2 --app-load "$PLUGINS/kv-lookup.so,$PLUGINS/crashy.so" \
  --metrics "127.0.0.1:$AGENT_METRICS"
AGENT=$AGENT_PID
start_coord_frontend
serve_service steady "\"port\":$P_STEADY,\"app\":\"sockperf-echo\""
serve_service kv "\"port\":$P_KV,\"app\":\"kv-lookup\",\"app_config\":{\"entries\":{\"a\":\"1\",\"b\":\"2\",\"c\":\"3\"},\"miss\":\"-\"}"
# one instance: its every 100th request is the 100th it takes
serve_service crashy "\"port\":$P_CRASHY,\"app\":\"crashy\",\"app_config\":{\"crash_at\":100},\"placement\":{\"replicas\":1}"
for s in steady kv crashy; do
  end=$(($(now_ms) + $(ts_ms 10000)))
  until [[ $(api_json "/v1/services/$s" .state) == ready ]]; do
    (($(now_ms) < end)) || fail "service $s not ready: $(api_json "/v1/services/$s" '.state + ": " + .reason')"
    sleep 0.1
  done
done
kv_pids() { pgrep -f -- "--app-host $PLUGINS/kv-lookup.so" | sort | tr '\n' ' '; }
KV_PIDS=$(kv_pids)
[[ -n $KV_PIDS ]] || it_check_failed "kv-lookup runs in no process of its own"
[[ -n $(pgrep -f -- "--app-host $PLUGINS/crashy.so") ]] || it_check_failed "crashy runs in no process of its own"

# ---- 1 and 2: crashes under load --------------------------------------------------
log "== 1. crashy's process dies under load; steady and kv lose nothing"
S_RCV0=$(svc_metric lynx_frontend_received_total steady) || S_RCV0=0
S_RESP0=$(svc_metric lynx_frontend_responded_total steady) || S_RESP0=0
sockperf under-load -i 127.0.0.1 -p "$P_STEADY" -m 64 -t 8 --mps 2000 --reply-every 1 \
  --buffer-size 4194304 >"$IT_DIR/steady.out" 2>&1 </dev/null &
SP=$!
track "$SP" sockperf
# kv: 600 keys, every answer checked
python3 - "$P_KV" >"$IT_DIR/kv.out" 2>&1 <<'PY' &
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2.0)
want = {"a": "1", "b": "2", "c": "3", "zz": "-"}
ok = bad = 0
for i in range(600):
    k = list(want)[i % 4]
    s.sendto(k.encode(), ("127.0.0.1", int(sys.argv[1])))
    try:
        got = s.recv(100).decode()
    except socket.timeout:
        got = None
    if got == want[k]: ok += 1
    else: bad += 1; print("key %r: %r" % (k, got))
    time.sleep(0.01)
print("kv ok %d bad %d" % (ok, bad))
PY
KVP=$!
track "$KVP" kv-client
# crashy: 320 requests, one at a time; silence for those in hand at a crash
python3 - "$P_CRASHY" >"$IT_DIR/crashy.out" 2>&1 <<'PY'
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1.5)
answered = silent = wrong = 0
last_answered = -1
for i in range(320):
    m = b"req-%d" % i
    s.sendto(m, ("127.0.0.1", int(sys.argv[1])))
    try:
        while True:
            got = s.recv(100)
            if got == m: break
            # a late answer to an earlier request: skip it
    except socket.timeout:
        got = None
    if got == m: answered += 1; last_answered = i
    elif got is None: silent += 1
    else: wrong += 1
print("crashy answered %d silent %d wrong %d last %d" % (answered, silent, wrong, last_answered))
PY
wait "$KVP"
untrack "$KVP"
wait "$SP"
untrack "$SP"
read -r _ _ C_ANS _ C_SILENT _ C_WRONG _ C_LAST < <(grep '^crashy answered' "$IT_DIR/crashy.out")
log "crashy: answered $C_ANS, silent $C_SILENT, wrong $C_WRONG, last answered #$C_LAST"
restarts=$(agent_metric lynx_agent_app_restarts_total 'app="crashy"') || restarts=0
lost=$(agent_metric lynx_agent_app_lost_requests_total 'app="crashy"') || lost=0
assert_eq "$restarts" 3 "crashy's process started again after each of its 3 deaths"
assert_eq "$lost" 3 "requests in hand at crashy's deaths (one each), counted lost"
assert_eq "$C_SILENT" 3 "crashy's unanswered requests (those lost in hand)"
assert_eq "$C_WRONG" 0 "crashy's wrong answers"
assert_eq "$C_LAST" 319 "crashy answers after its last takeover"
if [[ $FLAVOR == plain ]]; then
  assert_log "$AGENT_LOG" "application 'crashy': its process killed by signal 11 (Segmentation fault)" \
    "the agent says how crashy's process died"
else # the sanitizers catch the fault and exit
  assert_log "$AGENT_LOG" "application 'crashy': its process " "the agent says crashy's process died"
fi
[[ $(grep -c "application 'crashy': process [0-9]* takes over 1 instance(s)" "$AGENT_LOG") == 3 ]] ||
  it_check_failed "no new process took crashy's instance over after each death"
# the others
assert_str "$(grep '^kv ok' "$IT_DIR/kv.out")" "kv ok 600 bad 0" "kv: every answer right through crashy's deaths"
assert_str "$(kv_pids)" "$KV_PIDS" "kv-lookup's process (never restarted)"
assert_eq "$(agent_metric lynx_agent_app_restarts_total 'app="kv-lookup"')" 0 "kv-lookup's restarts"
sockperf_stats "$IT_DIR/steady.out"
assert_gt "$SP_RCVD" 10000 "steady: sockperf's answers"
assert_eq "$SP_DUP" 0 "steady: duplicated answers"
for s in steady kv; do
  d=$(svc_metric lynx_frontend_dropped_total "$s") || d=0
  assert_eq "$d" 0 "service $s: requests the frontend dropped"
done
end=$(($(now_ms) + $(ts_ms 5000)))
while :; do
  rcv=$(svc_metric lynx_frontend_received_total steady) resp=$(svc_metric lynx_frontend_responded_total steady)
  ((resp - S_RESP0 >= rcv - S_RCV0 || $(now_ms) > end)) && break
  sleep 0.05
done
assert_eq $((resp - S_RESP0)) $((rcv - S_RCV0)) "steady: requests answered (of those received)"
# the coordinator shows it: on the node and on the service (heartbeats)
end=$(($(now_ms) + $(ts_ms 5000)))
until [[ $(api_json /v1/services/crashy '.app_faults[0].restarts // 0') == 3 ]]; do
  (($(now_ms) < end)) || { it_check_failed "GET /v1/services/crashy shows no 3 restarts: $(api_json /v1/services/crashy .app_faults)"; break; }
  sleep 0.1
done
assert_str "$(api_json /v1/services/crashy '.app_faults[0] | "\(.node) \(.lost)"')" "$N1 3" \
  "the service's faults: where, and the requests lost"
death=$(api_json "/v1/nodes/$N1" '.app_faults[0] | "\(.name): \(.last_death)"')
[[ $death == "crashy: killed by signal"* || ($FLAVOR != plain && $death == "crashy: "?*) ]] ||
  it_check_failed "GET /v1/nodes/$N1: app_faults: $(api_json "/v1/nodes/$N1" .app_faults)"
log "ok: the node says: $death"
[[ $(api_json /v1/services/steady 'has("app_faults")') == false ]] ||
  it_check_failed "steady shows faults it never had"
is_alive "$AGENT" || it_check_failed "the agent died"
assert_str "$(api_json "/v1/nodes/$N1" .state)" ready "the node stays ready"
assert_str "$(api_json /v1/services/crashy '.state')" ready "crashy is ready again"

kill -TERM "$AGENT"
wait_exit "$AGENT" 20 || it_check_failed "the agent did not stop"
sleep 0.2
assert_eq "$(pgrep -fc -- "--app-host $PLUGINS/" || true)" 0 "plug-in processes left after the agent stopped"
it_done
