#!/usr/bin/env bash
# `make run`: a local deployment with the embedded defaults — one agent with
# two CPU-emulated accelerators running sockperf-echo (4 mqueues each, in
# shared memory) and a frontend serving UDP port 7000. Runs in the
# foreground; Ctrl-C stops both and removes the shared-memory regions.
# Override with LYNX_UDP_PORT, LYNX_AGENT_ADDR, LYNX_METRICS_ADDR, LYNX_APP.
set -euo pipefail
BUILD=${1:-build}
BIN="$BUILD/bin"
UDP=${LYNX_UDP_PORT:-7000}
AGENT=${LYNX_AGENT_ADDR:-127.0.0.1:7701}
METRICS=${LYNX_METRICS_ADDR:-127.0.0.1:7790}
APP=${LYNX_APP:-sockperf-echo}
LOGDIR=$(mktemp -d /tmp/lynx-run.XXXXXX)

pids=()
stop() {
  trap - INT TERM EXIT
  echo
  echo "stopping..."
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  echo "stopped; logs in $LOGDIR"
}
trap 'stop; exit 0' INT TERM
trap stop EXIT

"$BIN/lynx-agent" --cpu-accels 2 --app "$APP" --mqueues 4 --listen "$AGENT" \
  >"$LOGDIR/agent.log" 2>&1 &
pids+=($!)
"$BIN/lynx-frontend" --agent "$AGENT" --udp "$UDP" --metrics "$METRICS" \
  >"$LOGDIR/frontend.log" 2>&1 &
pids+=($!)

for _ in $(seq 100); do
  grep -q "serving UDP" "$LOGDIR/frontend.log" 2>/dev/null && break
  if ! kill -0 "${pids[0]}" 2>/dev/null || ! kill -0 "${pids[1]}" 2>/dev/null; then
    echo "lynx failed to start:" >&2
    cat "$LOGDIR/agent.log" "$LOGDIR/frontend.log" >&2
    exit 1
  fi
  sleep 0.1
done
if ! grep -q "serving UDP" "$LOGDIR/frontend.log"; then
  echo "frontend did not come up in 10 s:" >&2
  cat "$LOGDIR/agent.log" "$LOGDIR/frontend.log" >&2
  exit 1
fi

cat <<MSG
Lynx is running: 1 agent (2 CPU accelerators, app $APP), 1 frontend.
  UDP service   127.0.0.1:$UDP
  metrics       http://$METRICS/metrics
  logs          $LOGDIR/{agent,frontend}.log

Try it from another terminal:
  sockperf ping-pong -i 127.0.0.1 -p $UDP -m 64 -t 5
  sockperf under-load -i 127.0.0.1 -p $UDP -m 64 -t 5 --mps 10000 --reply-every 1
  curl -s http://$METRICS/metrics | grep -v '^#'

Press Ctrl-C to stop.
MSG
wait -n "${pids[@]}" || true
echo "a process exited; see $LOGDIR" >&2
