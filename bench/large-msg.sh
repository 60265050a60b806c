#!/usr/bin/env bash
# bench/large-msg.sh - where a message longer than a small slot should
# travel: inline in large slots, or through the ring's large-message area
# behind small slots (issue 15; docs/mqueue.md "Large messages",
# docs/design.md "Large messages: the crossover").
#
# For each transport (shm, tcp) and each layout
#   inline  --slot-size 65536 --slots 64 --msg-max 65520: every size fits
#           one slot, no large area (the frontend reads whole slots)
#   area    --slot-size 2048 --slots 256 --msg-max 65536: small slots, a
#           128 KiB area per ring; longer messages take a second read
# and each message size, a sockperf ping-pong against sockperf-echo on two
# CPU accelerators: p50 and p99 one-way latency, and the frontend's CPU per
# reply (utime+stime of the whole process over the replies). Same machine,
# same run: compare the layouts size by size.
#
# usage: bench/large-msg.sh [BUILD_DIR]
#   env: SIZES ("64 1024 2032 4096 16384 32768 60000"), DURATION (2),
#        TRANSPORTS ("shm tcp")
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
SIZES=${SIZES:-64 1024 2032 4096 16384 32768 60000}
DUR=${DURATION:-2}
TRANSPORTS=${TRANSPORTS:-shm tcp}
FE_PORT=${FE_PORT:-17030}
AG_ADDR=${AG_ADDR:-127.0.0.1:17731}
TMP=$(mktemp -d /tmp/lynx-largemsg.XXXXXX)
command -v sockperf >/dev/null || { echo "sockperf is not installed (deploy/install-deps.sh)"; exit 1; }
source bench/lib.sh # pids, cleanup, cpu_ticks, wait_log, sockperf_*
TCK=$(getconf CLK_TCK)

declare -A LAYOUT=(
  [inline]="--slot-size 65536 --slots 64 --msg-max 65520"
  [area]="--slot-size 2048 --slots 256 --msg-max 65536")

printf '%-4s %-7s %6s %9s %9s %12s\n' transport layout bytes p50_us p99_us \
  fe_us/reply
for tr in $TRANSPORTS; do
  for lay in inline area; do
    # shellcheck disable=SC2086
    "$BUILD/bin/lynx-agent" --cpu-accels 2 --app sockperf-echo --mqueues 4 \
      --transport "$tr" --listen "$AG_ADDR" ${LAYOUT[$lay]} \
      >"$TMP/agent-$tr-$lay.log" 2>&1 &
    pids+=($!)
    wait_log "$TMP/agent-$tr-$lay.log" "serving descriptors on"
    "$BUILD/bin/lynx-frontend" --agent "$AG_ADDR" --udp "$FE_PORT" \
      >"$TMP/fe-$tr-$lay.log" 2>&1 &
    fe=$!
    pids+=("$fe")
    wait_log "$TMP/fe-$tr-$lay.log" "serving UDP"
    sockperf ping-pong -i 127.0.0.1 -p "$FE_PORT" -m 64 -t 1 >/dev/null 2>&1 || true
    for sz in $SIZES; do
      out=$TMP/pp-$tr-$lay-$sz.out
      c0=$(cpu_ticks "$fe")
      sockperf ping-pong -i 127.0.0.1 -p "$FE_PORT" -m "$sz" -t "$DUR" \
        --full-log /dev/null >"$out" 2>&1 || true
      c1=$(cpu_ticks "$fe")
      read -r p50 p99 <<<"$(sockperf_pct "$out")"
      n=$(sockperf_stat "$out" replies_per_s)
      awk -v tr="$tr" -v lay="$lay" -v sz="$sz" -v p50="$p50" -v p99="$p99" \
        -v c=$((c1 - c0)) -v hz="$TCK" -v n="$n" -v d="$DUR" 'BEGIN {
          printf "%-4s %-7s %6d %9s %9s %12.1f\n", tr, lay, sz, p50, p99,
            (n > 0 ? (c / hz) * 1e6 / (n * d) : 0) }'
    done
    cleanup
  done
done
