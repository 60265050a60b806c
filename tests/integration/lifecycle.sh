#!/usr/bin/env bash
# lifecycle: starting, stopping and losing the daemons.
#
#  1. SIGTERM to the frontend while sockperf under-load runs: it drains and
#     exits 0 within 5 s.
#  2. A new frontend takes over the same agent's rings and serves.
#  3. SIGTERM to the agent while that frontend is attached: the agent exits 0
#     and removes its /dev/shm/lynx-* regions; the frontend stays up and
#     takes the accelerators out of dispatch.
#  4. A new agent on the same port: the frontend reconnects by itself and
#     serves again.
#  5. kill -9 of the agent: the frontend stays up, logs that the accelerators
#     left dispatch, counts datagrams as dropped{no_mqueue}.
#     An agent of another node id started meanwhile leaves the dead agent's
#     region files alone: each agent cleans only its own node id's.
#  6. A new agent on the same port: it removes the dead agent's regions, and
#     the frontend serves again (sockperf gets answers) without a restart.
#  7. A frontend started before its agent retries until the agent is up,
#     then serves.
#  8. Garbage on the agent's control port (text, an undecodable frame, a
#     length header announcing 100 MB): the agent closes that connection with
#     a logged reason and stays up; the attached frontend is unaffected.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init lifecycle
it_require sockperf curl timeout
[[ -x $LYNX_UDP_FUZZ ]] || fail "$LYNX_UDP_FUZZ is missing: build first (make)"
pick_ports AGENT_PORT UDP_PORT METRICS_PORT

# pingpong NAME: a short sockperf ping-pong that must get every answer.

# expect_regions PID N: agent PID has N region files (shm only: tcp regions
# are anonymous memory that goes with the process).
expect_regions() {
  local n
  [[ $IT_TRANSPORT == shm ]] || return 0
  n=$(agent_shm "$1" | wc -l)
  assert_eq "$n" "$2" "region files of agent $1"
}

# ---- 1. SIGTERM the frontend under load ------------------------------------
log "== 1. SIGTERM to the frontend under load"
start_agent
A1=$AGENT_PID A1_LOG=$AGENT_LOG
expect_regions "$A1" 2
start_frontend
F1=$FRONTEND_PID F1_LOG=$FRONTEND_LOG
sp_out=$IT_DIR/underload-sigterm.out
timeout -k 2 "$(ts_s 20)" sockperf under-load -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 3 \
  --mps 20000 --reply-every 1 >"$sp_out" 2>&1 </dev/null &
SP=$!
track "$SP" sockperf-under-load
wait_metric lynx_frontend_responded_total "" 2000 10 # load is flowing
t0=$(now_ms)
kill -TERM "$F1"
wait_exit "$F1" 5 || fail "frontend did not exit within 5 s of SIGTERM under load"
elapsed=$(($(now_ms) - t0))
assert_eq "$WAIT_RC" 0 "frontend exit status on SIGTERM under load"
assert_lt "$elapsed" "$(ts_ms 5000)" "ms from SIGTERM to frontend exit"
assert_log "$F1_LOG" "draining and shutting down" "frontend logged its drain"
assert_log "$F1_LOG" "stopped" "frontend logged its stop"
wait_exit "$SP" 15 || fail "sockperf under-load did not finish"

# ---- 2. a new frontend takes the rings over ------------------------------
log "== 2. a second frontend on the same agent"
start_frontend
F2=$FRONTEND_PID F2_LOG=$FRONTEND_LOG
probe_udp "frontend #2 on agent #1" 11

# ---- 3. SIGTERM the agent --------------------------------------------------
log "== 3. SIGTERM to the agent with a frontend attached"
t0=$(now_ms)
stop "$A1" 5
assert_eq "$WAIT_RC" 0 "agent exit status on SIGTERM"
assert_lt $(($(now_ms) - t0)) "$(ts_ms 5000)" "ms from SIGTERM to agent exit"
expect_regions "$A1" 0
wait_log "$F2_LOG" "out of dispatch" 5 2 "$F2" # one line per accelerator
is_alive "$F2" || fail "the frontend died with its agent"
log "ok: frontend alive after its agent left"

# ---- 4. a new agent: the frontend reconnects ----------------------------------
log "== 4. a new agent on the same port"
start_agent
A2=$AGENT_PID
wait_log "$F2_LOG" "serving UDP" 10 2 "$F2"
probe_udp "frontend #2 after agent #2 came up" 12

# ---- 5. kill -9 the agent ----------------------------------------------------
log "== 5. SIGKILL to the agent"
kill9 "$A2"
wait_log "$F2_LOG" "out of dispatch" 5 4 "$F2"
assert_log "$F2_LOG" "its agent left" "frontend says why the accelerators left"
for i in 1 2 3 4 5; do
  printf 'no-agent-%s' "$i" >"/dev/udp/127.0.0.1/$UDP_PORT"
done
wait_metric lynx_frontend_dropped_total 'reason="no_mqueue"' 5 5
log "ok: datagrams without an agent counted as dropped{no_mqueue}"
sleep 0.5
is_alive "$F2" || fail "the frontend died after its agent was killed"
log "ok: frontend alive after SIGKILL of its agent"
expect_regions "$A2" 2 # a dead agent cannot clean up
# another agent on the host (another node id: another deployment or test)
# starts now: the dead agent's region files are not its to remove
if [[ $IT_TRANSPORT == shm ]]; then
  node_ids OTHER
  pick_ports OTHER_PORT
  spawn_daemon lynx-agent agent " (node $OTHER)" --listen "127.0.0.1:$OTHER_PORT" \
    --node-id "$OTHER" --cpu-accels 1 --mqueues 1 --app echo --transport shm
  OA=$SPAWN_PID
  wait_log "$SPAWN_LOG" "serving descriptors on" 10 1 "$OA"
  assert_eq "$(grep -c 'removed stale region' "$SPAWN_LOG")" 0 \
    "stale regions another node id's agent removed"
  expect_regions "$A2" 2
  stop "$OA" 10
  assert_eq "$WAIT_RC" 0 "the other node id's agent exit status on SIGTERM"
fi

# ---- 6. a new agent again: served without a frontend restart -------------------
log "== 6. a new agent after the SIGKILL"
start_agent
A3=$AGENT_PID A3_LOG=$AGENT_LOG
[[ $IT_TRANSPORT != shm ]] ||
  assert_log "$A3_LOG" "removed stale region" "new agent removed the dead agent's regions"
expect_regions "$A2" 0
wait_log "$F2_LOG" "serving UDP" 10 3 "$F2"
assert_eq "$(grep -cF ': starting in ' "$F2_LOG")" 1 "frontend #2 starts (no restart)"
pingpong after-kill9

stop "$F2" 10
assert_eq "$WAIT_RC" 0 "frontend #2 exit status on SIGTERM"
stop "$A3" 10
assert_eq "$WAIT_RC" 0 "agent #3 exit status on SIGTERM"
expect_regions "$A3" 0

# ---- 7. frontend before agent ----------------------------------------------
log "== 7. a frontend started before its agent"
NOWAIT=1 start_frontend
F3=$FRONTEND_PID F3_LOG=$FRONTEND_LOG
wait_log "$F3_LOG" "cannot reach agent" 5 1 "$F3"
sleep 1
is_alive "$F3" || fail "a frontend without agent gave up"
start_agent
A4=$AGENT_PID A4_LOG=$AGENT_LOG
wait_log "$F3_LOG" "serving UDP" 10 1 "$F3"
pingpong frontend-first

# ---- 8. garbage on the control port ------------------------------------------
log "== 8. garbage on the agent's control port"
# garbage WHAT BYTES REASON: sends BYTES (with \xHH escapes) on a new control
# connection; the agent must close it, logging REASON, and stay up.
garbage() {
  local what=$1 bytes=$2 reason=$3 before fd rc buf
  before=$(grep -cF -- "$reason" "$A4_LOG")
  exec {fd}<>"/dev/tcp/127.0.0.1/$AGENT_PORT" || fail "$what: cannot connect to the agent"
  { printf '%b' "$bytes" >&"$fd"; } 2>/dev/null
  # EOF (1) or a reset (1) when the agent closes; > 128 on our timeout
  IFS= read -r -t 5 -u "$fd" buf
  rc=$?
  exec {fd}>&-
  ((rc <= 128)) || it_check_failed "$what: the agent kept the connection open for 5 s"
  [[ -z ${buf:-} ]] || it_check_failed "$what: the agent answered garbage with '$buf'"
  wait_log "$A4_LOG" "$reason" 5 $((before + 1)) "$A4"
  log "ok: $what: the agent closed the connection ('$reason')"
  is_alive "$A4" || fail "$what: the agent died"
}
garbage "text garbage" 'GARBAGE, not a lynx frame\r\n' "frame larger than"
garbage "undecodable frame" '\x00\x00\x00\x08\xff\xff\xff\xff\xff\xff\xff\xff' \
  "does not decode"
# (before a Hello has passed, frames are capped at 4 KiB, not --frame-max)
garbage "100 MB length header" '\x05\xf5\xe1\x00' \
  "frame larger than the 4096-byte cap"
# an empty frame decodes to an Envelope without a message
garbage "empty frame" '\x00\x00\x00\x00' "does not decode"
assert_eq "$(grep -cF 'out of dispatch' "$F3_LOG")" 0 "frontend #3 kept its accelerators"
probe_udp "frontend #3 after the garbage" 13
pingpong after-garbage

stop "$F3" 10
assert_eq "$WAIT_RC" 0 "frontend #3 exit status on SIGTERM"
stop "$A4" 10
assert_eq "$WAIT_RC" 0 "agent #4 exit status on SIGTERM"
expect_regions "$A4" 0
it_done
