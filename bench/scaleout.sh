#!/usr/bin/env bash
# bench/scaleout.sh - served rate as accelerator hosts are added (paper §6.3).
#
# Hosts are network namespaces on one bridge (tests/multihost/netns.sh):
# coord (lynx-coordinator), fe (lynx-frontend), client (sockperf) and
# h1..h8 (one lynx-agent each). One sockperf-echo service, placement all,
# work_us 300 (about one LeNet request) emulated with --work-mode sleep, so
# 16 emulated accelerators fit on the 2 cores.
#
#   reference  one shm agent with ONE accelerator in fe: the measured
#              single-accelerator rate R1; ideal(hosts) = hosts x 2 x R1
#   tcp        1, 2, 4, 8 hosts, one agent each, 2 CPU accelerators,
#              --transport tcp (the frontend reaches them over the bridge)
#   shm        the same numbers of agents, but in fe with --transport shm
#   latency    p50 of a single sockperf ping-pong client against a work_us 0
#              service on 1 host over shm and over tcp: what tcp adds
#   saturated  the same work_us 0 service driven by SAT_CLIENTS (8) clients:
#              the frontend, not the accelerators, is the bottleneck, so its
#              CPU per request is the cost of a request rather than of
#              polling while it waits for slow accelerators
#
# Each point: CLIENTS_PER_ACCEL (3) sockperf ping-pong clients per
# accelerator from `client` (a closed loop: every client has one request
# in flight, and the accelerators always have work queued), the frontend
# with --dispatch lo (least outstanding: round robin lets closed-loop
# clients queue behind a busy accelerator while another idles); after
# WARMUP s, a DURATION s window: served = the frontend's responses/s
# (lynx_frontend_responded_total), and the frontend process's CPU time
# (utime+stime of /proc/PID/stat over the window) per response.
#
# Every point starts with an unrecorded WARMUP_RUN (3 s) of the same load,
# then runs RUNS (3) times; the table shows the run with the median served
# rate.
#
# Derived: scaling efficiency = served / ideal; "accelerators one frontend
# core can drive at 3,500 req/s each" = 1e6 / (cpu_us_per_req x 3500), from
# the work_us 300 point with the lowest CPU per request (the most loaded
# frontend: below saturation the adaptive poller's spinning is charged to
# fewer requests) and from the saturated point. The paper reports 74 for a
# Xeon core and 102 for BlueField.
#
# Everything (clients, frontend, coordinator, every agent) shares the
# machine's cores: absolute rates are those of a crowded 2-core VM, and the
# ratios (efficiency, tcp vs shm) are the result.
#
# usage: bench/scaleout.sh [BUILD_DIR]   (root: it creates namespaces)
#   env: HOSTS ("1 2 4 8"), DURATION (5), WARMUP (2), WORK_US (300),
#        CLIENTS_PER_ACCEL (3), RUNS (3), WARMUP_RUN (3), LAT_DURATION (5),
#        SAT_CLIENTS (8), MH_KEEP=1 keeps the logs
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN=$BUILD/bin
HOSTS_LIST=${HOSTS:-1 2 4 8}
DUR=${DURATION:-5}
WARMUP=${WARMUP:-2}
WORK_US=${WORK_US:-300}
CPA=${CLIENTS_PER_ACCEL:-3}
LAT_DUR=${LAT_DURATION:-5}
RUNS=${RUNS:-3}
SAT_CLIENTS=${SAT_CLIENTS:-8}
WARMUP_RUN=${WARMUP_RUN:-3}
SAT_HOSTS=''
ACCELS_PER_HOST=2
SIZE=64
PORT=9000
LAT_PORT=9001
COORD_PORT=7700
API_PORT=7780
METRICS_PORT=7790
HZ=$(getconf CLK_TCK)

for b in lynx-coordinator lynx-agent lynx-frontend lynxctl; do
  [[ -x $BIN/$b ]] || { echo "$BIN/$b is missing: build first (make)"; exit 1; }
done
for t in sockperf curl jq timeout; do
  command -v "$t" >/dev/null || { echo "$t is not installed (deploy/install-deps.sh)"; exit 1; }
done
max_hosts=0
for n in $HOSTS_LIST; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "HOSTS: '$n' is not a number of hosts"; exit 2; }
  ((n > max_hosts)) && max_hosts=$n
done

source bench/lib.sh # cpu_ticks (its EXIT trap is replaced by mh_init's)
# shellcheck source=SCRIPTDIR/../tests/multihost/netns.sh
source tests/multihost/netns.sh
mh_init scaleout 1500
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)

RAW=$MH_DIR/raw.txt
: >"$RAW"
TOKEN=$MH_DIR/token
head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TOKEN"
echo >>"$TOKEN"

# ---- helpers ------------------------------------------------------------------

ctl() {
  mh_exec coord "$BIN/lynxctl" --api "http://127.0.0.1:$API_PORT" --token-file "$TOKEN" "$@"
}
fe_scrape() {
  mh_exec fe curl -sf --max-time 5 "http://127.0.0.1:$METRICS_PORT/metrics"
}
# fe_sum NAME [LABEL_PART]: sum of the frontend's samples of NAME (0 if none).
fe_sum() {
  fe_scrape | awk -v n="$1" -v l="${2:-}" '
    $1 ~ /^#/ { next }
    { name = $1; sub(/\{.*/, "", name) }
    name == n && index($1, l) { s += $2 }
    END { printf "%.0f\n", s }'
}
# fe_accels SERVICE: accelerators the frontend has in dispatch for SERVICE.
fe_accels() {
  fe_scrape | sed -n "s/^lynx_mqueue_dispatched_total{service=\"$1\",.*node=\"\\([^\"]*\\)\",.*accel=\"\\([0-9]*\\)\".*/\\1\\/\\2/p" |
    sort -u | grep -c . || true
}
wait_fe_accels() { # SERVICE N TIMEOUT_S
  local end=$(($(date +%s) + $3)) n
  for (( ; ; )); do
    n=$(fe_accels "$1")
    ((n == $2)) && return 0
    (($(date +%s) < end)) || mh_fail "frontend has $n accelerators of $1 in dispatch after $3 s, want $2"
    sleep 0.1
  done
}

# idle_ticks: idle + iowait time of the whole machine (clock ticks).
idle_ticks() { awk '$1 == "cpu" { print $5 + $6 }' /proc/stat; }

declare -a AGENTS=()
# start_agents TRANSPORT N ACCELS: N agents (tcp: one in each of h1..hN;
# shm: all in fe), ACCELS CPU accelerators each.
start_agents() {
  local tr=$1 n=$2 acc=$3 i host node
  AGENTS=()
  for ((i = 1; i <= n; i++)); do
    if [[ $tr == tcp ]]; then host=h$i node=$(mh_node_id "h$i"); else host=fe node=$(mh_node_id "s$i"); fi
    mh_spawn "$host" "agent-$tr-$node" "$BIN/lynx-agent" --coordinator "$COORD_IP:$COORD_PORT" \
      --node-id "$node" --cpu-accels "$acc" --transport "$tr" --work-mode sleep \
      --token-file "$TOKEN"
    AGENTS+=("$MH_PID")
    mh_wait_log "$MH_LOG" "registered with coordinator" 10 1 "$MH_PID"
  done
}
stop_agents() {
  local p
  for p in "${AGENTS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${AGENTS[@]}"; do mh_stop "$p" 10; done
  AGENTS=()
  wait_fe_accels echo 0 10
}

# measure LABEL PORT ACCELS CLIENTS: CLIENTS closed-loop sockperf clients
# against PORT for WARMUP + DURATION s; appends "LABEL accels clients
# served_per_s cpu_us_per_req fe_cores drops machine_idle_%" to RAW.
measure() {
  local label=$1 port=$2 acc=$3 k=$4 i r0 r1 c0 c1 t0 t1 d0 d1 i0 i1 rc
  local -a pids=()
  d0=$(fe_sum lynx_frontend_dropped_total)
  for ((i = 1; i <= k; i++)); do
    mh_exec client timeout -k 2 $((WARMUP + DUR + 15)) sockperf ping-pong -i "$FE_IP" \
      -p "$port" -m "$SIZE" -t $((WARMUP + DUR + 2)) \
      >"$MH_DIR/sockperf-$label-$i.out" 2>&1 </dev/null &
    pids+=("$!")
  done
  sleep "$WARMUP"
  r0=$(fe_sum lynx_frontend_responded_total) c0=$(cpu_ticks "$FE_PID") t0=$(date +%s%N) i0=$(idle_ticks)
  sleep "$DUR"
  r1=$(fe_sum lynx_frontend_responded_total) c1=$(cpu_ticks "$FE_PID") t1=$(date +%s%N) i1=$(idle_ticks)
  for i in "${!pids[@]}"; do
    rc=0
    wait "${pids[i]}" || rc=$?
    ((rc == 0)) || mh_log "warning: sockperf client $((i + 1)) of $label exited $rc"
  done
  d1=$(fe_sum lynx_frontend_dropped_total)
  awk -v l="$label" -v a="$acc" -v k="$k" -v r=$((r1 - r0)) -v c=$((c1 - c0)) \
    -v dt=$((t1 - t0)) -v hz="$HZ" -v d=$((d1 - d0)) -v idle=$((i1 - i0)) -v ncpu="$(nproc)" 'BEGIN {
      s = dt / 1e9; cpu = c / hz
      printf "%s %d %d %.0f %.1f %.2f %d %.0f\n", l, a, k, r / s, (r > 0 ? cpu * 1e6 / r : 0), cpu / s, d,
             100 * idle / hz / s / ncpu
    }' | tee -a "$RAW"
}
# measure_runs LABEL PORT ACCELS CLIENTS: one unrecorded warm-up run of
# WARMUP_RUN s (new agents' first seconds are slower: their regions and
# connections are cold), then RUNS times measure.
measure_runs() {
  local run
  if ((WARMUP_RUN > 0)); then
    DUR=$WARMUP_RUN RAW=/dev/null measure "$1-warmup" "${@:2}" >/dev/null
  fi
  for ((run = 1; run <= RUNS; run++)); do measure "$@"; done
}

# lat_service ACCELS: creates the work_us 0 service "lat"; lat_delete.
lat_service() {
  ctl service create --name lat --port "$LAT_PORT" --app sockperf-echo --work-us 0 \
    --placement all >/dev/null
  wait_fe_accels lat "$1" 10
}
lat_delete() {
  ctl service delete lat >/dev/null
  wait_fe_accels lat 0 10
}

# latency LABEL: p50 and p99 (us) of one ping-pong client against "lat".
latency() {
  local label=$1 out=$MH_DIR/latency-$1.out p50 p99
  mh_exec client timeout -k 2 $((LAT_DUR + 15)) sockperf ping-pong -i "$FE_IP" -p "$LAT_PORT" \
    -m "$SIZE" -t "$LAT_DUR" >"$out" 2>&1 </dev/null || mh_log "warning: latency sockperf exited $?"
  p50=$(awk '/percentile 50.000/ { print $NF }' "$out")
  p99=$(awk '/percentile 99.000/ { print $NF }' "$out")
  echo "latency-$label ${p50:-0} ${p99:-0}" | tee -a "$RAW"
}

# median_run LABEL: RAW's line of LABEL with the median served rate.
median_run() {
  awk -v l="$1" '$1 == l' "$RAW" | sort -k4,4g | awk '{ a[NR] = $0 } END { if (NR) print a[int((NR + 1) / 2)] }'
}

# ---- set-up -------------------------------------------------------------------
mh_log "load: $CPA sockperf ping-pong clients per accelerator, ${WARMUP}s warm-up + ${DUR}s window; service work_us $WORK_US (sleep)"
mh_host coord 10.77.0.1
mh_host fe 10.77.0.2
mh_host client 10.77.0.3
for ((i = 1; i <= max_hosts; i++)); do mh_host "h$i" "10.77.0.$((10 + i))"; done
COORD_IP=$(mh_ip coord)
FE_IP=$(mh_ip fe)
mh_spawn coord coordinator "$BIN/lynx-coordinator" --listen "$COORD_IP:$COORD_PORT" \
  --http "127.0.0.1:$API_PORT" --state-dir "$MH_DIR/state" --token-file "$TOKEN"
mh_wait_log "$MH_LOG" "serving control on" 10 1 "$MH_PID"
mh_spawn fe frontend "$BIN/lynx-frontend" --coordinator "$COORD_IP:$COORD_PORT" \
  --bind "$FE_IP" --metrics "127.0.0.1:$METRICS_PORT" --dispatch lo --token-file "$TOKEN"
FE_PID=$MH_PID
mh_wait_log "$MH_LOG" " applied" 10 1 "$FE_PID"
ctl service create --name echo --port "$PORT" --app sockperf-echo --work-us "$WORK_US" \
  --placement all >/dev/null

# ---- reference: one accelerator ---------------------------------------------------
mh_log "== reference: 1 shm agent, 1 accelerator"
start_agents shm 1 1
wait_fe_accels echo 1 10
measure_runs ref-1accel "$PORT" 1 "$CPA"
stop_agents

# ---- tcp and shm -------------------------------------------------------------------
for tr in tcp shm; do
  for n in $HOSTS_LIST; do
    acc=$((n * ACCELS_PER_HOST))
    mh_log "== $tr: $n agent(s) x $ACCELS_PER_HOST accelerators"
    start_agents "$tr" "$n" "$ACCELS_PER_HOST"
    wait_fe_accels echo "$acc" 15
    if [[ $n == "${HOSTS_LIST%% *}" ]]; then
      lat_service "$acc"
      latency "$tr"
      measure_runs "sat-$tr" "$LAT_PORT" "$acc" "$SAT_CLIENTS"
      lat_delete
      SAT_HOSTS=$n
    fi
    measure_runs "$tr-$n" "$PORT" "$acc" $((CPA * acc))
    stop_agents
  done
done

# ---- report ---------------------------------------------------------------------
OUT="bench/results/scaleout-$(date -u +%Y%m%dT%H%M%SZ).txt"
r1=$(median_run ref-1accel | awk '{ print $4 }')
row() { # TRANSPORT HOSTS LABEL IDEAL
  median_run "$3" | awk -v tr="$1" -v n="$2" -v ideal="$4" '{
      if (ideal > 0) { id = sprintf("%.0f", ideal); ef = sprintf("%.0f%%", 100 * $4 / ideal) } else { id = "-"; ef = "-" }
      printf "%-9s %5s %6d %7d %12.0f %11s %10s %14.1f %10.2f %6d %7d%%\n", tr, n, $2, $3, $4, id, ef, $5, $6, $7, $8 }'
}
drive() { # WHAT CPU_US
  awk -v w="$1" -v c="$2" 'BEGIN { if (c > 0) printf "  %-40s 1e6 / (%6.1f us x 3500) = %5.1f\n", w, c, 1e6 / (c * 3500) }'
}
{
  echo "# bench/scaleout.sh  $(date -u +%FT%TZ)  $(uname -m) $(nproc) cores; git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "# ONE $(nproc)-core VM: the sockperf clients, the frontend, the coordinator and every agent"
  echo "# ('hosts' are network namespaces on one bridge) share the same $(nproc) cores."
  echo "# load average at the start: $LOAD0 (anything else running skews the numbers; see machine_idle_% in the raw lines)"
  echo "# service sockperf-echo, ${SIZE} B, work_us $WORK_US (--work-mode sleep); frontend: 1 worker,"
  echo "# --dispatch lo, adaptive polling; load: $CPA sockperf ping-pong clients per accelerator"
  echo "# (closed loop), ${WARMUP} s warm-up, ${DUR} s window; the run with the median served rate of $RUNS
# (after an unrecorded ${WARMUP_RUN} s warm-up run); served = frontend responses/s."
  echo "# single-accelerator rate R1 (1 shm accelerator, $CPA clients): $r1 req/s (1e6/$WORK_US = $((1000000 / WORK_US)))"
  echo "# ideal = hosts x $ACCELS_PER_HOST x R1; efficiency = served / ideal; fe_cores = frontend CPU time / wall time;"
  echo "# drops = the frontend's dropped_total over the window; idle = the machine's idle CPU over the window"
  printf "%-9s %5s %6s %7s %12s %11s %10s %14s %10s %6s %8s\n" transport hosts accels clients \
    served_per_s ideal_per_s efficiency fe_cpu_us_req fe_cores drops idle
  for tr in tcp shm; do
    for n in $HOSTS_LIST; do
      row "$tr" "$n" "$tr-$n" "$(awk -v n="$n" -v a="$ACCELS_PER_HOST" -v r="$r1" 'BEGIN { print n * a * r }')"
    done
  done
  echo "# saturated frontend: work_us 0 service, $SAT_CLIENTS clients, ${SAT_HOSTS:-?} host(s):"
  for tr in tcp shm; do row "$tr-sat" "${SAT_HOSTS:-?}" "sat-$tr" 0; done
  read -r shm50 shm99 < <(awk '$1 == "latency-shm" { print $2, $3 }' "$RAW") || true
  read -r tcp50 tcp99 < <(awk '$1 == "latency-tcp" { print $2, $3 }' "$RAW") || true
  awk -v s="${shm50:-0}" -v t="${tcp50:-0}" -v s9="${shm99:-0}" -v t9="${tcp99:-0}" -v n="${SAT_HOSTS:-?}" 'BEGIN {
    printf "p50 latency, 1 ping-pong client, work_us 0, %s host(s): shm %.1f us, tcp %.1f us: tcp adds %.1f us (p99: shm %.1f, tcp %.1f us)\n", n, s, t, t - s, s9, t9 }'
  echo "accelerators one frontend core can drive at 3,500 req/s each = 1e6 / (fe_cpu_us_req x 3500):"
  for tr in shm tcp; do
    best='' at=''
    for n in $HOSTS_LIST; do
      c=$(median_run "$tr-$n" | awk '{ print $5 }')
      if [[ -z $best ]] || awk -v c="$c" -v b="$best" 'BEGIN { exit !(c > 0 && c < b) }'; then best=$c at=$n; fi
    done
    drive "$tr, work_us $WORK_US, $at host(s):" "$best"
    drive "$tr, saturated (work_us 0):" "$(median_run "sat-$tr" | awk '{ print $5 }')"
  done
  echo "# paper (Lynx, ASPLOS'20 §6.3): 74 for one Xeon core, 102 for BlueField"
  echo "# raw (label accels clients served_per_s cpu_us_per_req fe_cores drops machine_idle_% | latency-X p50 p99):"
  sed 's/^/#   /' "$RAW"
} | tee "$OUT"
mh_log "results in $OUT"
