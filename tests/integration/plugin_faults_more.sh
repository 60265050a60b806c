#!/usr/bin/env bash
# plugin_faults_more: the faults of a plug-in beyond a crash under load
# (integration.plugin_faults), each contained to its plug-in
# (docs/writing-apps.md, "Faults"). One agent, a built-in service steady
# beside crashy (tests/plugins/crashy.c) configured to fail each way:
#
#  3. an exit (status 3): taken over after its exit status;
#  4. a hang: crashy holds its thread; past --stall-ms the agent kills its
#     process and a new one takes over, while steady, on the same
#     accelerators, never leaves dispatch;
#  5. what a plug-in could do to hide or harm: one that forks a child
#     holding its socket and then crashes (the agent sees the death, and
#     the child goes with its process group); one that writes a wild
#     geometry over its region's header and crashes (the agent keeps its
#     own, restores the header, takes over); one whose start takes 7 s
#     (the service says so and nothing waits for it: steady answers
#     throughout); stopping the agent stops every plug-in process with it;
#  6. static mode, 40 instances of one plug-in (more takeover requests
#     than its socket held at once when they were sent whole): one
#     crashes, and a new process takes all 40 over.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init plugin_faults_more
it_require_coord
it_require python3 sockperf
pick_ports COORD_PORT API_PORT METRICS_PORT P_STEADY P_EXIT P_HANG P_FORK P_SCRIB P_SLOW
IT_SOFT=1

BUILD=$(cd "$LYNX_BIN_DIR/.." && pwd)
PLUGINS=$BUILD/plugins
[[ -f $PLUGINS/crashy.so ]] || fail "$PLUGINS/crashy.so is missing: build first (make)"

start_coordinator
node_ids N1
start_node_agent "$N1" --cpu-accels 2 --app-load "$PLUGINS/crashy.so" --stall-ms 500
AGENT=$AGENT_PID
start_coord_frontend
serve_service steady "\"port\":$P_STEADY,\"app\":\"sockperf-echo\""
end=$(($(now_ms) + $(ts_ms 10000)))
until [[ $(api_json /v1/services/steady .state) == ready ]]; do
  (($(now_ms) < end)) || fail "service steady not ready: $(api_json /v1/services/steady '.state + ": " + .reason')"
  sleep 0.1
done

# ---- 3. an exit ---------------------------------------------------------------------------
log "== 3. a plug-in process that exits"
serve_service exits "\"port\":$P_EXIT,\"app\":\"crashy\",\"app_config\":{\"crash_at\":5,\"how\":\"exit\"},\"placement\":{\"replicas\":1}"
# five requests: the fifth ends the process; then requests until one is
# answered again (the takeover)
python3 - "$P_EXIT" <<'PY' >"$IT_DIR/exit.out" 2>&1
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(0.5)
def ask(i):
    s.sendto(b"x%d" % i, ("127.0.0.1", int(sys.argv[1])))
    try:
        return s.recv(100) == b"x%d" % i
    except socket.timeout:
        return False
before = sum(ask(i) for i in range(5))
end, after = time.time() + 10, False
i = 5
while not after and time.time() < end:
    after = ask(i); i += 1
print("before %d after %d" % (before, after))
PY
wait_log "$AGENT_LOG" "application 'crashy': its process exited with status 3" 5 1 "$AGENT"
assert_str "$(cat "$IT_DIR/exit.out")" "before 4 after 1" "the exiting plug-in: 4 answers before its exit, answers after its takeover"
api DELETE /v1/services/exits

# ---- 4. a hang ------------------------------------------------------------------------
log "== 4. a plug-in that hangs"
serve_service hangs "\"port\":$P_HANG,\"app\":\"crashy\",\"app_config\":{\"crash_at\":3,\"how\":\"hang\"},\"placement\":{\"replicas\":1}"
# ask PORT TAG N TIMEOUT_S: N requests one at a time; how many answered
cat >"$IT_DIR/ask.py" <<'PY'
import socket, sys
port, tag, n, t = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(t)
got = 0
for i in range(n):
    m = ("%s%d" % (tag, i)).encode()
    s.sendto(m, ("127.0.0.1", port))
    try:
        while s.recv(100) != m:
            pass
        got += 1
    except socket.timeout:
        pass
print(got)
PY
takeovers=$(grep -c "application 'crashy': process [0-9]* takes over" "$AGENT_LOG")
# three requests: the third holds the instance's thread
python3 "$IT_DIR/ask.py" "$P_HANG" h 3 0.4 >"$IT_DIR/hang-before.out" &
HP=$!
track "$HP" hang-client
# steady, on the same accelerators, through the hang and its kill
run_sockperf "$IT_DIR/steady-hang.out" ping-pong -i 127.0.0.1 -p "$P_STEADY" -m 64 -t 2
check_sockperf "$IT_DIR/steady-hang.out"
wait "$HP"
untrack "$HP"
assert_str "$(cat "$IT_DIR/hang-before.out")" 2 "the hanging plug-in: answers before its hang"
wait_log "$AGENT_LOG" "application 'crashy': its process was killed: it hung" 5 1 "$AGENT"
assert_log "$AGENT_LOG" "application 'crashy': it hung: instance" "the agent says crashy hung and killed it"
wait_log "$AGENT_LOG" "application 'crashy': process" 15 $((takeovers + 1)) "$AGENT"
assert_str "$(python3 "$IT_DIR/ask.py" "$P_HANG" a 1 2)" 1 "the hanging plug-in answers after its takeover"
! grep -q "the application stopped consuming" "$AGENT_LOG" ||
  it_check_failed "an accelerator was reported stalled for a plug-in's hang"
assert_str "$(api_json /v1/accelerators '[.items[].health.dispatchable] | all')" true \
  "every accelerator dispatchable"
api DELETE /v1/services/hangs

# ---- 5. what a plug-in could do to hide or harm ----------------------------------------
log "== 5. a plug-in that forks, one that scribbles its header, one whose start is slow"
# (deaths so far keep the backoff up: each case waits for its takeover)
for how in fork scribble; do
  port=$P_FORK
  [[ $how == scribble ]] && port=$P_SCRIB
  serve_service "$how" "\"port\":$port,\"app\":\"crashy\",\"app_config\":{\"crash_at\":3,\"how\":\"$how\"},\"placement\":{\"replicas\":1}"
  takeovers=$(grep -c "application 'crashy': process [0-9]* takes over" "$AGENT_LOG")
  assert_str "$(python3 "$IT_DIR/ask.py" "$port" "$how" 3 0.4)" 2 "$how: answers before its crash"
  wait_log "$AGENT_LOG" "application 'crashy': process" 35 $((takeovers + 1)) "$AGENT"
  end=$(($(now_ms) + $(ts_ms 5000)))
  until [[ $(python3 "$IT_DIR/ask.py" "$port" "a$how" 1 0.5) == 1 ]]; do
    (($(now_ms) < end)) || { it_check_failed "$how: no answer after its takeover"; break; }
  done
  log "ok: $how: taken over, answers again"
  api DELETE "/v1/services/$how"
done
assert_log "$AGENT_LOG" "application 'crashy': its process wrote over a region's header (scribble): restored" \
  "the agent restored the header the plug-in wrote over"
[[ $(pgrep -fc -- "--app-host $PLUGINS/crashy.so") == 1 ]] ||
  it_check_failed "crashy's forked child outlived its process: $(pgrep -fa -- "--app-host $PLUGINS/crashy.so")"
is_alive "$AGENT" || fail "the agent died"
# a start of 7 s: the agent's loop goes on (steady is answered meanwhile),
# the start is cut at 5 s and the service says why
api POST /v1/services -d "{\"name\":\"slow\",\"port\":$P_SLOW,\"app\":\"crashy\",\"app_config\":{\"start_ms\":7000},\"placement\":{\"replicas\":1}}"
assert_eq "$API_STATUS" 201 "POST a service whose start takes 7 s"
run_sockperf "$IT_DIR/steady-slow.out" ping-pong -i 127.0.0.1 -p "$P_STEADY" -m 64 -t 3
check_sockperf "$IT_DIR/steady-slow.out"
end=$(($(now_ms) + $(ts_ms 10000)))
until [[ $(api_json /v1/services/slow .reason) == *"start took longer than 5 s"* ]]; do
  (($(now_ms) < end)) || { it_check_failed "slow: its reason: $(api_json /v1/services/slow '.state + ": " + .reason')"; break; }
  sleep 0.2
done
log "ok: slow: $(api_json /v1/services/slow '.state + ": " + .reason')"
assert_str "$(api_json "/v1/nodes/$N1" .state)" ready "the node stays ready through the slow start"
api DELETE /v1/services/slow
kill -TERM "$AGENT"
wait_exit "$AGENT" 20 || it_check_failed "the agent did not stop"
sleep 0.2
assert_eq "$(pgrep -fc -- "--app-host $PLUGINS/" || true)" 0 "plug-in processes left after the agent stopped"

# ---- 6. static mode, many instances ----------------------------------------------------
log "== 6. static mode: 40 instances of a plug-in, one crashes"
pick_ports AGENT_PORT UDP_PORT METRICS2
METRICS_PORT=$METRICS2
start_agent --cpu-accels 40 --mqueues 1 --work-mode sleep --app crashy --app-load "$PLUGINS/crashy.so" \
  --app-config '{"crash_at": 3}'
start_frontend
# requests go round the 40 instances: the first to take its third ends the
# process, past 80 answers
answered=$(python3 "$IT_DIR/ask.py" "$UDP_PORT" s 90 0.4)
assert_ge "$answered" 80 "static: answers before the crash"
wait_log "$AGENT_LOG" "application 'crashy': process" 10 1 "$AGENT_PID"
assert_log "$AGENT_LOG" "takes over 40 instance(s)" "static: a new process takes all 40 instances over"
end=$(($(now_ms) + $(ts_ms 5000)))
until [[ $(python3 "$IT_DIR/ask.py" "$UDP_PORT" t 1 0.5) == 1 ]]; do
  (($(now_ms) < end)) || { it_check_failed "static: no answer after the takeover"; break; }
done
log "ok: static: answers after the takeover"
stop "$FRONTEND_PID" 10
stop "$AGENT_PID" 10
it_done
