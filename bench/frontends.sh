#!/usr/bin/env bash
# bench/frontends.sh - several active frontends (docs/frontends.md): how
# long a joining frontend takes to serve its share, how long the survivor
# takes to produce into a failed frontend's instances, and what either
# costs the traffic of the frontend that stays.
#
# A coordinator (--active-frontends 0, --lease-ms 1000), an agent of 4 CPU
# accelerators (tcp), service echo on all four, frontend fe1 on 127.0.0.1.
# Each run, under sockperf under-load through fe1 (MPS msg/s):
#   join:     fe2 starts on 127.0.0.2; lynx-udp-probe sends to it every
#             5 ms; time from fe2's process start to its first answer
#             (fe1 releases two instances, answers what it holds on them,
#             then they are given to fe2 with a new epoch);
#   takeover: fe2 is killed -9; time until fe1 reports running a table
#             with all four instances (the coordinator's
#             --frontend-timeout-ms does not apply: the connection closes).
# fe1's drops (lost, expired, in doubt, fenced) over both must be 0.
#
# usage: bench/frontends.sh [BUILD_DIR]   env: RUNS (5), MPS (2000)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN=$BUILD/bin
RUNS=${RUNS:-5}
MPS=${MPS:-2000}
for b in lynx-coordinator lynx-agent lynx-frontend lynx-udp-probe; do
  [[ -x $BIN/$b ]] || { echo "$BIN/$b is missing: build first (make)"; exit 1; }
done
for t in sockperf curl jq; do
  command -v "$t" >/dev/null || { echo "$t is not installed (deploy/install-deps.sh)"; exit 1; }
done
TMP=$(mktemp -d /tmp/lynx-febench.XXXXXX)
source bench/lib.sh # pids, cleanup, wait_log

say() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
now_us() { echo "${EPOCHREALTIME/./}"; }
port=$((21000 + RANDOM % 4000))
CTL=127.0.0.1:$port API=127.0.0.1:$((port + 1)) UDP=$((port + 2))
M1=$((port + 3)) M2=$((port + 4))
api() { curl -sf --max-time 5 "http://$API$1"; }
# fe_has ID N: frontend ID produces into N instances and runs that table
fe_has() {
  local want
  want=$(api /metrics | awk '$1 == "lynx_coordinator_table_version" {print $2}')
  api /v1/frontends | jq -e --arg id "$1" --argjson n "$2" --arg v "$want" \
    '.items[] | select(.id == $id and .instances == $n and (.table_version | tostring) == $v)' >/dev/null
}
wait_for() { # TIMEOUT_S WHAT CMD...
  local end=$(($(now_us) + $1 * 1000000)) what=$2
  shift 2
  until "$@"; do
    (($(now_us) < end)) || { echo "timed out waiting for $what" >&2; exit 1; }
    sleep 0.01
  done
}
fe1_drops() {
  curl -sf "http://127.0.0.1:$M1/metrics" | awk '
    $1 ~ /^lynx_frontend_dropped_total\{/ && $1 ~ /reason="(lost|expired|in_doubt|fenced)"/ { s += $2 }
    END { printf "%.0f\n", s }'
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
maxof() { sort -n | tail -n 1; }

"$BIN/lynx-coordinator" --listen "$CTL" --http "$API" --state-dir "$TMP/state" \
  --lease-ms 1000 --active-frontends 0 >"$TMP/coordinator.log" 2>&1 &
pids+=($!)
wait_log "$TMP/coordinator.log" "serving control on" >/dev/null
"$BIN/lynx-agent" --coordinator "$CTL" --node-id febench --cpu-accels 4 \
  --transport tcp >"$TMP/agent.log" 2>&1 &
pids+=($!)
"$BIN/lynx-frontend" --coordinator "$CTL" --frontend-id fe1 --bind 127.0.0.1 \
  --metrics "127.0.0.1:$M1" >"$TMP/fe1.log" 2>&1 &
pids+=($!)
wait_log "$TMP/agent.log" "registered with coordinator" >/dev/null
wait_log "$TMP/fe1.log" " applied" >/dev/null
curl -sf -o /dev/null -d "{\"name\":\"echo\",\"port\":$UDP,\"app\":\"sockperf-echo\"}" "http://$API/v1/services"
wait_for 15 "fe1 to run all four instances" fe_has fe1 4
drops0=$(fe1_drops)

for ((i = 1; i <= RUNS; i++)); do
  sockperf under-load -i 127.0.0.1 -p "$UDP" -m 64 -t 30 --mps "$MPS" \
    --reply-every 1 >"$TMP/sp-$i.out" 2>&1 </dev/null &
  sp=$!
  pids+=("$sp")
  sleep 2.5 # sockperf's first datagrams take a moment
  "$BIN/lynx-udp-probe" --host 127.0.0.2 --port "$UDP" --interval-ms 5 \
    --timeout-ms 15000 >"$TMP/probe.out" 2>&1 &
  probe=$!
  sleep 0.1
  t0=$(now_us)
  "$BIN/lynx-frontend" --coordinator "$CTL" --frontend-id fe2 --bind 127.0.0.2 \
    --metrics "127.0.0.1:$M2" >"$TMP/fe2-$i.log" 2>&1 &
  fe2=$!
  pids+=("$fe2")
  wait "$probe" || { echo "run $i: no answer through fe2 within 15 s"; cat "$TMP/probe.out"; exit 1; }
  [[ $(cat "$TMP/probe.out") =~ realtime_ns=([0-9]+) ]] || { cat "$TMP/probe.out"; exit 1; }
  join_ms=$(awk -v a="${BASH_REMATCH[1]}" -v b="$t0" 'BEGIN { printf "%.0f\n", (a / 1000 - b) / 1000 }')
  wait_for 10 "fe1 down to two instances" fe_has fe1 2
  sleep 1
  t0=$(now_us)
  exec 3>&2 2>/dev/null # not bash's "Killed" notice
  kill -KILL "$fe2"
  wait_for 10 "fe1 to run all four again" fe_has fe1 4
  take_ms=$(awk -v a="$(now_us)" -v b="$t0" 'BEGIN { printf "%.0f\n", (a - b) / 1000 }')
  wait "$fe2" || true
  exec 2>&3 3>&-
  kill -TERM "$sp" 2>/dev/null || true
  wait "$sp" 2>/dev/null || true
  echo "$join_ms" >>"$TMP/join.txt"
  echo "$take_ms" >>"$TMP/take.txt"
  say "run $i: fe2 served ${join_ms} ms after its start; fe1 ran fe2's instances ${take_ms} ms after fe2's kill; fe1's drops so far $(($(fe1_drops) - drops0))"
done
drops=$(($(fe1_drops) - drops0))
moves=$(api /metrics | awk '$1 == "lynx_coordinator_frontend_moves_total" {print $2}')
OUT="bench/results/frontends-$(date -u +%Y%m%dT%H%M%SZ).txt"
mkdir -p bench/results
{
  echo "# bench/frontends.sh  $(date -u +%FT%TZ)  $(uname -m) $(nproc) cores  git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "# $RUNS runs; sockperf under-load through fe1 at $MPS msg/s throughout; 4 CPU accelerators over tcp"
  printf '%-56s %8s %8s\n' "figure" "median" "max"
  printf '%-56s %8s %8s\n' "frontend join: start -> first answer through it (ms)" "$(median <"$TMP/join.txt")" "$(maxof <"$TMP/join.txt")"
  printf '%-56s %8s %8s\n' "frontend kill -9 -> survivor runs its instances (ms)" "$(median <"$TMP/take.txt")" "$(maxof <"$TMP/take.txt")"
  echo "fe1 drops (lost, expired, in doubt, fenced) over all runs: $drops"
  echo "instances moved between live frontends (released, then given): ${moves:-?}"
} | tee "$OUT"
echo "written to $OUT" >&2
((drops == 0)) || { echo "fe1 dropped $drops requests" >&2; exit 1; }
