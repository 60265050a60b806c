#!/usr/bin/env bash
# bench/gpu.sh - Lynx's GPU data path against its references, in one run,
# on a host with a GPU (issue 13; docs/gpu.md). Every figure stands beside
# the references measured in the same invocation:
#
#   sockperf        sockperf's own server (the floor of the client and kernel)
#   hostcentric     lynx-gpu-baseline --streams 1: recvfrom, copy in,
#                   one-block kernel, copy out, sendto, one request at a time
#                   (the design Lynx replaces)
#   cpu-shm         CPU accelerators, frontend over shm
#   cpu-tcp         CPU accelerators, frontend over tcp
#   gpu-host-shm    a GPU, mqueues in host memory mapped into it, over shm
#   gpu-host-tcp    a GPU, host-mapped mqueues, over tcp
#   gpu-dev-tcp     a GPU, mqueues in GPU memory, over tcp
#   gpu-q64, gpu-q1024  a GPU, host-mapped over shm, with 64 and with 1,024
#                   mqueues (auto --gpu-blocks: 64 and one per SM), under
#                   the same load from FLOWS sockperf clients (64 B, FLOW_RATE
#                   messages/s in all): the p99 of many mqueues per block
#
# All run sockperf-echo (a zero-time kernel unless WORK_US is set). Per
# message size: ping-pong round trip (sockperf --full-rtt: p50, p99),
# under-load at each rate in RATES (round trip p50, p99; sockperf's dropped,
# duplicated and out-of-order counts; the frontend's drops), and throughput
# (under-load --mps=max --reply-every=1: replies per second). Ratios against
# cpu-shm and hostcentric follow, with the issue's targets.
#
# usage: bench/gpu.sh [BUILD_DIR]
#   env: GPU (0), SIZES ("14 64 1400"), RATES ("10000 50000"), DURATION (5),
#        WORK_US (0), POLL (adaptive: the frontend's --poll), FLOWS (8),
#        FLOW_RATE (40000), LABELS (all of the above: a subset to rerun)
# Results: bench/results/gpu-<time>.txt
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN="$BUILD/bin"
GPU=${GPU:-0}
SIZES=${SIZES:-"14 64 1400"}
RATES=${RATES:-"10000 50000"}
DUR=${DURATION:-5}
WORK_US=${WORK_US:-0}
POLL=${POLL:-adaptive}
FLOWS=${FLOWS:-8}
FLOW_RATE=${FLOW_RATE:-40000}
PORT=17400
AG_ADDR=127.0.0.1:17701
METRICS=127.0.0.1:17702
AMETRICS=127.0.0.1:17703
TMP=$(mktemp -d /tmp/lynx-bench-gpu.XXXXXX)
command -v sockperf >/dev/null || { echo "sockperf is not installed (deploy/install-deps.sh)"; exit 1; }
[[ -x $BIN/lynx-gpu-baseline ]] || { echo "$BIN/lynx-gpu-baseline is missing: build with make LYNX_CUDA=ON"; exit 1; }
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "no GPU here (nvidia-smi -L lists none): bench/gpu.sh runs on a GPU host"
  exit 1
fi

source bench/lib.sh # pids, cleanup, wait_log

# start LABEL: the server under test on $PORT
start() {
  local agent=() mqueues=4
  case $1 in
  sockperf) sockperf server -i 127.0.0.1 -p "$PORT" >"$TMP/$1.log" 2>&1 & pids+=($!); sleep 0.5; return ;;
  hostcentric)
    "$BIN/lynx-gpu-baseline" --udp "127.0.0.1:$PORT" --device "$GPU" --app sockperf-echo \
      --streams 1 --work-us "$WORK_US" >"$TMP/$1.log" 2>&1 &
    pids+=($!)
    wait_log "$TMP/$1.log" "serving UDP"
    return ;;
  cpu-shm) agent=(--cpu-accels 1 --transport shm) ;;
  cpu-tcp) agent=(--cpu-accels 1 --transport tcp --data-listen 127.0.0.1:0) ;;
  gpu-host-shm) agent=(--cuda-accels "$GPU" --transport shm --region-mem host) ;;
  gpu-host-tcp) agent=(--cuda-accels "$GPU" --transport tcp --region-mem host --data-listen 127.0.0.1:0) ;;
  gpu-dev-tcp) agent=(--cuda-accels "$GPU" --transport tcp --region-mem device --data-listen 127.0.0.1:0) ;;
  gpu-q64 | gpu-q1024)
    agent=(--cuda-accels "$GPU" --transport shm --region-mem host --slots 64)
    mqueues=${1#gpu-q} ;;
  esac
  "$BIN/lynx-agent" "${agent[@]}" --app sockperf-echo --mqueues "$mqueues" --work-us "$WORK_US" \
    --listen "$AG_ADDR" --node-id bench --metrics "$AMETRICS" >"$TMP/$1-agent.log" 2>&1 &
  pids+=($!)
  wait_log "$TMP/$1-agent.log" "serving descriptors"
  "$BIN/lynx-frontend" --agent "$AG_ADDR" --udp "$PORT" --poll "$POLL" \
    --metrics "$METRICS" >"$TMP/$1-frontend.log" 2>&1 &
  pids+=($!)
  wait_log "$TMP/$1-frontend.log" "serving UDP"
}

# the frontend's drops so far (0 for the references), but for requests
# the app answers with nothing by design (app_dropped: sockperf-echo
# answers pong requests only, as sockperf's server does)
fe_drops() {
  local m
  m=$(curl -s "http://$METRICS/metrics" 2>/dev/null) || m=""
  awk '/^lynx_frontend_dropped_total/ && !/reason="app_dropped"/ {s += $NF}
       END {print s + 0}' <<<"$m"
}

# sockperf OUT -> "p50 p99 dropped duplicated out_of_order replies_per_s"
parse() {
  sed 's/\x1b\[[0-9;]*m//g' "$1" | awk '
    /percentile 50.000/ {p50 = $NF}
    /percentile 99.000/ {p99 = $NF}
    /dropped messages =/ {
      for (i = 1; i <= NF; i++) {
        if ($i == "dropped") d = $(i + 3)
        if ($i == "duplicated") u = $(i + 3)
        if ($i == "out-of-order") o = $(i + 3)
      }
    }
    /\[Valid Duration\]/ {
      for (i = 1; i <= NF; i++) {
        if ($i ~ /^RunTime=/) { split($i, a, "="); t = a[2] + 0 }
        if ($i ~ /^ReceivedMessages=/) { split($i, b, "="); r = b[2] + 0 }
      }
    }
    END {
      gsub(";", "", d); gsub(";", "", u); gsub(";", "", o)
      printf "%s %s %s %s %s %.0f\n", p50 + 0, p99 + 0, d + 0, u + 0, o + 0, (t > 0 ? r / t : 0)
    }'
}

RAW=$TMP/raw.txt
COPIES=$TMP/copies.txt
# copies LABEL: what the agent's transport did to reach the accelerator's
# memory over the whole run, per request the frontend dispatched
copies() {
  local a f
  a=$(curl -s "http://$AMETRICS/metrics" 2>/dev/null) || return 0
  f=$(curl -s "http://$METRICS/metrics" 2>/dev/null) || return 0
  awk -v l="$1" -v d="$(awk '/^lynx_frontend_dispatched_total/ {s += $NF} END {print s + 0}' <<<"$f")" '
    /^lynx_agent_accel_region_writes_total/ {w += $NF}
    /^lynx_agent_accel_region_reads_total/ {r += $NF}
    /^lynx_agent_accel_copies_total/ {c += $NF}
    /^lynx_agent_accel_copy_syncs_total/ {s += $NF}
    /^lynx_agent_accel_staging_waits_total/ {sw += $NF}
    END { if (d > 0) printf "%-13s %10d %8.2f %8.2f %8.2f %8.3f %8d\n", l, d, w / d, r / d, c / d, s / d, sw }' <<<"$a" >>"$COPIES"
}
measure() { # label
  local size rate d0 d1
  for size in $SIZES; do
    d0=$(fe_drops)
    sockperf ping-pong -i 127.0.0.1 -p "$PORT" -m "$size" -t "$DUR" --full-rtt >"$TMP/pp.out" 2>&1 || true
    d1=$(fe_drops)
    echo "$1 $size pingpong $(parse "$TMP/pp.out") $((d1 - d0))" >>"$RAW"
    for rate in $RATES; do
      d0=$(fe_drops)
      sockperf under-load -i 127.0.0.1 -p "$PORT" -m "$size" -t "$DUR" --mps="$rate" --full-rtt >"$TMP/ul.out" 2>&1 || true
      d1=$(fe_drops)
      echo "$1 $size load$rate $(parse "$TMP/ul.out") $((d1 - d0))" >>"$RAW"
    done
    d0=$(fe_drops)
    sockperf under-load -i 127.0.0.1 -p "$PORT" -m "$size" -t "$DUR" --mps=max --reply-every=1 --full-rtt >"$TMP/max.out" 2>&1 || true
    d1=$(fe_drops)
    echo "$1 $size max $(parse "$TMP/max.out") $((d1 - d0))" >>"$RAW"
  done
}

# FLOWS clients at once (each its own flow, so on its own mqueue while
# busy), FLOW_RATE/FLOWS messages/s each, 64 B: the worst p99 and the
# median p50 of the clients, their drops summed.
measure_flows() { # label
  local i d0 d1 clients=()
  d0=$(fe_drops)
  for i in $(seq "$FLOWS"); do
    sockperf under-load -i 127.0.0.1 -p "$PORT" -m 64 -t "$DUR" --mps=$((FLOW_RATE / FLOWS)) \
      --full-rtt >"$TMP/flow$i.out" 2>&1 &
    clients+=($!)
  done
  wait "${clients[@]}" || true
  d1=$(fe_drops)
  for i in $(seq "$FLOWS"); do parse "$TMP/flow$i.out"; done | sort -n -k1 |
    awk -v l="$1" -v r="$FLOW_RATE" -v f="$((d1 - d0))" '
      { p50[NR] = $1; if ($2 > p99) p99 = $2; d += $3; u += $4; o += $5; rate += $6 }
      END { printf "%s 64 flows%s %s %s %d %d %d %.0f %d\n", l, r, p50[int((NR + 1) / 2)], p99, d, u, o, rate, f }' >>"$RAW"
}

LABELS=${LABELS:-"sockperf hostcentric cpu-shm cpu-tcp gpu-host-shm gpu-host-tcp gpu-dev-tcp gpu-q64 gpu-q1024"}
for l in $LABELS; do
  echo "== $l" >&2
  if start "$l"; then
    case $l in
    gpu-q*) measure_flows "$l" ;;
    *) measure "$l" ;;
    esac
    case $l in gpu-*tcp) copies "$l" ;; esac
  else
    echo "$l did not start" >&2
  fi
  cleanup
done

# field of label/size/kind: 4 p50, 5 p99, 6 dropped, 7 dup, 8 ooo, 9 rate, 10 fe drops
get() { awk -v l="$1" -v s="$2" -v k="$3" -v f="$4" '$1 == l && $2 == s && $3 == k {print $f}' "$RAW"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a != "" && b > 0) printf "%.2f", a / b; else print "n/a" }'; }

OUT="bench/results/gpu-$(date -u +%Y%m%dT%H%M%SZ).txt"
{
  echo "# bench/gpu.sh  $(date -u +%FT%TZ)  $(uname -m) $(nproc) cores  $(nvidia-smi -L 2>/dev/null | sed -n "$((GPU + 1))p")"
  echo "# git $(git rev-parse --short HEAD 2>/dev/null || echo '?'); duration ${DUR}s; work_us $WORK_US; frontend --poll $POLL"
  echo "# round trips (sockperf --full-rtt), microseconds; rate: replies/s"
  printf "%-13s %5s %-10s %9s %9s %7s %5s %5s %10s %8s\n" server size run p50_rtt p99_rtt dropped dup ooo rate fe_drops
  awk '{printf "%-13s %5s %-10s %9s %9s %7s %5s %5s %10s %8s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10}' "$RAW"
  echo
  echo "# ratios (same run)"
  for size in $SIZES; do
    echo "size $size:"
    echo "  gpu-host-shm p50 / cpu-shm p50:      $(ratio "$(get gpu-host-shm "$size" pingpong 4)" "$(get cpu-shm "$size" pingpong 4)")  (target <= 1.3)"
    echo "  gpu-host-shm p50 / hostcentric p50:  $(ratio "$(get gpu-host-shm "$size" pingpong 4)" "$(get hostcentric "$size" pingpong 4)")  (target <= 0.5)"
    echo "  gpu-host-shm p50, us:                $(get gpu-host-shm "$size" pingpong 4)  (target <= 19)"
    echo "  gpu-host-tcp p50 / cpu-tcp p50:      $(ratio "$(get gpu-host-tcp "$size" pingpong 4)" "$(get cpu-tcp "$size" pingpong 4)")  (target <= 1.1)"
    echo "  gpu-dev-tcp p50 / cpu-tcp p50:       $(ratio "$(get gpu-dev-tcp "$size" pingpong 4)" "$(get cpu-tcp "$size" pingpong 4)")"
    echo "  gpu-host-tcp rate / cpu-tcp rate:    $(ratio "$(get gpu-host-tcp "$size" max 9)" "$(get cpu-tcp "$size" max 9)")  (target >= 1)"
  done
  if [[ -s $COPIES ]]; then
    echo "# the tcp agent's copies into GPU memory, per request dispatched (the whole run of that server)"
    printf "%-13s %10s %8s %8s %8s %8s %8s\n" server requests writes reads copies syncs stg_waits
    cat "$COPIES"
  fi
  echo "many mqueues per block, $FLOWS flows, $FLOW_RATE msg/s in all, 64 B:"
  echo "  gpu-q1024 p99 / gpu-q64 p99:         $(ratio "$(get gpu-q1024 64 "flows$FLOW_RATE" 5)" "$(get gpu-q64 64 "flows$FLOW_RATE" 5)")  (target <= 2)"
  echo "# below saturation nothing may be dropped, duplicated or reordered (dropped/dup/ooo of the ping-pong and load runs)"
} | tee "$OUT"
