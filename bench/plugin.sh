#!/usr/bin/env bash
# bench/plugin.sh - a plug-in application against the built-in one it
# copies (issue 37: a plug-in runs in a process of its own; its requests
# must cost what a built-in's cost).
#
# Static mode, 2 CPU accelerators, one frontend over --transport TRANSPORT
# (shm): the agent runs sockperf-echo (built in, in the agent's process)
# or sockperf-plugin (the same handler as a plug-in,
# tests/plugins/sockperf_plugin.c, in its own process), in turn, ROUNDS
# times (A B A B ...). Each run: a sockperf ping-pong of 64-byte messages
# for DURATION seconds (p50, p99, answers per second), then sockperf
# under-load at MPS messages/s for DURATION seconds with the CPU time of
# the accelerators' processes (the agent and, for the plug-in, its
# process) per answer. The medians, and the plug-in's over the built-in's.
#
# usage: bench/plugin.sh [BUILD_DIR]
#   env: ROUNDS (5), DURATION (3), MPS (20000), TRANSPORT (shm)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
ROUNDS=${ROUNDS:-5}
DUR=${DURATION:-3}
MPS=${MPS:-20000}
TRANSPORT=${TRANSPORT:-shm}
FE_PORT=${FE_PORT:-17030}
AG_ADDR=${AG_ADDR:-127.0.0.1:17731}
PLUGIN=$BUILD/plugins/sockperf-plugin.so
TMP=$(mktemp -d /tmp/lynx-plugin-bench.XXXXXX)
command -v sockperf >/dev/null || { echo "sockperf is not installed (deploy/install-deps.sh)"; exit 1; }
[[ -f $PLUGIN ]] || { echo "$PLUGIN is missing: build first (make)"; exit 1; }
source bench/lib.sh # pids, cleanup, cpu_ticks, wait_log, sockperf_pct, sockperf_stat

TCK=$(getconf CLK_TCK)

# run KIND: one run (built-in | plugin); prints "p50 p99 answers/s cpu_us"
run() {
  local kind=$1 agent fe kids c0 c1 n
  local -a app=(--app sockperf-echo)
  [[ $kind == plugin ]] && app=(--app sockperf-plugin --app-load "$PLUGIN")
  "$BUILD/bin/lynx-agent" --cpu-accels 2 --mqueues 4 --listen "$AG_ADDR" \
    --transport "$TRANSPORT" "${app[@]}" >"$TMP/agent.log" 2>&1 &
  agent=$!
  pids+=("$agent")
  wait_log "$TMP/agent.log" "serving descriptors on" >&2
  "$BUILD/bin/lynx-frontend" --agent "$AG_ADDR" --udp "127.0.0.1:$FE_PORT" \
    >"$TMP/fe.log" 2>&1 &
  fe=$!
  pids+=("$fe")
  wait_log "$TMP/fe.log" "serving UDP" >&2
  sockperf ping-pong -i 127.0.0.1 -p "$FE_PORT" -m 64 -t 1 >/dev/null 2>&1 || true
  sockperf ping-pong -i 127.0.0.1 -p "$FE_PORT" -m 64 -t "$DUR" >"$TMP/pp.out" 2>&1 || true
  kids=$(pgrep -P "$agent" | tr '\n' ' ')
  c0=0
  for p in $agent $kids; do c0=$((c0 + $(cpu_ticks "$p"))); done
  sockperf under-load -i 127.0.0.1 -p "$FE_PORT" -m 64 -t "$DUR" --mps "$MPS" \
    --reply-every 1 >"$TMP/ul.out" 2>&1 || true
  c1=0
  for p in $agent $kids; do c1=$((c1 + $(cpu_ticks "$p"))); done
  n=$(sockperf_stat "$TMP/ul.out" replies_per_s)
  cleanup
  read -r p50 p99 < <(sockperf_pct "$TMP/pp.out")
  awk -v p50="$p50" -v p99="$p99" -v rps="$(sockperf_stat "$TMP/pp.out" replies_per_s)" \
    -v c=$((c1 - c0)) -v hz="$TCK" -v n="$n" -v d="$DUR" \
    'BEGIN { printf "%s %s %s %.2f\n", p50, p99, rps, (n > 0 ? (c / hz) * 1e6 / (n * d) : 0) }'
}

echo "# bench/plugin.sh: $(date -u +%FT%TZ), $(nproc) cores, transport $TRANSPORT, $ROUNDS rounds of $DUR s, under-load $MPS msg/s"
echo "# kind      p50_us p99_us answers_per_s accel_cpu_us_per_answer"
: >"$TMP/a" && : >"$TMP/b"
for r in $(seq "$ROUNDS"); do
  a=$(run builtin)
  echo "built-in  $a   (round $r)"
  echo "$a" >>"$TMP/a"
  b=$(run plugin)
  echo "plug-in   $b   (round $r)"
  echo "$b" >>"$TMP/b"
done
med() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
for i in 1 2 3 4; do
  ma=$(awk -v i=$i '{ print $i }' "$TMP/a" | med)
  mb=$(awk -v i=$i '{ print $i }' "$TMP/b" | med)
  name=$(echo "p50_us p99_us answers_per_s cpu_us_per_answer" | cut -d' ' -f$i)
  awk -v n="$name" -v a="$ma" -v b="$mb" \
    'BEGIN { printf "median %-18s built-in %10s  plug-in %10s  plug-in/built-in %.2f\n", n, a, b, (a > 0 ? b / a : 0) }'
done
