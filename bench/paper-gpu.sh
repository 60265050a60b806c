#!/usr/bin/env bash
# bench/paper-gpu.sh - the Lynx paper's GPU experiments (§6), on a host with
# a GPU, in one invocation, every answer checked, Lynx beside the
# host-centric server on the same GPU (issue 14; docs/lenet.md,
# docs/face-verify.md, docs/gpu.md):
#
#  1. LeNet inference (paper §6.3: 3.5 Kreq/s per GPU at about 300 us,
#     1.25x the host-centric server's 2.8 Kreq/s). Lynx: the lenet kernel on
#     GPU $GPU, mqueues in host memory mapped into it, the frontend on this
#     host over shm. Host-centric: lynx-gpu-baseline --app lenet (STREAMS
#     CUDA streams, the same device code). lynx-lenet-load sends Fashion-
#     MNIST test images: throughput at saturation (closed loop, WINDOW
#     requests outstanding over CONNS sockets) and p50/p99 with one request
#     at a time; every class equal to the training script's reference,
#     logits bit-equal where it keeps them.
#  2. Face verification with the stored image fetched from memcached
#     (paper §6.4: 4.4x host-centric on BlueField, 4.6x on a Xeon core):
#     bench/face-verify.sh with GPU=$GPU (the face-verify kernel calling
#     memcached through its blocks' client mqueues, against lynx-gpu-baseline
#     --app face-verify fetching from the same memcached).
#  3. Throughput against mqueues per GPU for emulated request times of 20 us
#     to 1.6 ms (paper Figure 6): sockperf-echo with --work-us W on MQUEUES
#     mqueues (one block each), against lynx-gpu-baseline with as many CUDA
#     streams; sockperf under-load --mps=max from FLOWS sockets (one flow
#     each, so the requests spread over the mqueues).
#
# usage: bench/paper-gpu.sh [BUILD_DIR]
#   env: GPU (0), DURATION (5 s per run), STREAMS (8), WINDOW (256),
#        CONNS (64), WORKS ("20 100 400 1600" us), MQUEUES ("1 4 16 64 128
#        240"), FLOWS (256), PARTS ("lenet face fig6": a subset to rerun),
#        LYNX_FASHION_MNIST (the test set's directory; default the Debian
#        package's)
# Results: bench/results/paper-gpu-<time>.txt (the paper's figures beside)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN="$BUILD/bin"
GPU=${GPU:-0}
DUR=${DURATION:-5}
STREAMS=${STREAMS:-8}
WINDOW=${WINDOW:-256}
CONNS=${CONNS:-64}
WORKS=${WORKS:-"20 100 400 1600"}
MQUEUES=${MQUEUES:-"1 4 16 64 128 240"}
FLOWS=${FLOWS:-256}
PARTS=${PARTS:-"lenet face fig6"}
PORT=17450
AG_ADDR=127.0.0.1:17751
MODEL=models/lenet-fashion.bin
TMP=$(mktemp -d /tmp/lynx-paper-gpu.XXXXXX)
command -v sockperf >/dev/null || { echo "sockperf is not installed (deploy/install-deps.sh)"; exit 1; }
for b in lynx-agent lynx-frontend lynx-gpu-baseline lynx-lenet-load; do
  [[ -x $BIN/$b ]] || { echo "$BIN/$b is missing: build with make LYNX_CUDA=ON"; exit 1; }
done
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "no GPU here (nvidia-smi -L lists none): bench/paper-gpu.sh runs on a GPU host"
  exit 1
fi

source bench/lib.sh # pids, cleanup, wait_log, sockperf_stat
log() { printf '[%s] paper-gpu: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
OUT_LINES=$TMP/results.txt
out() { echo "$*" | tee -a "$OUT_LINES" >&2; }

# lynx_up APP MQUEUES [AGENT OPTION...]: agent on GPU $GPU (host-mapped
# mqueues over shm) and a frontend serving UDP $PORT
lynx_up() {
  local app=$1 mq=$2
  shift 2
  "$BIN/lynx-agent" --cuda-accels "$GPU" --cpu-accels 0 --transport shm --region-mem host \
    --app "$app" --mqueues "$mq" --listen "$AG_ADDR" --node-id paper "$@" \
    >"$TMP/agent-$app-$mq.log" 2>&1 &
  pids+=($!)
  wait_log "$TMP/agent-$app-$mq.log" "serving descriptors"
  "$BIN/lynx-frontend" --agent "$AG_ADDR" --udp "$PORT" >"$TMP/frontend-$app-$mq.log" 2>&1 &
  pids+=($!)
  wait_log "$TMP/frontend-$app-$mq.log" "serving UDP"
}

# ---- 1. LeNet ---------------------------------------------------------------
# lenet_run LABEL WINDOW FLOWS: lynx-lenet-load against $PORT; fails the
# bench on any wrong answer; prints "req_per_s p50_us p99_us accuracy"
lenet_run() {
  local o
  o=$("$BIN/lynx-lenet-load" --target "127.0.0.1:$PORT" --seconds "$DUR" \
    --window "$2" --flows "$3" ${LYNX_FASHION_MNIST:+--data "$LYNX_FASHION_MNIST"} \
    2>"$TMP/lenet-load.err") || {
    cat "$TMP/lenet-load.err" >&2; echo "$o" >&2
    echo "lynx-lenet-load: wrong answers ($1)" >&2; exit 1; }
  log "$1: $o"
  sed -E 's/.*accuracy=([0-9.]+).*req_per_s=([0-9.]+) p50_us=([0-9.]+) p99_us=([0-9.]+).*/\2 \3 \4 \1/' <<<"$o"
}
part_lenet() {
  local l_sat l1 b_sat b1
  log "== LeNet: Lynx on GPU $GPU"
  lynx_up lenet 64 --lenet-model "$MODEL"
  lenet_run warm-up 16 16 >/dev/null
  l1=$(lenet_run lynx-1 1 1)
  l_sat=$(lenet_run lynx-sat "$WINDOW" "$CONNS")
  cleanup
  log "== LeNet: lynx-gpu-baseline, $STREAMS streams"
  "$BIN/lynx-gpu-baseline" --udp "127.0.0.1:$PORT" --device "$GPU" --app lenet \
    --lenet-model "$MODEL" --streams "$STREAMS" >"$TMP/baseline-lenet.log" 2>&1 &
  pids+=($!)
  wait_log "$TMP/baseline-lenet.log" "serving UDP"
  lenet_run warm-up 16 16 >/dev/null
  b1=$(lenet_run base-1 1 1)
  b_sat=$(lenet_run base-sat "$WINDOW" "$CONNS")
  cleanup
  out "# LeNet-5 on Fashion-MNIST test images, every class checked against the reference"
  out "$(printf '%-12s %12s %10s %10s %9s' system req_per_s p50_us p99_us accuracy)"
  read -r r p50 p99 acc <<<"$l_sat"; out "$(printf '%-12s %12s %10s %10s %9s' lynx-sat "$r" "$p50" "$p99" "$acc")"
  read -r r p50 p99 acc <<<"$b_sat"; out "$(printf '%-12s %12s %10s %10s %9s' base-sat "$r" "$p50" "$p99" "$acc")"
  read -r r p50 p99 acc <<<"$l1"; out "$(printf '%-12s %12s %10s %10s %9s' lynx-1 "$r" "$p50" "$p99" "$acc")"
  read -r r p50 p99 acc <<<"$b1"; out "$(printf '%-12s %12s %10s %10s %9s' base-1 "$r" "$p50" "$p99" "$acc")"
  out "$(awk -v a="${l_sat%% *}" -v b="${b_sat%% *}" 'BEGIN {
    printf "LeNet throughput Lynx / host-centric: %.2fx (target >= 1.25, the paper: 3.5 / 2.8 Kreq/s = 1.25x)", a / b }')"
}

# ---- 2. face verification ----------------------------------------------------
part_face() {
  log "== face verification: bench/face-verify.sh GPU=$GPU"
  GPU_ACCEL=$GPU STREAMS=$STREAMS DURATION=$DUR bash bench/face-verify.sh "$BUILD" >"$TMP/face.txt"
  out "# face verification (bench/face-verify.sh, GPU $GPU; paper: 4.4x on BlueField, 4.6x on a Xeon core)"
  while read -r line; do out "$line"; done <"$TMP/face.txt"
}

# ---- 3. Figure 6 ---------------------------------------------------------------
fig6_load() { # OUT
  sockperf under-load -f "$TMP/feed.txt" -t "$DUR" --mps=max --reply-every 1 -m 64 \
    >"$1" 2>&1 || true
}
# As in the paper: Lynx with one block per mqueue (--gpu-blocks), each
# serving one request at a time for W us; the host-centric server with as
# many CUDA streams as Lynx has mqueues (one request in flight on each).
part_fig6() {
  local w m l b lrow brow rrow
  for _ in $(seq "$FLOWS"); do echo "U:127.0.0.1:$PORT"; done >"$TMP/feed.txt"
  out "# throughput (replies/s) against mqueues per GPU (host-centric: as many CUDA streams), sockperf-echo with W us of emulated work, $FLOWS flows at --mps=max (paper Figure 6: Lynx 2x host-centric with 1 mqueue and short requests, 15.3x with many mqueues)"
  out "$(printf '%-8s %-12s' work_us server; for m in $MQUEUES; do printf ' %10s' "mq=$m"; done)"
  for w in $WORKS; do
    lrow=$(printf '%-8s %-12s' "$w" lynx)
    brow=$(printf '%-8s %-12s' "$w" host-centric)
    rrow=$(printf '%-8s %-12s' "$w" ratio)
    for m in $MQUEUES; do
      lynx_up sockperf-echo "$m" --work-us "$w" --gpu-blocks "$m"
      fig6_load "$TMP/fig6-lynx-$w-$m.out"
      l=$(sockperf_stat "$TMP/fig6-lynx-$w-$m.out" replies_per_s)
      cleanup
      "$BIN/lynx-gpu-baseline" --udp "127.0.0.1:$PORT" --device "$GPU" --app sockperf-echo \
        --streams "$m" --work-us "$w" >"$TMP/fig6-base-$w-$m.log" 2>&1 &
      pids+=($!)
      wait_log "$TMP/fig6-base-$w-$m.log" "serving UDP"
      fig6_load "$TMP/fig6-base-$w-$m.out"
      b=$(sockperf_stat "$TMP/fig6-base-$w-$m.out" replies_per_s)
      cleanup
      lrow+=$(printf ' %10s' "$l")
      brow+=$(printf ' %10s' "$b")
      rrow+=$(printf ' %10s' "$(awk -v a="$l" -v b="$b" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "n/a" }')")
    done
    out "$lrow"
    out "$brow"
    out "$rrow"
  done
  out "# ideal: mqueues x 1e6 / work_us, while the GPU has SMs for the blocks"
}

: >"$OUT_LINES"
for p in $PARTS; do "part_$p"; done
mkdir -p bench/results
res="bench/results/paper-gpu-$(date -u +%Y%m%dT%H%M%SZ).txt"
{
  echo "# bench/paper-gpu.sh $(date -u +%FT%TZ) $(uname -m) $(nproc) cores $(nvidia-smi -L 2>/dev/null | sed -n "$((GPU + 1))p")"
  echo "# git $(git rev-parse --short HEAD 2>/dev/null || echo '?'); ${DUR}s per run"
  cat "$OUT_LINES"
} >"$res"
cat "$res"
