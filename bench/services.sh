#!/usr/bin/env bash
# bench/services.sh - what many services cost one frontend and one agent
# (issue 38: threads by core, not by service).
#
# A coordinator, one agent (--cpu-accels 2 over shm) and one frontend;
# sockperf-echo services created through the API (placement all: an
# instance on each accelerator), COUNTS of them in turn (the same daemons,
# services added up to each count), all idle but the ones measured. At
# each count, once every service is ready and the daemons settled:
#   - the frontend's and the agent's resident memory (VmRSS; the agent's
#     with its plug-in processes, none here), threads and open files;
#   - their idle CPU over IDLE_S seconds (utime + stime, % of one core);
#   - a sockperf ping-pong of 64-byte messages on service 0 for DURATION
#     seconds (p50, p99): alone, and (from 11 services) while sockperf
#     under-load offers BG_MPS messages/s to each of 10 other services.
# Then every service is deleted and the memory and threads measured again.
# Results: bench/results/services-STAMP.txt (also printed).
#
# usage: bench/services.sh [BUILD_DIR]
#   env: COUNTS ("1 10 100 250"), IDLE_S (5), DURATION (3), BG_MPS (1000),
#        SERVICES_MAX (the coordinator's --services-max; default its own,
#        256, which refuses a 257th), PORT_BASE (21000)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN=$BUILD/bin
COUNTS=${COUNTS:-1 10 100 250}
IDLE_S=${IDLE_S:-5}
DUR=${DURATION:-3}
BG_MPS=${BG_MPS:-1000}
PORT_BASE=${PORT_BASE:-21000}
CTL=127.0.0.1:${CTL_PORT:-17740}
API=127.0.0.1:${API_PORT:-17780}
TMP=$(mktemp -d /tmp/lynx-services-bench.XXXXXX)
for t in sockperf curl jq; do
  command -v $t >/dev/null || { echo "$t is not installed (deploy/install-deps.sh test)"; exit 1; }
done
for b in lynx-coordinator lynx-agent lynx-frontend; do
  [[ -x $BIN/$b ]] || { echo "$BIN/$b is missing: build first (make)"; exit 1; }
done
source bench/lib.sh # pids, cleanup, cpu_ticks, wait_log, sockperf_pct
TCK=$(getconf CLK_TCK)
mkdir -p bench/results
OUT=bench/results/services-$(date -u +%Y%m%dT%H%M%SZ).txt
say() { echo "$*" | tee -a "$OUT"; }

say "# bench/services.sh $(date -u +%FT%TZ) on $(uname -n), $(nproc) cores; git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
say "# COUNTS='$COUNTS' IDLE_S=$IDLE_S DURATION=$DUR BG_MPS=$BG_MPS SERVICES_MAX=${SERVICES_MAX:-default}"

"$BIN/lynx-coordinator" --listen "$CTL" --http "$API" --state-dir "$TMP/state" \
  ${SERVICES_MAX:+--services-max "$SERVICES_MAX"} >"$TMP/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -sf --max-time 1 "http://$API/readyz" >/dev/null && break; sleep 0.1; done
"$BIN/lynx-agent" --coordinator "$CTL" --node-id benchn1 --cpu-accels 2 \
  --transport shm >"$TMP/agent.log" 2>&1 &
AGENT=$!
pids+=("$AGENT")
wait_log "$TMP/agent.log" "registered with coordinator"
"$BIN/lynx-frontend" --coordinator "$CTL" --bind 127.0.0.1 >"$TMP/frontend.log" 2>&1 &
FE=$!
pids+=("$FE")
wait_log "$TMP/frontend.log" " applied"

api() { curl -sf --max-time 10 "$@"; }

# the agent and its children (plug-in processes)
agent_pids() { echo "$AGENT" "$(pgrep -P "$AGENT" | tr '\n' ' ')"; }
status_of() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }
sum_status() { # FIELD PID...
  local f=$1 s=0 p
  shift
  for p in "$@"; do s=$((s + $(status_of "$p" "$f"))); done
  echo "$s"
}
fds_of() { local s=0 p; for p in "$@"; do s=$((s + $(find "/proc/$p/fd" -mindepth 1 -maxdepth 1 | wc -l))); done; echo "$s"; }
ticks_of() { local s=0 p; for p in "$@"; do s=$((s + $(cpu_ticks "$p"))); done; echo "$s"; }

# ready_count: services whose state is ready
ready_count() { api "http://$API/v1/services" | jq '[.items[] | select(.state == "ready")] | length'; }

created=0
create_up_to() {
  local n=$1 end code
  while ((created < n)); do
    code=$(curl -s -o "$TMP/create.out" -w '%{http_code}' --max-time 10 -X POST "http://$API/v1/services" \
      -d "{\"name\":\"s$created\",\"port\":$((PORT_BASE + created)),\"app\":\"sockperf-echo\"}")
    if [[ $code != 201 ]]; then
      say "service s$created refused (HTTP $code): $(head -c 300 "$TMP/create.out")"
      return 1
    fi
    created=$((created + 1))
  done
  end=$(($(date +%s) + 300))
  until [[ $(ready_count) == "$n" ]]; do
    (($(date +%s) < end)) || { say "only $(ready_count) of $n services ready after 300 s"; return 1; }
    sleep 0.5
  done
}

# measure LABEL: one line of figures
measure() {
  local label=$1 fe_t0 ag_t0 fe_t1 ag_t1 fe_cpu ag_cpu p
  local -a ag bgp=()
  sleep 2
  read -r -a ag <<<"$(agent_pids)"
  fe_t0=$(ticks_of "$FE")
  ag_t0=$(ticks_of "${ag[@]}")
  sleep "$IDLE_S"
  fe_t1=$(ticks_of "$FE")
  ag_t1=$(ticks_of "${ag[@]}")
  fe_cpu=$(awk -v d=$((fe_t1 - fe_t0)) -v t="$TCK" -v s="$IDLE_S" 'BEGIN { printf "%.1f", 100 * d / t / s }')
  ag_cpu=$(awk -v d=$((ag_t1 - ag_t0)) -v t="$TCK" -v s="$IDLE_S" 'BEGIN { printf "%.1f", 100 * d / t / s }')
  local -a ppv=(- -) bgv=(- -)
  if ((created > 0)); then
    sockperf pp -i 127.0.0.1 -p "$PORT_BASE" -m 64 -t "$DUR" >"$TMP/pp.out" 2>&1 || true
    read -r -a ppv <<<"$(sockperf_pct "$TMP/pp.out")"
  fi
  if ((created > 10)); then
    for p in $(seq 1 10); do
      sockperf ul -i 127.0.0.1 -p $((PORT_BASE + p)) -m 64 --mps "$BG_MPS" -t $((DUR + 2)) \
        >"$TMP/bg$p.out" 2>&1 &
      bgp+=($!)
    done
    sleep 1
    sockperf pp -i 127.0.0.1 -p "$PORT_BASE" -m 64 -t "$DUR" >"$TMP/ppbg.out" 2>&1 || true
    read -r -a bgv <<<"$(sockperf_pct "$TMP/ppbg.out")"
    wait "${bgp[@]}" 2>/dev/null || true
  fi
  say "$(printf '%-10s %9s %8s %5s %6s %9s %8s %6s %7s %6s %6s %6s %6s' "$label" \
    "$(($(sum_status VmRSS "$FE") / 1024))" "$(status_of "$FE" Threads)" "$(fds_of "$FE")" "$fe_cpu" \
    "$(($(sum_status VmRSS "${ag[@]}") / 1024))" "$(sum_status Threads "${ag[@]}")" "$(fds_of "${ag[@]}")" "$ag_cpu" \
    "${ppv[@]}" "${bgv[@]}")"
}

say "$(printf '%-10s %9s %8s %5s %6s %9s %8s %6s %7s %6s %6s %6s %6s' services \
  fe_rss_MB fe_thr fe_fd fe_cpu% ag_rss_MB ag_thr ag_fd ag_cpu% p50_us p99_us p50_10bg p99_10bg)"
measure 0
for n in $COUNTS; do
  create_up_to "$n" || break
  measure "$n"
done
for i in $(seq 0 $((created - 1))); do
  api -X DELETE "http://$API/v1/services/s$i" >/dev/null || say "DELETE s$i failed"
done
created=0
measure deleted
say "# p50/p99: one service's sockperf ping-pong (64 B, us, one-way as sockperf reports it), alone and beside 10 services offered $BG_MPS msg/s each"
echo "results: $OUT"
