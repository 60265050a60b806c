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
# LYNX_METRICS_ADDR (the frontend's /metrics), LYNX_AGENT_METRICS_ADDR,
# LYNX_APP, LYNX_NODE_ID. The metrics ports are the packaged configs' and
# deploy/monitoring/'s: 7790 the agent, 7791 the frontend.
set -euo pipefail
BUILD=${1:-build}
BIN="$BUILD/bin"
UDP=${LYNX_UDP_PORT:-7000}
BIND=${LYNX_BIND:-127.0.0.1}
COORD=${LYNX_COORD_ADDR:-127.0.0.1:7700}
API=${LYNX_API_ADDR:-127.0.0.1:7780}
METRICS=${LYNX_METRICS_ADDR:-127.0.0.1:7791}
AGENT_METRICS=${LYNX_AGENT_METRICS_ADDR:-127.0.0.1:7790}
APP=${LYNX_APP:-sockperf-echo}
NODE=${LYNX_NODE_ID:-local}
LOGDIR=$(mktemp -d /tmp/lynx-run.XXXXXX)

source "$(dirname "${BASH_SOURCE[0]}")/lib-run.sh" # start, wait_for, fail, stop, watch

start coordinator "$BIN/lynx-coordinator" --listen "$COORD" --http "$API" \
  --state-dir "$LOGDIR/state"
wait_for "$LOGDIR/coordinator.log" "serving control" coordinator
# frontend and agent share this host: shm is the fastest path (agents on
# other hosts use the default, tcp, or rdma)
start agent "$BIN/lynx-agent" --coordinator "$COORD" --cpu-accels 2 \
  --node-id "$NODE" --transport shm --metrics "$AGENT_METRICS"
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
  console       http://$API/ui/   (lynxctl --api http://$API top)
  metrics       http://$METRICS/metrics (frontend), http://$AGENT_METRICS/metrics (agent)
  logs          $LOGDIR/{coordinator,agent,frontend}.log

Try it from another terminal:
  sockperf ping-pong -i $([[ $BIND == 0.0.0.0 ]] && echo 127.0.0.1 || echo "$BIND") -p $UDP -m 64 -t 5
  $BIN/lynxctl nodes; $BIN/lynxctl accelerators; $BIN/lynxctl services
  curl -s http://$METRICS/metrics | grep -v '^#'

Press Ctrl-C to stop.
MSG
watch
