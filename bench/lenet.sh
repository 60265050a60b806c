#!/usr/bin/env bash
# bench/lenet.sh - LeNet-5 inference (docs/lenet.md) through Lynx against a
# host-centric server running the same inference, one run, the same client.
#
#  (1) Lynx: one agent with ACCELS CPU accelerators running the lenet app
#      (static mode, shm, 2 mqueues each) and the frontend;
#  (2) baseline: lynx-lenet-baseline --threads THREADS (receives, infers
#      with the same accel/lenet.c and weights, answers; no mqueues).
# Each is driven by lynx-lenet-load with Fashion-MNIST test images, which
# checks every answer against the training script's reference (a wrong
# class stops the bench): ping-pong (1 outstanding, one flow: latency) and
# closed loop with WINDOW outstanding over FLOWS sockets (throughput: the
# kernel hashes flows onto the baseline's SO_REUSEPORT sockets, so one flow
# would reach a single thread, and a few flows an uneven share of them),
# DURATION s each, median of RUNS by req/s. Reports req/s, p50, p99 and the Lynx/baseline ratios.
# Client, frontend, accelerators and baseline share the machine's cores:
# the ratios are the result, not the absolute numbers.
#
# usage: bench/lenet.sh [BUILD_DIR]
#   env: ACCELS (2) THREADS (2) WINDOW (8) FLOWS (16) DURATION (5) RUNS (3)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN="$BUILD/bin"
ACCELS=${ACCELS:-2}
THREADS=${THREADS:-2}
WINDOW=${WINDOW:-8}
FLOWS=${FLOWS:-16}
DUR=${DURATION:-5}
RUNS=${RUNS:-3}
MODEL=models/lenet-fashion.bin
REF=models/lenet-fashion.ref
DATA=${LYNX_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
AG_ADDR=127.0.0.1:17711 FE=17910 BASE=17911
TMP=$(mktemp -d /tmp/lynx-lenet.XXXXXX)
[[ -r $DATA/t10k-images-idx3-ubyte.gz ]] ||
  { echo "no Fashion-MNIST test set in $DATA (deploy/install-deps.sh)"; exit 1; }
for b in lynx-agent lynx-frontend lynx-lenet-load lynx-lenet-baseline; do
  [[ -x $BIN/$b ]] || { echo "$BIN/$b missing: build first (make)"; exit 1; }
done

source bench/lib.sh # pids, cleanup
log() { printf '[%s] lenet: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
wait_log() { # FILE PATTERN
  for _ in $(seq 200); do grep -qF -- "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  echo "timed out waiting for '$2' in $1" >&2; cat "$1" >&2; exit 1
}

# run PORT WINDOW: one load run (FLOWS sockets unless ping-pong); prints
# "req_per_s p50 p99"
run() {
  local out flows=$FLOWS
  (($2 > 1)) || flows=1
  out=$("$BIN/lynx-lenet-load" --target "127.0.0.1:$1" --window "$2" \
    --flows "$flows" --seconds "$DUR" --data "$DATA" --ref "$REF") || {
    echo "$out" >&2; echo "lynx-lenet-load: wrong or malformed answers" >&2
    for f in "$TMP"/*.log; do echo "== $f" >&2; tail -n 5 "$f" >&2; done; exit 1; }
  log "$out"
  sed -E 's/.*req_per_s=([0-9]+) p50_us=([0-9]+) p99_us=([0-9]+).*/\1 \2 \3/' <<<"$out"
}
# median PORT WINDOW: the run with the median req/s of RUNS
median() {
  local i
  for ((i = 0; i < RUNS; i++)); do run "$1" "$2"; done | sort -n | sed -n "$(((RUNS + 1) / 2))p"
}

# ---- (1) Lynx -------------------------------------------------------------------------------
log "Lynx: $ACCELS CPU accelerators running lenet, frontend"
"$BIN/lynx-agent" --cpu-accels "$ACCELS" --app lenet --lenet-model "$MODEL" \
  --mqueues 2 --transport shm --listen "$AG_ADDR" >"$TMP/agent.log" 2>&1 &
pids+=($!)
wait_log "$TMP/agent.log" "serving descriptors on"
"$BIN/lynx-frontend" --agent "$AG_ADDR" --udp "127.0.0.1:$FE" >"$TMP/frontend.log" 2>&1 &
pids+=($!)
wait_log "$TMP/frontend.log" "serving UDP"
run "$FE" 4 >/dev/null # warm-up
read -r l1_rps l1_p50 l1_p99 < <(median "$FE" 1)
read -r lw_rps lw_p50 lw_p99 < <(median "$FE" "$WINDOW")
cleanup

# ---- (2) baseline ----------------------------------------------------------------------------
log "baseline: lynx-lenet-baseline, $THREADS threads"
"$BIN/lynx-lenet-baseline" --udp "127.0.0.1:$BASE" --model "$MODEL" \
  --threads "$THREADS" >"$TMP/base.log" 2>&1 &
pids+=($!)
wait_log "$TMP/base.log" "serving LeNet"
run "$BASE" 4 >/dev/null
read -r b1_rps b1_p50 b1_p99 < <(median "$BASE" 1)
read -r bw_rps bw_p50 bw_p99 < <(median "$BASE" "$WINDOW")
cleanup

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
mkdir -p bench/results
res="bench/results/lenet-$(date -u +%Y%m%dT%H%M%SZ).txt"
{
  echo "# bench/lenet.sh $(date -u +%FT%TZ) $(uname -m) $(nproc) cores; git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "# LeNet-5 on Fashion-MNIST test images (784 B + 12 B cookie -> 56 B), UDP, closed loop, ${DUR}s, median of $RUNS; every answer checked against the reference (0 wrong)"
  echo "# Lynx: $ACCELS CPU accelerators (shm, static mode) + frontend; baseline: lynx-lenet-baseline, $THREADS threads; the same accel/lenet.c"
  echo "# one machine: client, frontend, accelerators and baseline share its cores"
  echo "# window 1: ping-pong over one socket; window $WINDOW: over $FLOWS sockets"
  printf '%-10s %8s %10s %10s %10s\n' system window req_per_s p50_us p99_us
  printf '%-10s %8s %10s %10s %10s\n' lynx 1 "$l1_rps" "$l1_p50" "$l1_p99"
  printf '%-10s %8s %10s %10s %10s\n' baseline 1 "$b1_rps" "$b1_p50" "$b1_p99"
  printf '%-10s %8s %10s %10s %10s\n' lynx "$WINDOW" "$lw_rps" "$lw_p50" "$lw_p99"
  printf '%-10s %8s %10s %10s %10s\n' baseline "$WINDOW" "$bw_rps" "$bw_p50" "$bw_p99"
  echo "ratio lynx/baseline: throughput (window $WINDOW) $(ratio "$lw_rps" "$bw_rps")x, p50 (ping-pong) $(ratio "$l1_p50" "$b1_p50")x, p99 (ping-pong) $(ratio "$l1_p99" "$b1_p99")x"
} | tee "$res"
