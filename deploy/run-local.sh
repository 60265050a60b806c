#!/usr/bin/env bash
# `make run`: a local deployment with the embedded defaults: a coordinator
# (control 127.0.0.1:7700, API 127.0.0.1:7780, state in a temp dir), one
# agent with two CPU-emulated accelerators, one frontend, and the demo
# service `echo` (sockperf-echo on UDP 127.0.0.1:7000, placement all)
# created through the API with lynxctl. Runs in the foreground; Ctrl-C stops
# everything in order (frontend, agent, coordinator) and removes the
# shared-memory regions. The daemons run in their own sessions, so the
# terminal's Ctrl-C reaches only this script, which stops them.
# Override with LYNX_UDP_PORT, LYNX_BIND (the address services listen on:
# 0.0.0.0 serves other hosts too), LYNX_COORD_ADDR, LYNX_API_ADDR,
# LYNX_METRICS_ADDR, LYNX_APP, LYNX_NODE_ID.
set -euo pipefail
BUILD=${1:-build}
BIN="$BUILD/bin"
UDP=${LYNX_UDP_PORT:-7000}
BIND=${LYNX_BIND:-127.0.0.1}
COORD=${LYNX_COORD_ADDR:-127.0.0.1:7700}
API=${LYNX_API_ADDR:-127.0.0.1:7780}
METRICS=${LYNX_METRICS_ADDR:-127.0.0.1:7790}
APP=${LYNX_APP:-sockperf-echo}
NODE=${LYNX_NODE_ID:-local}
LOGDIR=$(mktemp -d /tmp/lynx-run.XXXXXX)

pids=()
stop() {
  trap - INT TERM EXIT
  echo
  echo "stopping..."
  # frontend first (drains), then agent (leaves), then coordinator
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
  echo "stopped; logs in $LOGDIR"
}
trap 'stop; exit 0' INT TERM
trap stop EXIT

fail() {
  echo "lynx failed to start: $*" >&2
  tail -n 20 "$LOGDIR"/*.log >&2
  exit 1
}

wait_for() { # FILE PATTERN WHAT
  for _ in $(seq 100); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || fail "$3 exited"; done
    sleep 0.1
  done
  fail "$3 did not come up in 10 s"
}

declare -A names=()
# start NAME PROG ARGS...: PROG in its own session, its log in NAME.log
start() {
  local name=$1
  shift
  setsid "$@" >"$LOGDIR/$name.log" 2>&1 </dev/null &
  pids+=($!)
  names[$!]=$name
}

start coordinator "$BIN/lynx-coordinator" --listen "$COORD" --http "$API" \
  --state-dir "$LOGDIR/state"
wait_for "$LOGDIR/coordinator.log" "serving control" coordinator
# frontend and agent share this host: shm is the fastest path (agents on
# other hosts use the default, tcp, or rdma)
start agent "$BIN/lynx-agent" --coordinator "$COORD" --cpu-accels 2 \
  --node-id "$NODE" --transport shm
start frontend "$BIN/lynx-frontend" --coordinator "$COORD" --bind "$BIND" \
  --metrics "$METRICS"
wait_for "$LOGDIR/agent.log" "registered with coordinator" agent
"$BIN/lynxctl" --api "http://$API" service create --name echo --port "$UDP" \
  --app "$APP" --placement all >/dev/null || fail "cannot create the service"
wait_for "$LOGDIR/frontend.log" "in dispatch" frontend

cat <<MSG
Lynx is running: coordinator, 1 agent (2 CPU accelerators), 1 frontend,
service echo ($APP) on UDP port $UDP.
  UDP service   $BIND:$UDP
  API           http://$API   (lynxctl --api http://$API nodes)
  metrics       http://$METRICS/metrics
  logs          $LOGDIR/{coordinator,agent,frontend}.log

Try it from another terminal:
  sockperf ping-pong -i $([[ $BIND == 0.0.0.0 ]] && echo 127.0.0.1 || echo "$BIND") -p $UDP -m 64 -t 5
  $BIN/lynxctl nodes; $BIN/lynxctl accelerators; $BIN/lynxctl services
  curl -s http://$METRICS/metrics | grep -v '^#'

Press Ctrl-C to stop.
MSG
# Returns when a daemon exits by itself (Ctrl-C runs the trap instead).
rc=0
wait -n -p gone "${pids[@]}" || rc=$?
echo "lynx-${names[$gone]:-?} (pid ${gone:-?}) exited with status $rc; its log: $LOGDIR/${names[$gone]:-}.log" >&2
tail -n 5 "$LOGDIR/${names[$gone]:-}.log" >&2 || true
exit 1
