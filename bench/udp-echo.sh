#!/usr/bin/env bash
# bench/udp-echo.sh - Lynx frontend vs sockperf's own server, in one run.
#
# Same client, size and duration against (1) `sockperf server` and (2) the
# Lynx frontend with 2 CPU accelerators running sockperf-echo. Reports
# ping-pong p50/p99 and the served rate at saturation (under-load
# --mps=max --reply-every=1: replies received per second of the valid
# duration), then the ratios Lynx/sockperf. Absolute numbers on a shared
# 2-core machine are noise; the ratios are the result.
#
# usage: bench/udp-echo.sh [BUILD_DIR]   env: SIZE (64), DURATION (5), RUNS (3)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN="$BUILD/bin"
SIZE=${SIZE:-64}
DUR=${DURATION:-5}
RUNS=${RUNS:-3}
SP_PORT=17100
FE_PORT=17000
AG_ADDR=127.0.0.1:17701
TMP=$(mktemp -d /tmp/lynx-bench.XXXXXX)
command -v sockperf >/dev/null || { echo "sockperf is not installed (deploy/install-deps.sh)"; exit 1; }

source bench/lib.sh # pids, cleanup

# prints "p50 p99" from a ping-pong run
pingpong() {
  sockperf ping-pong -i 127.0.0.1 -p "$1" -m "$SIZE" -t "$DUR" >"$TMP/pp.txt" 2>&1 || true
  sockperf_pct "$TMP/pp.txt"
}
# prints replies/s in the valid duration of a saturating under-load run
served() {
  sockperf under-load -i 127.0.0.1 -p "$1" -m "$SIZE" -t "$DUR" --mps=max --reply-every=1 >"$TMP/ul.txt" 2>&1 || true
  sed -n 's/.*\[Valid Duration\] RunTime=\([0-9.]*\) sec;.*ReceivedMessages=\([0-9]*\).*/\1 \2/p' "$TMP/ul.txt" |
    awk '{ if ($1 > 0) printf "%.0f\n", $2 / $1; else print 0 }'
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

measure() { # port label -> appends "label p50 p99 rate" per run
  for _ in $(seq "$RUNS"); do
    read -r p50 p99 < <(pingpong "$1")
    rate=$(served "$1")
    echo "$2 $p50 $p99 $rate" >>"$TMP/raw.txt"
  done
}

sockperf server -i 127.0.0.1 -p "$SP_PORT" >"$TMP/sockperf-server.log" 2>&1 &
pids+=($!)
sleep 0.5
measure "$SP_PORT" sockperf
cleanup

"$BIN/lynx-agent" --cpu-accels 2 --app sockperf-echo --mqueues 4 --listen "$AG_ADDR" >"$TMP/agent.log" 2>&1 &
pids+=($!)
sleep 0.3
"$BIN/lynx-frontend" --agent "$AG_ADDR" --udp "$FE_PORT" >"$TMP/frontend.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do grep -q "serving UDP" "$TMP/frontend.log" && break; sleep 0.1; done
measure "$FE_PORT" lynx
cleanup

stat() { grep "^$1 " "$TMP/raw.txt" | awk -v c="$2" '{print $c}' | median; }
sp50=$(stat sockperf 2); sp99=$(stat sockperf 3); srate=$(stat sockperf 4)
lp50=$(stat lynx 2); lp99=$(stat lynx 3); lrate=$(stat lynx 4)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }

OUT="bench/results/udp-echo-$(date -u +%Y%m%dT%H%M%SZ).txt"
{
  echo "# bench/udp-echo.sh  $(date -u +%FT%TZ)  $(uname -m) $(nproc) cores"
  echo "# size=${SIZE}B duration=${DUR}s runs=${RUNS} (median of runs); git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  printf "%-10s %12s %12s %16s\n" server "p50_us" "p99_us" "served_per_s"
  printf "%-10s %12s %12s %16s\n" sockperf "$sp50" "$sp99" "$srate"
  printf "%-10s %12s %12s %16s\n" lynx "$lp50" "$lp99" "$lrate"
  echo "ratio lynx/sockperf: p50 $(ratio "$lp50" "$sp50")x  p99 $(ratio "$lp99" "$sp99")x  served $(ratio "$lrate" "$srate")x"
  echo "# targets: served >= 0.5x, p50 <= 2x"
  echo "# raw runs (label p50 p99 rate):"
  sed 's/^/#   /' "$TMP/raw.txt"
} | tee "$OUT"
