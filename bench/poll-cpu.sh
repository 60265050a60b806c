#!/usr/bin/env bash
# bench/poll-cpu.sh - the frontend's own CPU time at idle, at a low and a
# higher offered rate, and the ping-pong p50 (issue 15: CPU in proportion
# to load; docs/design.md "Adaptive polling").
#
# An agent with 2 CPU accelerators running sockperf-echo and one frontend;
# a short warm-up of traffic, then for each window the frontend's
# utime+stime from /proc/<pid>/stat (all its threads) over the window's
# wall time, as a fraction of one core:
#   idle   IDLE seconds with no traffic
#   low    sockperf under-load --mps LOW_MPS for DURATION seconds
#   high   sockperf under-load --mps HIGH_MPS for DURATION seconds
# and the p50/p99 of a ping-pong run. The CPU windows include sockperf's
# own start-up and wind-down (about 0.1 s), where the frontend is idle.
#
# usage: bench/poll-cpu.sh [BUILD_DIR] [FRONTEND_BINARY] [frontend options]
#   env: DURATION (5), IDLE (3), LOW_MPS (2000), HIGH_MPS (20000), RUNS (1),
#        RX (e.g. "socket uring": each run measures a frontend per receive
#        path, --rx; default: one frontend with the options given),
#        AGENT_OPTS (more agent options, e.g. "--work-us 300 --work-mode
#        sleep": requests that take an accelerator time),
#        FE_ALT (a second frontend binary, e.g. an older build: each run
#        measures it too, right after FRONTEND_BINARY, "alt" in its line)
# FRONTEND_BINARY (default BUILD_DIR/bin/lynx-frontend) lets an older build
# of the frontend be measured against the same agent.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
FE_BIN=${2:-$BUILD/bin/lynx-frontend}
shift $(($# > 2 ? 2 : $#))
DUR=${DURATION:-5}
IDLE=${IDLE:-3}
LOW=${LOW_MPS:-2000}
HIGH=${HIGH_MPS:-20000}
RUNS=${RUNS:-1}
FE_PORT=${FE_PORT:-17010}
AG_ADDR=${AG_ADDR:-127.0.0.1:17711}
TMP=$(mktemp -d /tmp/lynx-pollcpu.XXXXXX)
command -v sockperf >/dev/null || { echo "sockperf is not installed (deploy/install-deps.sh)"; exit 1; }
source bench/lib.sh # pids, cleanup, cpu_ticks, sockperf_pct

TCK=$(getconf CLK_TCK)
now_ns() { date +%s%N; }
# cpu_frac PID CMD...: runs CMD, prints the frontend's CPU over its wall time
cpu_frac() {
  local pid=$1 c0 c1 t0 t1
  shift
  c0=$(cpu_ticks "$pid") t0=$(now_ns)
  "$@" >"$TMP/cmd.out" 2>&1 || true
  c1=$(cpu_ticks "$pid") t1=$(now_ns)
  awk -v c=$((c1 - c0)) -v t=$((t1 - t0)) -v hz="$TCK" \
    'BEGIN { printf "%.3f", (c / hz) / (t / 1e9) }'
}

# shellcheck disable=SC2086 # AGENT_OPTS is a list of options
"$BUILD/bin/lynx-agent" --cpu-accels 2 --app sockperf-echo --mqueues 4 --listen "$AG_ADDR" ${AGENT_OPTS:-} >"$TMP/agent.log" 2>&1 &
pids+=($!)
sleep 0.3
fe=''
bin=$FE_BIN
fe_up() { # fe_up [frontend option...]: (re)starts the frontend ($bin), warmed up
  if [[ -n $fe ]]; then kill -TERM "$fe"; wait "$fe" || true; fi
  "$bin" --agent "$AG_ADDR" --udp "$FE_PORT" "$@" >"$TMP/frontend.log" 2>&1 &
  fe=$!
  pids+=("$fe")
  for _ in $(seq 50); do grep -q "serving UDP" "$TMP/frontend.log" && break; sleep 0.1; done
  grep -q "serving UDP" "$TMP/frontend.log" || { cat "$TMP/frontend.log"; exit 1; }
  sp ping-pong -t 1 >/dev/null 2>&1 || true # warm-up
}

sp() { sockperf "$@" -i 127.0.0.1 -p "$FE_PORT" -m 64; }
[[ -n ${RX:-}${FE_ALT:-} ]] || fe_up "$@"
for r in $(seq "$RUNS"); do
  for run in ${RX:--}${FE_ALT:+ alt}; do
    rx=$run bin=$FE_BIN
    if [[ $run == alt ]]; then rx=- bin=$FE_ALT; fi
    if [[ $run != - || -n ${FE_ALT:-} ]]; then
      if [[ $rx == - ]]; then fe_up "$@"; else fe_up "$@" --rx "$rx"; fi
    fi
    idle=$(cpu_frac "$fe" sleep "$IDLE")
    low=$(cpu_frac "$fe" sp under-load -t "$DUR" --mps "$LOW" --reply-every 1)
    high=$(cpu_frac "$fe" sp under-load -t "$DUR" --mps "$HIGH" --reply-every 1)
    sp ping-pong -t "$DUR" >"$TMP/pp.txt" 2>&1 || true
    read -r p50 p99 < <(sockperf_pct "$TMP/pp.txt")
    printf "run %s%s: cpu(cores) idle %s  %s/s %s  %s/s %s   ping-pong p50 %s us p99 %s us\n" \
      "$r" "$(case $run in -) ;; alt) echo " alt" ;; *) echo " rx $run" ;; esac)" "$idle" "$LOW" "$low" "$HIGH" "$high" "$p50" "$p99"
  done
done
