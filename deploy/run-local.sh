#!/usr/bin/env bash
# `make run`: a local deployment with the embedded defaults: a coordinator
# (control 127.0.0.1:7700, API 127.0.0.1:7780, state in a temp dir), one
# agent with two CPU-emulated accelerators, one frontend, and the demo
# service `echo` (sockperf-echo on UDP 7000, placement all) created through
# the API with lynxctl. Runs in the foreground; Ctrl-C stops everything and
# removes the shared-memory regions.
# Override with LYNX_UDP_PORT, LYNX_COORD_ADDR, LYNX_API_ADDR,
# LYNX_METRICS_ADDR, LYNX_APP.
set -euo pipefail
BUILD=${1:-build}
BIN="$BUILD/bin"
UDP=${LYNX_UDP_PORT:-7000}
COORD=${LYNX_COORD_ADDR:-127.0.0.1:7700}
API=${LYNX_API_ADDR:-127.0.0.1:7780}
METRICS=${LYNX_METRICS_ADDR:-127.0.0.1:7790}
APP=${LYNX_APP:-sockperf-echo}
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

"$BIN/lynx-coordinator" --listen "$COORD" --http "$API" \
  --state-dir "$LOGDIR/state" >"$LOGDIR/coordinator.log" 2>&1 &
pids+=($!)
wait_for "$LOGDIR/coordinator.log" "serving control" coordinator
# frontend and agent share this host: shm is the fastest path (agents on
# other hosts use the default, tcp, or rdma)
"$BIN/lynx-agent" --coordinator "$COORD" --cpu-accels 2 --node-id local \
  --transport shm >"$LOGDIR/agent.log" 2>&1 &
pids+=($!)
"$BIN/lynx-frontend" --coordinator "$COORD" --metrics "$METRICS" \
  >"$LOGDIR/frontend.log" 2>&1 &
pids+=($!)
wait_for "$LOGDIR/agent.log" "registered with coordinator" agent
"$BIN/lynxctl" --api "http://$API" service create --name echo --port "$UDP" \
  --app "$APP" --placement all >/dev/null || fail "cannot create the service"
wait_for "$LOGDIR/frontend.log" "in dispatch" frontend

cat <<MSG
Lynx is running: coordinator, 1 agent (2 CPU accelerators), 1 frontend,
service echo ($APP) on UDP port $UDP.
  UDP service   127.0.0.1:$UDP
  API           http://$API   (lynxctl --api http://$API nodes)
  metrics       http://$METRICS/metrics
  logs          $LOGDIR/{coordinator,agent,frontend}.log

Try it from another terminal:
  sockperf ping-pong -i 127.0.0.1 -p $UDP -m 64 -t 5
  $BIN/lynxctl nodes; $BIN/lynxctl accelerators; $BIN/lynxctl services
  curl -s http://$METRICS/metrics | grep -v '^#'

Press Ctrl-C to stop.
MSG
wait -n "${pids[@]}" || true
echo "a process exited; see $LOGDIR" >&2
