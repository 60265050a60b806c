#!/usr/bin/env bash
# bench/face-verify.sh - face verification (paper §6.4): the Lynx deployment
# against the host-centric baseline, one run, the same memcached.
#
# memcached holds IDENTITIES synthetic faces (lynx-face-load --fill). Then:
#  (1) Lynx: coordinator, one agent with ACCELS CPU accelerators (shm), the
#      frontend, service `face` (app face-verify, back end db = memcached,
#      reached through each instance's client mqueue);
#  (2) baseline: lynx-face-baseline --threads THREADS (receives, fetches
#      from memcached, computes with the same face.c, answers; no mqueues).
# Each is driven by lynx-face-load, which checks every answer, closed loop
# with 1 (latency) and CLIENTS (throughput) requests outstanding, DURATION s,
# median of RUNS. Reports req/s, p50, p99 and the Lynx/baseline ratios.
# Client, frontend, accelerators, memcached and baseline share 2 cores: the
# ratio is the result, not the absolute numbers.
#
# With GPU_ACCEL=N (a GPU host; bench/paper-gpu.sh sets it), the paper's GPU
# comparison instead: (1) runs face-verify as a kernel on GPU N (its blocks
# call memcached through their own client mqueues), (2) is
# lynx-gpu-baseline --app face-verify --streams STREAMS on the same GPU (the
# host fetches from memcached, the GPU compares with the same device code).
#
# usage: bench/face-verify.sh [BUILD_DIR]
#   env: ACCELS (2) THREADS (2) CLIENTS (8) DURATION (5) RUNS (3)
#        IDENTITIES (1000) GPU_ACCEL (unset: CPU) STREAMS (8)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN="$BUILD/bin"
ACCELS=${ACCELS:-2}
THREADS=${THREADS:-2}
CLIENTS=${CLIENTS:-8}
DUR=${DURATION:-5}
RUNS=${RUNS:-3}
IDS=${IDENTITIES:-1000}
GPU_ACCEL=${GPU_ACCEL:-}
STREAMS=${STREAMS:-8}
if [[ -n $GPU_ACCEL ]]; then
  LYNX_ACCELS=(--cuda-accels "$GPU_ACCEL" --cpu-accels 0)
  BASE_CMD=(lynx-gpu-baseline --app face-verify --device "$GPU_ACCEL" --streams "$STREAMS")
  ACCELS=1
  WHAT="GPU $GPU_ACCEL"
  BASE_WHAT="lynx-gpu-baseline, $STREAMS CUDA streams on GPU $GPU_ACCEL"
else
  LYNX_ACCELS=(--cpu-accels "$ACCELS")
  BASE_CMD=(lynx-face-baseline --threads "$THREADS")
  WHAT="$ACCELS CPU accelerators"
  BASE_WHAT="lynx-face-baseline, $THREADS threads"
fi
SEED=7
MC=17211 COORD=17700 API=17780 FACE=17900 BASE=17901
TMP=$(mktemp -d /tmp/lynx-face.XXXXXX)
command -v memcached >/dev/null || { echo "memcached is not installed (deploy/install-deps.sh)"; exit 1; }
for b in lynx-coordinator lynx-agent lynx-frontend lynx-face-load "${BASE_CMD[0]}"; do
  [[ -x $BIN/$b ]] || { echo "$BIN/$b missing: build first (make)"; exit 1; }
done

pids=()
stop_all() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap 'stop_all; [[ -n ${MCPID:-} ]] && kill "$MCPID" 2>/dev/null; rm -rf "$TMP"' EXIT
log() { printf '[%s] face-verify: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
wait_log() { # FILE PATTERN
  for _ in $(seq 200); do grep -qF -- "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  echo "timed out waiting for '$2' in $1" >&2; cat "$1" >&2; exit 1
}

# run PORT CLIENTS: one load run; prints "req_per_s p50 p99 wrong"
run() {
  local out
  out=$("$BIN/lynx-face-load" --target "127.0.0.1:$1" --udp --closed-loop "$2" \
    --seconds "$DUR" --identities "$IDS" --seed "$SEED" --impostor-percent 50) || {
    echo "$out" >&2; echo "lynx-face-load reported wrong answers or errors" >&2
    for f in "$TMP"/*.log; do echo "== $f" >&2; tail -n 5 "$f" >&2; done; exit 1; }
  log "$out"
  sed -E 's/.*wrong=([0-9]+).*req_per_s=([0-9]+) p50_us=([0-9]+) p99_us=([0-9]+).*/\2 \3 \4 \1/' <<<"$out"
}
# median PORT CLIENTS: the run with the median req/s of RUNS
median() {
  local i
  for ((i = 0; i < RUNS; i++)); do run "$1" "$2"; done | sort -n | sed -n "$(((RUNS + 1) / 2))p"
}

memcached -p "$MC" -U 0 -l 127.0.0.1 -u root -m 256 -t 1 >"$TMP/mc.log" 2>&1 &
MCPID=$!
sleep 0.3
"$BIN/lynx-face-load" --fill "127.0.0.1:$MC" --identities "$IDS" --seed "$SEED" >&2

# ---- (1) Lynx ----------------------------------------------------------------------
log "Lynx: $WHAT, face-verify with memcached through client mqueues"
"$BIN/lynx-coordinator" --listen "127.0.0.1:$COORD" --http "127.0.0.1:$API" \
  --state-dir "$TMP/state" >"$TMP/coord.log" 2>&1 &
pids+=($!)
wait_log "$TMP/coord.log" "serving control"
"$BIN/lynx-agent" --coordinator "127.0.0.1:$COORD" --node-id bench \
  "${LYNX_ACCELS[@]}" --transport shm >"$TMP/agent.log" 2>&1 &
pids+=($!)
"$BIN/lynx-frontend" --coordinator "127.0.0.1:$COORD" --bind 127.0.0.1 \
  >"$TMP/fe.log" 2>&1 &
pids+=($!)
wait_log "$TMP/agent.log" "registered with coordinator"
curl -sf -X POST "http://127.0.0.1:$API/v1/services" -d "{\"name\":\"face\",
  \"port\":$FACE,\"app\":\"face-verify\",\"mqueues_per_accel\":4,
  \"backends\":[{\"name\":\"db\",\"address\":\"127.0.0.1:$MC\",\"proto\":\"memcached\"}]}" >/dev/null
for _ in $(seq 200); do
  (($(grep -c 'in dispatch over' "$TMP/fe.log") >= ACCELS)) && break
  sleep 0.05
done
run "$FACE" 4 >/dev/null # warm-up
read -r l1_rps l1_p50 l1_p99 _ < <(median "$FACE" 1)
read -r lt_rps lt_p50 lt_p99 _ < <(median "$FACE" "$CLIENTS")
stop_all

# ---- (2) baseline ---------------------------------------------------------------------
log "baseline: $BASE_WHAT, the same memcached"
"$BIN/${BASE_CMD[0]}" "${BASE_CMD[@]:1}" --udp "127.0.0.1:$BASE" --memcached "127.0.0.1:$MC" \
  >"$TMP/base.log" 2>&1 &
pids+=($!)
sleep 0.5
run "$BASE" 4 >/dev/null
read -r b1_rps b1_p50 b1_p99 _ < <(median "$BASE" 1)
read -r bt_rps bt_p50 bt_p99 _ < <(median "$BASE" "$CLIENTS")
stop_all

mkdir -p bench/results
res="bench/results/face-verify-$(date -u +%Y%m%dT%H%M%SZ).txt"
{
  echo "# bench/face-verify.sh $(date -u +%FT%TZ) $(uname -m) $(nproc) cores; git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "# $IDS identities, 50% impostors, UDP, closed loop, ${DUR}s, median of $RUNS; every answer checked (0 wrong)"
  echo "# Lynx: $WHAT (shm) + frontend + memcached via client mqueues; baseline: $BASE_WHAT"
  echo "# $(nproc) cores: client, frontend, accelerators, memcached and baseline share them"
  printf '%-10s %8s %10s %10s %10s\n' system clients req_per_s p50_us p99_us
  printf '%-10s %8s %10s %10s %10s\n' lynx 1 "$l1_rps" "$l1_p50" "$l1_p99"
  printf '%-10s %8s %10s %10s %10s\n' baseline 1 "$b1_rps" "$b1_p50" "$b1_p99"
  printf '%-10s %8s %10s %10s %10s\n' lynx "$CLIENTS" "$lt_rps" "$lt_p50" "$lt_p99"
  printf '%-10s %8s %10s %10s %10s\n' baseline "$CLIENTS" "$bt_rps" "$bt_p50" "$bt_p99"
  awk -v a="$lt_rps" -v b="$bt_rps" -v c="$l1_p50" -v d="$b1_p50" 'BEGIN {
    printf "ratio lynx/baseline: throughput %.2fx, p50 (1 client) %.2fx (paper: 4.4x throughput on BlueField with a GPU)\n", a / b, c / d }'
} | tee "$res"
