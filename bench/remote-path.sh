#!/usr/bin/env bash
# bench/remote-path.sh - what reaching an accelerator over the tcp transport
# costs against shm and against the floor of one message each way (issue
# 36), side by side in one run.
#
# Paths, each a sockperf server the client cannot tell apart:
#   udp-floor  sockperf's own UDP server (the floor for one datagram each way)
#   tcp-floor  sockperf's own TCP server (one TCP message each way)
#   shm        a frontend and an agent with 2 CPU accelerators over shm
#              (default slots up to 1,400 B; 64 KiB slots beyond)
#   tcp        the same over the tcp transport
# For each BUILD_DIR given (its own agent and frontend; builds alternate
# within a round, so a drift of the machine hits all alike), each path and
# each message size:
#   - ping-pong of DURATION s: one-way p50 and p99 (sockperf's default: half
#     the round trip);
#   - under-load at --mps max for DURATION s: answers a second;
#   - under-load at --mps RATE (20,000) for DURATION s: CPU per answer of the
#     frontend and of the agent (utime + stime of every thread over the
#     answers; sockperf's own server in the frontend's column).
# ROUNDS rounds; the summary gives each figure's median over the rounds
# (ping-pong p50 on this machine is bimodal: one run says little).
#
# usage: bench/remote-path.sh BUILD_DIR [BUILD_DIR...]
#   env: DURATION (3), ROUNDS (5), SIZES ("14 64 1400 60000"),
#        PATHS ("udp-floor tcp-floor shm tcp"), RATE (20000),
#        OUT (bench/results/remote-path-<time>.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
(($#)) || {
  echo "usage: $0 BUILD_DIR [BUILD_DIR...]"
  exit 2
}
DUR=${DURATION:-3}
ROUNDS=${ROUNDS:-5}
SIZES=${SIZES:-14 64 1400 60000}
PATHS=${PATHS:-udp-floor tcp-floor shm tcp}
RATE=${RATE:-20000}
FE_PORT=${FE_PORT:-17040}
AG_ADDR=${AG_ADDR:-127.0.0.1:17741}
OUT=${OUT:-bench/results/remote-path-$(date -u +%Y%m%dT%H%M%SZ).txt}
TMP=$(mktemp -d /tmp/lynx-remotepath.XXXXXX)
command -v sockperf >/dev/null ||
  {
    echo "sockperf is not installed (deploy/install-deps.sh)"
    exit 1
  }
# shellcheck source=bench/lib.sh
source bench/lib.sh # pids, cleanup, cpu_ticks, wait_log, sockperf_pct, sockperf_stat
TCK=$(getconf CLK_TCK)
for b in "$@"; do
  [[ -x $b/bin/lynx-agent && -x $b/bin/lynx-frontend ]] ||
    {
      echo "$b has no bin/lynx-agent and bin/lynx-frontend: build it first"
      exit 1
    }
done

FE='' AG=''
# up BUILD PATH SIZE: the server side of PATH (FE: the process sockperf
# talks to; AG: the agent, or empty)
up() {
  local b=$1 p=$2 m=$3 geom=()
  FE='' AG=''
  case $p in
  udp-floor | tcp-floor)
    local tcp=()
    [[ $p == tcp-floor ]] && tcp=(--tcp)
    sockperf server -i 127.0.0.1 -p "$FE_PORT" "${tcp[@]}" \
      >"$TMP/server.log" 2>&1 &
    FE=$!
    pids+=("$FE")
    sleep 0.3
    ;;
  shm | tcp)
    # the default geometry up to what a default slot holds; beyond, slots
    # that hold the size inline (large-msg.sh's "inline")
    ((m <= 1400)) || geom=(--slot-size 65536 --slots 64 --msg-max 65520)
    "$b/bin/lynx-agent" --cpu-accels 2 --app sockperf-echo --mqueues 4 \
      "${geom[@]}" --transport "$p" --listen "$AG_ADDR" >"$TMP/agent.log" 2>&1 &
    AG=$!
    pids+=("$AG")
    wait_log "$TMP/agent.log" "serving descriptors" >/dev/null
    "$b/bin/lynx-frontend" --agent "$AG_ADDR" --udp "$FE_PORT" \
      >"$TMP/frontend.log" 2>&1 &
    FE=$!
    pids+=("$FE")
    wait_log "$TMP/frontend.log" "serving UDP" >/dev/null
    ;;
  esac
}

sp() { # sp PATH SIZE sockperf-args...
  local p=$1 m=$2 tcp=()
  shift 2
  [[ $p == tcp-floor ]] && tcp=(--tcp)
  sockperf "$@" -i 127.0.0.1 -p "$FE_PORT" -m "$m" "${tcp[@]}"
}

ticks() { [[ -n $1 ]] && cpu_ticks "$1" || echo 0; }

mkdir -p "$(dirname "$OUT")"
{
  echo "# bench/remote-path.sh $(date -u +%FT%TZ) on $(uname -n), $(nproc) cores;" \
    "git $(git rev-parse --short HEAD 2>/dev/null || echo '?'); builds: $*"
  echo "# DURATION=$DUR ROUNDS=$ROUNDS RATE=$RATE SIZES=\"$SIZES\""
  echo "# round build path size p50_us p99_us answers_per_s fe_us_per_answer agent_us_per_answer"
} | tee "$OUT"
for round in $(seq "$ROUNDS"); do
  for b in "$@"; do
    for path in $PATHS; do # not p: cleanup (bench/lib.sh) loops with it
      # the floors do not depend on the build: measured once a round
      [[ $path == *-floor && $b != "$1" ]] && continue
      for m in $SIZES; do
        # sockperf's UDP server cannot answer a datagram over 65,507 B,
        # nor ours; every size here fits
        up "$b" "$path" "$m"
        sp "$path" "$m" ping-pong -t 1 >/dev/null 2>&1 || true # warm-up
        sp "$path" "$m" ping-pong -t "$DUR" >"$TMP/pp.txt" 2>&1 || true
        read -r p50 p99 < <(sockperf_pct "$TMP/pp.txt")
        sp "$path" "$m" under-load -t "$DUR" --mps max --reply-every 1 \
          >"$TMP/max.txt" 2>&1 || true
        aps=$(sockperf_stat "$TMP/max.txt" replies_per_s)
        f0=$(ticks "$FE") a0=$(ticks "$AG")
        sp "$path" "$m" under-load -t "$DUR" --mps "$RATE" --reply-every 1 \
          >"$TMP/rate.txt" 2>&1 || true
        f1=$(ticks "$FE") a1=$(ticks "$AG")
        n=$(sockperf_stat "$TMP/rate.txt" replies_per_s)
        read -r fe_us ag_us < <(awk -v f=$((f1 - f0)) -v a=$((a1 - a0)) \
          -v n="$n" -v d="$DUR" -v hz="$TCK" 'BEGIN {
            k = n * d; if (k < 1) k = 1
            printf "%.2f %.2f\n", f / hz * 1e6 / k, a / hz * 1e6 / k }')
        [[ -n $AG ]] || ag_us=-
        echo "$round $b $path $m $p50 $p99 $aps $fe_us $ag_us" | tee -a "$OUT"
        cleanup
      done
    done
  done
done
# medians per (build, path, size); the floors under the first build's name
echo "# medians: build path size p50_us p99_us answers_per_s fe_us_per_answer agent_us_per_answer" |
  tee -a "$OUT"
awk '
  /^#/ { next }
  { k = $2 " " $3 " " $4; keys[k] = 1
    for (i = 5; i <= 9; i++) { n = ++cnt[k, i]; v[k, i, n] = $i } }
  function median(k, i,    n, a, j, t, x) {
    n = cnt[k, i]
    for (j = 1; j <= n; j++) a[j] = v[k, i, j]
    for (j = 2; j <= n; j++) { x = a[j]; t = j - 1
      while (t > 0 && a[t] + 0 > x + 0) { a[t + 1] = a[t]; t-- } a[t + 1] = x }
    if (a[1] == "-") return "-"
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  END {
    for (k in keys) {
      printf "median %s", k
      for (i = 5; i <= 9; i++) printf " %s", median(k, i)
      printf "\n"
    }
  }' "$OUT" | sort -k2,2 -k3,3 -k4,4n | tee -a "$OUT"
echo "# results in $OUT"
