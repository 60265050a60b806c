#!/usr/bin/env bash
# bench/accels-per-core.sh - how much the frontend costs per response and
# how many accelerators one frontend core drives (issue 15; the paper's
# Figure 8c method), in one run, beside sockperf's own server.
#
#  1. CPU per response at fixed offered rates (RATES, 64 B UDP, every
#     message answered: sockperf under-load --reply-every 1): the
#     frontend's own CPU time (utime + stime of the process, every thread)
#     over the run divided by the responses it sent, beside sockperf's own
#     server's CPU per reply at the same rate; the ratio (target <= 0.5 at
#     50k/s). Lynx serves sockperf-echo on 2 CPU accelerators over shm.
#  2. Accelerators per frontend core, for each transport in TRANSPORTS:
#     N emulated accelerators (--work-us 300 --work-mode sleep, one mqueue
#     each: at most 3,333 requests/s each, less as a sleep overshoots; one
#     accelerator's own rate is measured first and 90 % of it offered per
#     accelerator, as the paper offered 3.3k/s to a 3.5k/s LeNet), offered
#     N x that from min(2N, 64) sockets; the largest N (doubling, then
#     bisecting) served
#     without loss: sockperf counts no drop, the frontend none but the
#     app's, and at least 97 % of the offered rate answered. With 8 cores or
#     more, the frontend is pinned to core 0 (taskset) and the clients and
#     accelerators to the others; with fewer, nothing is pinned and the
#     figure is what the machine's cores together allow, not one core's.
#
# Both parts run once per frontend receive path in RX (--rx socket:
# libuv's recvmmsg; --rx uring: io_uring's multishot recvmsg; docs/design.md
# "Receive path"), in the same run against the same sockperf baseline;
# part 1 also gives the receive system calls per datagram
# (lynx_frontend_rx_syscalls_total / received_total) and, with both paths,
# the uring/socket ratio of CPU per response.
#
# usage: bench/accels-per-core.sh [BUILD_DIR]
#   env: RATES ("10000 50000 100000"), DURATION (5), TRANSPORTS ("shm tcp"),
#        NMAX (256; 32 below 8 cores), PARTS ("cpu accels"),
#        RX ("socket uring")
# Results: bench/results/accels-per-core-<time>.txt
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN="$BUILD/bin"
RATES=${RATES:-"10000 50000 100000"}
DUR=${DURATION:-5}
TRANSPORTS=${TRANSPORTS:-"shm tcp"}
PARTS=${PARTS:-"cpu accels"}
RX=${RX:-"socket uring"}
LYNX_RX=${RX%% *} # the receive path lynx_up starts the frontend with
CORES=$(nproc)
if ((CORES >= 8)); then NMAX=${NMAX:-256}; PIN_FE=(taskset -c 0); PIN_REST=(taskset -c "1-$((CORES - 1))")
else NMAX=${NMAX:-32}; PIN_FE=(); PIN_REST=(); fi
HZ=$(getconf CLK_TCK)
PORT=17480
AG_ADDR=127.0.0.1:17781
METRICS=127.0.0.1:17782
TMP=$(mktemp -d /tmp/lynx-bench-apc.XXXXXX)
command -v sockperf >/dev/null || { echo "sockperf is not installed (deploy/install-deps.sh)"; exit 1; }
source bench/lib.sh # pids, cleanup, cpu_ticks, wait_log, sockperf_stat
log() { printf '[%s] accels-per-core: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
OUT_LINES=$TMP/results.txt
out() { echo "$*" | tee -a "$OUT_LINES" >&2; }
fe_drops() { # every drop but the app's own (sockperf-echo answers pongs only)
  curl -s "http://$METRICS/metrics" 2>/dev/null |
    awk '/^lynx_frontend_dropped_total/ && !/reason="app_dropped"/ {s += $NF} END {print s + 0}'
}
fe_calls_per_dgram() { # receive system calls per datagram received
  curl -s "http://$METRICS/metrics" 2>/dev/null |
    awk '/^lynx_frontend_rx_syscalls_total/ {c += $NF} /^lynx_frontend_received_total/ {r += $NF}
      END { if (r > 0) printf "%.3f", c / r; else print "n/a" }'
}

# lynx_up TRANSPORT ACCELS [AGENT OPTION...]: agent and frontend (pinned)
lynx_up() {
  local tr=$1 n=$2 extra=()
  shift 2
  [[ $tr == tcp ]] && extra=(--data-listen 127.0.0.1:0)
  "${PIN_REST[@]}" "$BIN/lynx-agent" --cpu-accels "$n" --transport "$tr" "${extra[@]}" \
    --app sockperf-echo --listen "$AG_ADDR" --node-id apc "$@" >"$TMP/agent.log" 2>&1 &
  pids+=($!)
  wait_log "$TMP/agent.log" "serving descriptors"
  "${PIN_FE[@]}" "$BIN/lynx-frontend" --agent "$AG_ADDR" --udp "$PORT" --workers 1 \
    --rx "$LYNX_RX" --metrics "$METRICS" >"$TMP/frontend.log" 2>&1 &
  FE_PID=$!
  pids+=("$FE_PID")
  wait_log "$TMP/frontend.log" "serving UDP"
}

# ---- 1. CPU per response --------------------------------------------------------
# received OUT: "messages seconds": what sockperf got back over its whole
# run, and that run's length
received() {
  sed 's/\x1b\[[0-9;]*m//g' "$1" | awk '/\[Total Run\]/ {
    for (i = 1; i <= NF; i++) {
      if ($i ~ /^RunTime=/) { split($i, a, "="); t = a[2] + 0 }
      if ($i ~ /^ReceivedMessages=/) { split($i, b, "="); n = b[2] + 0 } }
    print n, t }'
}
# cpu_run PID RATE OUT: sockperf at RATE against $PORT; prints
# "replies_per_s cpu_us_per_reply": the replies sockperf counted (the same
# count for sockperf's server and Lynx) per second of its run, and the CPU
# time process PID used from sockperf's start to its end per reply (the
# client's start-up, idle for the server, is in the window for both)
cpu_run() {
  local pid=$1 rate=$2 o=$3 c0 c1 n t
  c0=$(cpu_ticks "$pid")
  "${PIN_REST[@]}" sockperf under-load -i 127.0.0.1 -p "$PORT" -m 64 -t "$DUR" --mps "$rate" \
    --reply-every 1 >"$o" 2>&1 || true
  c1=$(cpu_ticks "$pid")
  read -r n t < <(received "$o")
  awk -v n="${n:-0}" -v t="${t:-0}" -v c=$((c1 - c0)) -v hz="$HZ" 'BEGIN {
    printf "%.0f %.2f\n", (t > 0 ? n / t : 0), (n > 0 ? (c / hz) * 1e6 / n : 0) }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
part_cpu() {
  local rate spid s l srps sus lrps lus calls rx us_socket us_uring
  out "# CPU per response at fixed offered rates, 64 B UDP, every message answered ($CORES cores; frontend --workers 1; CPU of the whole process)"
  out "$(printf '%-8s %-7s %14s %14s %14s %14s %8s %10s' rate rx sockperf_rps sockperf_us lynx_rps lynx_us ratio calls/dgram)"
  for rate in $RATES; do
    "${PIN_FE[@]}" sockperf server -i 127.0.0.1 -p "$PORT" >"$TMP/server.log" 2>&1 &
    spid=$!
    pids+=("$spid")
    sleep 0.5
    s=$(cpu_run "$spid" "$rate" "$TMP/cpu-sp-$rate.out")
    cleanup
    read -r srps sus <<<"$s"
    us_socket='' us_uring=''
    for rx in $RX; do
      LYNX_RX=$rx
      lynx_up shm 2 --mqueues 4
      l=$(cpu_run "$FE_PID" "$rate" "$TMP/cpu-lynx-$rate-$rx.out")
      calls=$(fe_calls_per_dgram)
      cleanup
      read -r lrps lus <<<"$l"
      printf -v "us_$rx" '%s' "$lus"
      out "$(printf '%-8s %-7s %14s %14s %14s %14s %8s %10s' "$rate" "$rx" "$srps" "$sus" \
        "$lrps" "$lus" "$(ratio "$lus" "$sus")" "$calls")"
    done
    [[ -n $us_socket && -n $us_uring ]] &&
      out "$(printf '%-8s uring/socket CPU per response: %s' "$rate" "$(ratio "$us_uring" "$us_socket")")"
  done
  LYNX_RX=${RX%% *}
  out "# ratio: frontend CPU per response / sockperf server CPU per reply (target <= 0.5 at 50k/s)"
}

# ---- 2. accelerators per frontend core ----------------------------------------------
# serves TRANSPORT N: 0 when the frontend serves N emulated accelerators at
# N x 3,300 msg/s without loss (and logs the run)
serves() {
  local tr=$1 n=$2 rate=$(($2 * PER)) k d0 d1 got lost
  k=$((2 * n < 64 ? 2 * n : 64))
  for _ in $(seq "$k"); do echo "U:127.0.0.1:$PORT"; done >"$TMP/feed.txt"
  lynx_up "$tr" "$n" --mqueues 1 --work-us 300 --work-mode sleep --accel-threads 1
  d0=$(fe_drops)
  "${PIN_REST[@]}" sockperf under-load -f "$TMP/feed.txt" -t "$DUR" --mps "$rate" \
    --reply-every 1 -m 64 >"$TMP/apc-$tr-$n.out" 2>&1 || true
  d1=$(fe_drops)
  cleanup
  got=$(sockperf_stat "$TMP/apc-$tr-$n.out" replies_per_s)
  lost=$(sockperf_stat "$TMP/apc-$tr-$n.out" dropped)
  log "$tr: $n accelerators, offered $rate/s: answered $got/s, sockperf dropped $lost, frontend drops $((d1 - d0))"
  ((lost == 0 && d1 - d0 == 0 && got * 100 >= rate * 97))
}
# one accelerator's rate (replies/s) over TRANSPORT at --mps=max
accel_rate() {
  for _ in 1 2; do echo "U:127.0.0.1:$PORT"; done >"$TMP/feed.txt"
  lynx_up "$1" 1 --mqueues 1 --work-us 300 --work-mode sleep --accel-threads 1
  "${PIN_REST[@]}" sockperf under-load -f "$TMP/feed.txt" -t "$DUR" --mps=max \
    --reply-every 1 -m 64 >"$TMP/apc-cap-$1.out" 2>&1 || true
  cleanup
  sockperf_stat "$TMP/apc-cap-$1.out" replies_per_s
}
part_accels() {
  local tr lo hi mid cap
  local pin="not pinned: fewer than 8 cores, so not one core's figure"
  ((CORES >= 8)) && pin="frontend pinned to core 0"
  out "# accelerators one frontend core drives (300 us of work each, 90 % of one accelerator's measured rate offered to each, UDP 64 B; $CORES cores: $pin)"
  for LYNX_RX in $RX; do
    out "frontend --rx $LYNX_RX:"
    for tr in $TRANSPORTS; do
      cap=$(accel_rate "$tr")
      PER=$((cap * 9 / 10))
      out "$tr: one accelerator answers $cap/s at saturation; offered $PER/s per accelerator"
      ((PER > 0)) || { out "$tr: no rate measured"; continue; }
      lo=0 hi=1
      while ((hi <= NMAX)) && serves "$tr" "$hi"; do lo=$hi hi=$((hi * 2)); done
      ((hi > NMAX)) && hi=$((NMAX + 1))
      while ((hi - lo > 1)); do
        mid=$(((lo + hi) / 2))
        if serves "$tr" "$mid"; then lo=$mid; else hi=$mid; fi
      done
      out "$(printf '%-4s accelerators served without loss: %d (%d msg/s; paper: 74 per Xeon core, 102 per 7-core BlueField, UDP)' "$tr" "$lo" $((lo * PER)))"
    done
  done
  LYNX_RX=${RX%% *}
}

: >"$OUT_LINES"
for p in $PARTS; do "part_$p"; done
mkdir -p bench/results
res="bench/results/accels-per-core-$(date -u +%Y%m%dT%H%M%SZ).txt"
{
  echo "# bench/accels-per-core.sh $(date -u +%FT%TZ) $(uname -m) $CORES cores; git $(git rev-parse --short HEAD 2>/dev/null || echo '?'); ${DUR}s per run"
  cat "$OUT_LINES"
} >"$res"
cat "$res"
