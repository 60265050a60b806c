#!/usr/bin/env bash
# service_state: the API says whether a service is served and, when not,
# why (docs/api.md, "GET /v1/services").
#
#  1. An application no registered accelerator runs is refused with 422,
#     naming it and what they run (agents list what each accelerator runs).
#  2. An instance that fails to start on its agent (lenet, whose weights
#     the agent cannot load): the service is pending, with the agent's
#     reason.
#  3. A service whose UDP port another process holds: the frontend says
#     which port and why, once (then rate-limited), keeps trying, and the
#     API shows the service pending with that reason; once the port is free
#     the service becomes ready and answers, nothing restarted.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init service_state
it_require_coord
it_require python3
pick_ports COORD_PORT API_PORT METRICS_PORT UDP_PORT UDP_PORT2
IT_SOFT=1

# wait_reason NAME TEXT TIMEOUT_S: until service NAME's reason holds TEXT.
wait_reason() {
  local end=$(($(now_ms) + $3 * 1000))
  until [[ $(svc "$1" .reason) == *"$2"* ]]; do
    (($(now_ms) < end)) || { it_check_failed "service $1: no '$2' in its reason $3 s on: $(svc "$1" '.state + ": " + .reason')"; return 1; }
    sleep 0.1
  done
}

start_coordinator --lease-ms 3000
node_ids N1
# (its lenet weights are a file that does not exist: read at a lenet
# instance's start, section 2)
start_node_agent "$N1" --cpu-accels 1 --lenet-model "$IT_DIR/missing.bin"
start_coord_frontend
FE=$FRONTEND_PID FE_LOG=$FRONTEND_LOG

# ---- 1. an unknown app -------------------------------------------------------------
log "== 1. an application no accelerator runs"
api POST /v1/services -d "{\"name\":\"ghost\",\"port\":$UDP_PORT,\"app\":\"no-such-app\"}"
assert_eq "$API_STATUS" 422 "POST /v1/services with app no-such-app: HTTP status"
code=$(jq -r .error.code "$API_BODY") msg=$(jq -r .error.message "$API_BODY")
[[ $code == unknown_app && $msg == *"'no-such-app'"* && $msg == *sockperf-echo* ]] ||
  it_check_failed "the refusal names neither the app nor what runs: $(cat "$API_BODY")"
log "ok: refused: $msg"
api GET /v1/services/ghost
assert_eq "$API_STATUS" 404 "the refused service does not exist"

# ---- 2. an instance that cannot start ---------------------------------------------
log "== 2. an instance that fails on its agent"
# lenet loads its weights at an instance's start; this agent's are missing
api POST /v1/services -d "{\"name\":\"noweights\",\"port\":$UDP_PORT2,\"app\":\"lenet\"}"
assert_eq "$API_STATUS" 201 "POST /v1/services lenet: HTTP status"
wait_reason noweights "failed to start" 10
assert_eq "$(svc noweights '.state == "pending"' | grep -c true)" 1 "service noweights is pending"
[[ $(svc noweights .reason) == *"cannot load its weights"*"missing.bin"* ]] ||
  it_check_failed "the agent's reason is not in the API: $(svc noweights .reason)"
log "ok: noweights: $(svc noweights '.state + ": " + .reason')"
api DELETE /v1/services/noweights

# ---- 3. a port another process holds ----------------------------------------------
log "== 3. a UDP port another process holds"
python3 - "$UDP_PORT" "$IT_DIR/held" <<'PY' &
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", int(sys.argv[1])))
open(sys.argv[2], "w").close()
time.sleep(4)
PY
HOLDER=$!
track "$HOLDER" port-holder
until [[ -e $IT_DIR/held ]]; do sleep 0.05; done
api POST /v1/services -d "{\"name\":\"echo\",\"port\":$UDP_PORT,\"app\":\"sockperf-echo\"}"
assert_eq "$API_STATUS" 201 "POST /v1/services echo on a held port: HTTP status"
wait_reason echo "cannot bind" 5
reason=$(svc echo .reason)
[[ $(svc echo .state) == pending &&
   $reason == *"cannot bind UDP 127.0.0.1:$UDP_PORT: Address already in use"* &&
   $reason == frontend* ]] ||
  it_check_failed "service echo: $(svc echo '.state + ": " + .reason')"
log "ok: echo: $(svc echo '.state + ": " + .reason')"
ctl services | grep -q "pending.*cannot bind UDP 127.0.0.1:$UDP_PORT" ||
  it_check_failed "lynxctl services does not show why: $(ctl services)"
grep -q "service echo: cannot bind UDP 127.0.0.1:$UDP_PORT: Address already in use" "$FE_LOG" ||
  it_check_failed "the frontend's log does not name the port: $(grep echo "$FE_LOG" | tail -3)"
wait_exit "$HOLDER" 10
# freed: ready and answering, within the frontend's retry backoff
end=$(($(now_ms) + 20000))
until [[ $(svc echo .state) == ready ]]; do
  (($(now_ms) < end)) || { it_check_failed "echo not ready 20 s after its port was freed: $(svc echo '.state + ": " + .reason')"; break; }
  sleep 0.2
done
"$LYNX_BIN_DIR/lynx-udp-probe" --host 127.0.0.1 --port "$UDP_PORT" --timeout-ms 5000 \
  >"$IT_DIR/probe.out" 2>&1 || it_check_failed "echo does not answer: $(cat "$IT_DIR/probe.out")"
n=$(grep -c "cannot bind UDP 127.0.0.1:$UDP_PORT" "$FE_LOG")
assert_le "$n" 6 "frontend log lines about the held port (said once, then rate-limited)"
assert_log "$FE_LOG" "service echo: listening now" "the frontend says it listens now"
assert_eq "$(grep -cF ': starting in ' "$FE_LOG")" 1 "frontend starts (no restart)"
it_done
