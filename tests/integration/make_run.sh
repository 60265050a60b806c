#!/usr/bin/env bash
# make_run: the README's `make run` (deploy/run-local.sh) as a new user meets
# it, on free ports.
#
#  1. It prints where everything is, and the UDP service answers at exactly
#     the address the banner names (the frontend listens there, not on a
#     wildcard the banner does not mention).
#  2. Ctrl-C (SIGINT to the terminal's process group) stops everything in
#     order: "stopping", "stopped", exit 0, no daemon left, and no word of a
#     process that "exited" as if something had crashed.
#  3. A daemon that dies on its own is named with its exit status and log,
#     the others are stopped, and the script exits 1.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init make_run
it_require_coord
it_require python3 ss setsid
pick_ports UDP_PORT COORD_PORT API_PORT METRICS_PORT
RUN_LOCAL=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../deploy" && pwd)/run-local.sh
BUILD_DIR=$(dirname "$LYNX_BIN_DIR")
node_ids NODE
IT_SOFT=1 # report every broken promise of one run

# launch OUT: run-local.sh in a session of its own (run_in_session: RUN_PID,
# also its process group), until its banner is out.
launch() {
  LYNX_UDP_PORT=$UDP_PORT LYNX_COORD_ADDR=127.0.0.1:$COORD_PORT \
  LYNX_API_ADDR=127.0.0.1:$API_PORT LYNX_METRICS_ADDR=127.0.0.1:$METRICS_PORT \
  LYNX_NODE_ID=$NODE run_in_session "$1" "$RUN_LOCAL" "$BUILD_DIR"
  wait_log "$1" "Press Ctrl-C to stop" 30 1 "$RUN_PID"
  RUN_LOGDIRS+=("$(sed -n 's|^ *logs *\(/tmp/lynx-run\.[A-Za-z0-9]*\)/.*|\1|p' "$1")")
}
RUN_LOGDIRS=()
# make run keeps its logs for the user; this test's go with it
trap_logdirs() { for d in "${RUN_LOGDIRS[@]}"; do [[ -n $d ]] && rm -rf "$d"; done; }

# daemons: pids of this run's lynx daemons (by their ports and node id)
daemons() {
  pgrep -f -- "lynx-(coordinator --listen 127.0.0.1:$COORD_PORT|agent --coordinator 127.0.0.1:$COORD_PORT|frontend --coordinator 127.0.0.1:$COORD_PORT)" || true
}

# ---- 1. the banner tells the truth ----------------------------------------------
log "== 1. make run: the service answers where the banner says"
OUT1=$IT_DIR/run1.out
launch "$OUT1"
addr=$(sed -n 's/^ *UDP service *\([^ ]*\).*/\1/p' "$OUT1")
[[ -n $addr ]] || fail "no 'UDP service' line in the banner: $(cat "$OUT1")"
host=${addr%:*} port=${addr##*:}
assert_eq "$port" "$UDP_PORT" "the banner's UDP port"
bound=$(ss -Hlun "( sport = :$UDP_PORT )" | awk '{print $4}' | sort -u)
[[ $bound == "$addr" ]] ||
  it_check_failed "the banner says $addr, the frontend listens on '$bound'"
"$LYNX_BIN_DIR/lynx-udp-probe" --host "$host" --port "$port" --timeout-ms 10000 \
  >"$IT_DIR/probe.out" 2>&1 || fail "no answer at $addr: $(cat "$IT_DIR/probe.out")"
log "ok: answered at $addr, where the frontend listens"
n=$(daemons | wc -l)
assert_eq "$n" 3 "daemons running (coordinator, agent, frontend)"

# ---- 2. Ctrl-C ---------------------------------------------------------------------
log "== 2. Ctrl-C"
kill -INT -- "-$RUN_PID"
wait_exit "$RUN_PID" 20 || fail "make run did not stop within 20 s of Ctrl-C"
untrack "$RUN_PID"
assert_eq "$WAIT_RC" 0 "make run's exit status after Ctrl-C"
grep -q '^stopping' "$OUT1" || it_check_failed "no 'stopping' after Ctrl-C: $(tail -5 "$OUT1")"
grep -q '^stopped' "$OUT1" || it_check_failed "no 'stopped' after Ctrl-C: $(tail -5 "$OUT1")"
if grep -qi 'exited' "$OUT1"; then
  it_check_failed "Ctrl-C reported as a crash: $(grep -i exited "$OUT1")"
fi
assert_eq "$(daemons | wc -l)" 0 "daemons left after Ctrl-C"
[[ -z $(node_shm "$NODE") ]] || it_check_failed "regions left: $(node_shm "$NODE")"

# ---- 3. a daemon that dies -------------------------------------------------------
log "== 3. the frontend dies on its own"
OUT2=$IT_DIR/run2.out
launch "$OUT2"
fe=$(pgrep -f -- "lynx-frontend --coordinator 127.0.0.1:$COORD_PORT")
[[ -n $fe ]] || fail "no frontend of this run"
kill -KILL "$fe"
wait_exit "$RUN_PID" 20 || fail "make run did not stop within 20 s of its frontend's death"
untrack "$RUN_PID"
assert_eq "$WAIT_RC" 1 "make run's exit status when a daemon died"
grep -q "lynx-frontend (pid $fe) exited with status 137" "$OUT2" ||
  it_check_failed "the dead daemon is not named with its status: $(tail -8 "$OUT2")"
grep -q 'frontend.log' "$OUT2" || it_check_failed "its log is not named: $(tail -8 "$OUT2")"
assert_eq "$(daemons | wc -l)" 0 "daemons left after the frontend died"
trap_logdirs
it_done
