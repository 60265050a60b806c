#!/usr/bin/env bash
# bench/tcp-cycle.sh - what the tcp transport adds over shm, before and
# after a change, in one run (issue 15: "tcp adds <= 15 us one-way p50 over
# shm at 64 B, at any poll mode").
#
# For each build given (its own agent and frontend: the tcp wire protocol
# may differ between them), each transport (shm, tcp) and each poll mode
# (adaptive, busy): an agent with 2 CPU accelerators running sockperf-echo
# (4 mqueues) and one frontend; a 64-byte sockperf ping-pong of DURATION
# seconds (one-way p50 and p99, as sockperf reports them: half the round
# trip). Then, over tcp, sockperf under-load at --mps MPS for DURATION
# seconds: answers a second. Builds alternate within each round, ROUNDS
# rounds, so a drift of the shared machine hits both alike.
#
# usage: bench/tcp-cycle.sh BUILD_DIR [BUILD_DIR...]
#   env: DURATION (4), ROUNDS (2), MPS (max), POLLS ("adaptive busy"),
#        TRANSPORTS ("shm tcp")
# prints one line per measurement:
#   BUILD TRANSPORT POLL pingpong p50_us p99_us | underload replies_per_s
set -euo pipefail
cd "$(dirname "$0")/.."
(($#)) || { echo "usage: $0 BUILD_DIR [BUILD_DIR...]"; exit 2; }
DUR=${DURATION:-4}
ROUNDS=${ROUNDS:-2}
MPS=${MPS:-max}
POLLS=${POLLS:-adaptive busy}
TRANSPORTS=${TRANSPORTS:-shm tcp}
FE_PORT=${FE_PORT:-17030}
AG_ADDR=${AG_ADDR:-127.0.0.1:17731}
TMP=$(mktemp -d /tmp/lynx-tcpcycle.XXXXXX)
command -v sockperf >/dev/null ||
  { echo "sockperf is not installed (deploy/install-deps.sh)"; exit 1; }
source bench/lib.sh # pids, cleanup, wait_log, sockperf_stat

# start BUILD TRANSPORT POLL: an agent and a frontend of BUILD
start() {
  "$1/bin/lynx-agent" --cpu-accels 2 --app sockperf-echo --mqueues 4 \
    --transport "$2" --listen "$AG_ADDR" >"$TMP/agent.log" 2>&1 &
  pids+=($!)
  wait_log "$TMP/agent.log" "serving descriptors" >/dev/null
  "$1/bin/lynx-frontend" --agent "$AG_ADDR" --udp "$FE_PORT" --poll "$3" \
    >"$TMP/frontend.log" 2>&1 &
  pids+=($!)
  wait_log "$TMP/frontend.log" "serving UDP"
}

sp() { sockperf "$@" -i 127.0.0.1 -p "$FE_PORT" -m 64; }

for round in $(seq "$ROUNDS"); do
  for b in "$@"; do
    for t in $TRANSPORTS; do
      for poll in $POLLS; do
        start "$b" "$t" "$poll"
        sp ping-pong -t 1 >/dev/null 2>&1 || true # warm-up
        sp ping-pong -t "$DUR" >"$TMP/pp.txt" 2>&1 || true
        read -r p50 p99 < <(sockperf_pct "$TMP/pp.txt")
        printf "round %s %s %s %s pingpong p50 %s us p99 %s us\n" \
          "$round" "$b" "$t" "$poll" "$p50" "$p99"
        if [ "$t" = tcp ]; then
          sp under-load -t "$DUR" --mps "$MPS" --reply-every 1 \
            --buffer-size 4194304 >"$TMP/ul.txt" 2>&1 || true
          printf "round %s %s %s %s underload %s answers/s\n" "$round" "$b" \
            "$t" "$poll" "$(sockperf_stat "$TMP/ul.txt" replies_per_s)"
        fi
        cleanup
      done
    done
  done
done
