#!/usr/bin/env bash
# bench/control-plane.sh - the control plane's figures, in one run.
#
#   A. join to serving: coordinator (--lease-ms 1000) + frontend + a
#      sockperf-echo service (placement all) created through the API; then
#      an agent starts and lynx-udp-probe (a pong request every 5 ms) waits
#      for the first answer through the frontend. Time from the agent's
#      process start to that answer; RUNS_JOIN runs (median, max). The agent
#      is stopped (SIGTERM: it leaves) between runs.
#   B. out of dispatch after kill -9: two agents serve the service under
#      sockperf under-load (1000 msg/s); one is killed with SIGKILL; time
#      until the frontend logs that the victim's accelerators left dispatch
#      (the coordinator's lease expiry, its table push, the frontend's
#      apply). The kill comes once the traffic flows through the frontend;
#      the requests the victim took with it are reported as the frontend's
#      lost + expired drops. RUNS_KILL runs with --lease-ms 1000, then RUNS_KILL with the
#      coordinator's default lease. Target: lease + 100 ms.
#   C. registry API latency: a fresh coordinator (default lease) with
#      lynx-simnodes registering 250 nodes x 4 accelerators (1,000), then
#      2,250 more (10,000); p50/p99 of GET /v1/nodes/{id}, /v1/services,
#      /v1/nodes and /v1/accelerators over one keep-alive connection
#      (lynx-apibench, API_COUNT requests each) while the simulated nodes
#      heartbeat, and a page from the middle of each big list (100 nodes,
#      400 accelerators: docs/api.md "Pages of the big lists").
#      Target: p99 <= 5 ms at 10,000 accelerators. Then the two
#      big lists again as a slow poller sees them: COLD_COUNT requests 1.1 s
#      apart, each missing the coordinator's list cache (1 s at most).
#   D. coordinator memory per accelerator: VmRSS before the first simulated
#      node and after the 10,000th, divided by 10,000.
#   With etcd installed (Debian: etcd-server), on a single etcd member:
#   E. join to serving as in A, the coordinator on etcd (--etcd) instead of
#      a state directory. Target: as A.
#   F. leader failover: three coordinators on etcd (--etcd-lease-s
#      ETCD_TTL_S, 2); the leader is killed with SIGKILL; time until one of
#      the others answers a service creation with 201 (a POST to each
#      follower in turn, every 20 ms). RUNS_FAILOVER runs; the killed one
#      comes back as a follower between runs. Target: TTL + 500 ms.
#   G. API latency on etcd at 10,000 accelerators (simulated nodes
#      registered with the leader): the four endpoints of C on the leader,
#      and on a follower (every /v1/ endpoint, /v1/services too, whose
#      state and instances are the leader's, answered by a redirect to the
#      leader, which lynx-apibench follows on the same connections). Target:
#      p99 <= 5 ms on both.
#
# Times taken from daemon logs have millisecond resolution (the log
# timestamps); everything runs on 127.0.0.1. The coordinator of part C needs
# one file descriptor per node: this script raises `ulimit -n` in its shell
# (to nodes + 200) before starting it; run it where the hard limit allows
# that (ulimit -Hn).
#
# usage: bench/control-plane.sh [BUILD_DIR]
#   env: RUNS_JOIN (5), RUNS_KILL (3), API_COUNT (300), COLD_COUNT (8),
#        ACCELS_PER_NODE (4), RUNS_FAILOVER (3), ETCD_TTL_S (2),
#        NO_ETCD=1 skips E-G,
#        KEEP=1 keeps the daemons' logs (the temp dir is printed at the end)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN="$BUILD/bin"
RUNS_JOIN=${RUNS_JOIN:-5}
RUNS_KILL=${RUNS_KILL:-3}
RUNS_FAILOVER=${RUNS_FAILOVER:-3}
ETCD_TTL_S=${ETCD_TTL_S:-2}
WITH_ETCD=1
[[ ${NO_ETCD:-0} == 1 ]] && WITH_ETCD=0
command -v etcd >/dev/null || WITH_ETCD=0
API_COUNT=${API_COUNT:-300}
COLD_COUNT=${COLD_COUNT:-8}
COLD_INTERVAL_MS=1100
APN=${ACCELS_PER_NODE:-4}
SMALL_ACCELS=1000
LARGE_ACCELS=10000
FAST_LEASE=1000
JOIN_TARGET=500
API_TARGET=5

for b in lynx-coordinator lynx-agent lynx-frontend lynx-simnodes lynx-udp-probe lynx-apibench; do
  [[ -x $BIN/$b ]] || { echo "$BIN/$b is missing: build first (make)"; exit 1; }
done
for t in sockperf curl jq; do
  command -v "$t" >/dev/null || { echo "$t is not installed (deploy/install-deps.sh)"; exit 1; }
done
((SMALL_ACCELS % APN == 0 && LARGE_ACCELS % APN == 0)) ||
  { echo "ACCELS_PER_NODE must divide $SMALL_ACCELS"; exit 1; }
NODES_SMALL=$((SMALL_ACCELS / APN))
NODES_LARGE=$((LARGE_ACCELS / APN))

# one file descriptor per simulated node in the coordinator (and the
# simulator, which raises its own limit)
need_fd=$((NODES_LARGE + 200))
if [[ $(ulimit -n) != unlimited ]] && (($(ulimit -n) < need_fd)); then
  ulimit -n "$need_fd" 2>/dev/null ||
    { echo "cannot raise ulimit -n to $need_fd (hard limit $(ulimit -Hn))"; exit 1; }
fi

TMP=$(mktemp -d /tmp/lynx-cpbench.XXXXXX)
NP="cpb$$" # node id prefix of this run (no '-': agents' region file names)
SERVICE=cpbench

# ---- processes and cleanup ---------------------------------------------

declare -A PIDS=() # pid -> name
start() { # NAME LOGFILE CMD... : starts in the background, sets LAST_PID
  local name=$1 logf=$2
  shift 2
  "$@" >"$logf" 2>&1 </dev/null &
  LAST_PID=$!
  PIDS[$LAST_PID]=$name
}
alive() { kill -0 "$1" 2>/dev/null; }
stop_pid() { # PID [SIGNAL]: signals, waits up to 10 s, SIGKILLs leftovers
  local pid=$1 sig=${2:-TERM} i
  [[ -n ${PIDS[$pid]:-} ]] || return 0
  kill -"$sig" "$pid" 2>/dev/null || true
  for ((i = 0; i < 200; i++)); do alive "$pid" || break; sleep 0.05; done
  if alive "$pid"; then
    echo "warning: ${PIDS[$pid]} (pid $pid) ignored SIG$sig for 10 s: SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
  unset "PIDS[$pid]"
}
cleanup() {
  local pid
  set +e
  for pid in "${!PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${!PIDS[@]}"; do stop_pid "$pid"; done
  rm -f /dev/shm/lynx-"$NP"* 2>/dev/null # regions of the agents killed with -9
  if [[ ${KEEP:-0} == 1 ]]; then echo "logs kept in $TMP" >&2; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

die() {
  local f
  echo "control-plane bench FAILED: $*" >&2
  for f in "$TMP"/*.log "$TMP"/*.out; do
    [[ -f $f ]] || continue
    echo "----- $(basename "$f") (last 15 lines) -----" >&2
    tail -n 15 "$f" >&2
  done
  exit 1
}
say() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# ---- time --------------------------------------------------------------

now_us() { echo "${EPOCHREALTIME/./}"; }
# us_of_day HH:MM:SS.mmm -> microseconds since UTC midnight
us_of_day() {
  local h=${1:0:2} m=${1:3:2} s=${1:6:2} ms=${1:9:3}
  echo $((((10#$h * 3600 + 10#$m * 60 + 10#$s) * 1000 + 10#$ms) * 1000))
}
# log_ms_after T_US LINE: ms from epoch-us T_US to the log line's timestamp
log_ms_after() {
  local t=$(($1 % 86400000000)) l d
  l=$(us_of_day "${2:0:12}")
  d=$((l - t))
  if ((d < -43200000000)); then d=$((d + 86400000000)); fi # midnight in between
  awk -v d="$d" 'BEGIN { printf "%.0f\n", d / 1000 }'
}
median() { sort -n | awk '{a[NR]=$1} END {if (!NR) print "n/a"; else print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
maxof() { sort -n | tail -n 1; }

# ---- ports -------------------------------------------------------------

used_ports() {
  local f hex
  for f in /proc/net/tcp /proc/net/tcp6 /proc/net/udp /proc/net/udp6; do
    [[ -r $f ]] || continue
    while read -r _ hex _; do
      hex=${hex##*:}
      if [[ $hex =~ ^[0-9A-Fa-f]{4}$ ]]; then echo $((16#$hex)); fi
    done <"$f"
  done | sort -un | tr '\n' ' '
  return 0
}
PICKED=" "
pick_port() { # VAR: a port free for TCP and UDP, below the ephemeral range
  local used p
  used=" $(used_ports) "
  for ((p = 17700 + RANDOM % 2000; ; p++)); do
    if ((p > 19999)); then p=17700; fi
    [[ $used == *" $p "* || $PICKED == *" $p "* ]] || break
  done
  PICKED+="$p "
  printf -v "$1" '%s' "$p"
}

# ---- daemons and the API -----------------------------------------------

wait_until() { # TIMEOUT_S WHAT CMD...: polls CMD every 20 ms
  local t=$1 what=$2 end
  shift 2
  end=$(($(now_us) + t * 1000000))
  until "$@"; do
    (($(now_us) < end)) || die "timed out after ${t}s waiting for $what"
    sleep 0.02
  done
}
api() { curl -sf --max-time 5 "http://$API$1"; }
api_ready() { api /readyz >/dev/null 2>&1; }

COORD_PID='' FE_PID=''
start_coordinator() { # TAG [--lease-ms N]: fresh state dir and ports
  local tag=$1
  shift
  pick_port CTL_PORT
  pick_port HTTP_PORT
  CTL=127.0.0.1:$CTL_PORT
  API=127.0.0.1:$HTTP_PORT
  COORD_LOG=$TMP/coordinator-$tag.log
  start coordinator "$COORD_LOG" "$BIN/lynx-coordinator" --listen "$CTL" \
    --http "$API" --state-dir "$TMP/state-$tag" "$@"
  COORD_PID=$LAST_PID
  wait_until 10 "the coordinator's /readyz" api_ready
}
role_of() { # HOST:PORT of an API: "leader", "follower" or ""
  curl -sf --max-time 1 "http://$1/readyz" | jq -r '.role // ""' 2>/dev/null || true
}
start_frontend() { # TAG
  FE_LOG=$TMP/frontend-$1.log
  FE_ID=${NP}fe
  pick_port FE_METRICS_PORT
  start frontend "$FE_LOG" "$BIN/lynx-frontend" --coordinator "$CTL" \
    --bind 127.0.0.1 --frontend-id "$FE_ID" --metrics "127.0.0.1:$FE_METRICS_PORT"
  FE_PID=$LAST_PID
}
fe_metric() { # NAME{LABELS}: one sample of the frontend's metrics (0 if none)
  curl -sf --max-time 5 "http://127.0.0.1:$FE_METRICS_PORT/metrics" |
    awk -v k="$1" '$1 == k {v = $2} END {print v + 0}'
}
fe_dropped() { # REASON: the frontend's drops of the service for that reason
  fe_metric "lynx_frontend_dropped_total{service=\"$SERVICE\",reason=\"$1\"}"
}
fe_received_above() { # N: the frontend received more than N datagrams
  (($(fe_metric "lynx_frontend_received_total{service=\"$SERVICE\"}") > $1))
}
create_service() { # JSON
  local code
  code=$(curl -s -o "$TMP/create.out" -w '%{http_code}' --max-time 5 \
    -H 'Content-Type: application/json' -d "$1" "http://$API/v1/services")
  [[ $code == 201 ]] || die "POST /v1/services answered $code: $(cat "$TMP/create.out")"
}
# the frontend runs the coordinator's latest table
fe_current() {
  local want got
  want=$(api /metrics | awk '$1 == "lynx_coordinator_table_version" {print $2}')
  got=$(api /v1/frontends | jq -r --arg id "$FE_ID" '.items[] | select(.id == $id) | .table_version')
  [[ -n $want && $want == "$got" ]]
}
svc_ready() { # N: the service has N ready instances and the frontend runs them
  local r
  r=$(api "/v1/services/$SERVICE" | jq -r '.instances.ready') || return 1
  [[ $r == "$1" ]] && fe_current
}
node_state_is() { # ID STATE
  [[ $(api "/v1/nodes/$1" | jq -r .state) == "$2" ]]
}
# start_agent ID: a CPU agent with 2 accelerators under the coordinator
start_agent() {
  AGENT_LOG=$TMP/agent-$1-$(now_us).log
  start "agent $1" "$AGENT_LOG" "$BIN/lynx-agent" --coordinator "$CTL" \
    --cpu-accels 2 --node-id "$1"
  AGENT_PID=$LAST_PID
}
rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }

RAW=$TMP/raw.txt
: >"$RAW"
raw() { echo "$*" >>"$RAW"; }

pick_port UDP_PORT
SVC_JSON="{\"name\": \"$SERVICE\", \"port\": $UDP_PORT, \"app\": \"sockperf-echo\", \"placement\": \"all\"}"

# ---- A + B (lease 1000 ms) and B (default lease) -------------------------

# A: join to serving
measure_join() { # [TAG]: the runs' figures go to $TMP/join$TAG.txt
  local tag=${1:-} i t0 probe_pid out ms reg_ms disp_ms line jnode=${NP}j
  for ((i = 1; i <= RUNS_JOIN; i++)); do
    start probe "$TMP/probe.out" "$BIN/lynx-udp-probe" --port "$UDP_PORT" \
      --interval-ms 5 --timeout-ms 15000
    probe_pid=$LAST_PID
    sleep 0.1
    alive "$probe_pid" || die "join run $i: the service answered before any agent started"
    t0=$(now_us)
    start_agent "$jnode"
    wait "$probe_pid" || die "join run $i: no answer within 15 s of the agent's start"
    unset "PIDS[$probe_pid]"
    out=$(cat "$TMP/probe.out")
    [[ $out =~ realtime_ns=([0-9]+) ]] || die "join run $i: probe said '$out'"
    ms=$(awk -v a="${BASH_REMATCH[1]}" -v b="$t0" 'BEGIN { printf "%.1f\n", (a / 1000 - b) / 1000 }')
    line=$(grep -m1 "registered with coordinator" "$AGENT_LOG" || true)
    reg_ms=$([[ -n $line ]] && log_ms_after "$t0" "$line" || echo "?")
    line=$(grep "accelerator $jnode/" "$FE_LOG" | grep " in dispatch" | tail -n 1 || true)
    disp_ms=$([[ -n $line ]] && log_ms_after "$t0" "$line" || echo "?")
    raw "join${tag:+ store=$tag} run=$i ms=$ms registered_ms=$reg_ms last_in_dispatch_ms=$disp_ms"
    echo "$ms" >>"$TMP/join$tag.txt"
    say "join run $i: first answer ${ms} ms after the agent's start (registered at ${reg_ms} ms, in dispatch at ${disp_ms} ms)"
    stop_pid "$AGENT_PID" TERM
    wait_until 10 "node $jnode down after its agent left" node_state_is "$jnode" down
    wait_until 10 "the frontend to apply the table without $jnode" svc_ready 0
  done
}

# B: kill -9 with traffic; LEASE is the coordinator's lease
measure_kill() {
  local lease=$1 tag=$2 i n0 c0 t_kill line out_ms push_ms sp_pid dur stats
  local ver applied_ms lost0 exp0 lost exp rcv0
  local victim=${NP}v survivor=${NP}s vpid target=$((lease + 100))
  start_agent "$survivor"
  start_agent "$victim"
  vpid=$AGENT_PID
  wait_until 15 "4 instances ready and applied" svc_ready 4
  # sockperf's test time: 0.5 s before the kill, the lease, 2 s after
  dur=$(((lease + 999) / 1000 + 3))
  for ((i = 1; i <= RUNS_KILL; i++)); do
    n0=$(wc -l <"$FE_LOG")
    c0=$(wc -l <"$COORD_LOG")
    rcv0=$(fe_metric "lynx_frontend_received_total{service=\"$SERVICE\"}")
    start sockperf "$TMP/sockperf-$tag-$i.out" sockperf under-load -i 127.0.0.1 \
      -p "$UDP_PORT" -m 64 -t "$dur" --mps 1000 --reply-every 1
    sp_pid=$LAST_PID
    # sockperf takes a while (about 2 s here) before its first datagram:
    # kill once the traffic really flows through the frontend
    wait_until 10 "sockperf's traffic at the frontend" fe_received_above "$((rcv0 + 100))"
    sleep 0.4
    lost0=$(fe_dropped lost)
    exp0=$(fe_dropped expired)
    t_kill=$(now_us)
    kill -KILL "$vpid"
    wait "$vpid" 2>/dev/null || true
    unset "PIDS[$vpid]"
    wait_until $((lease / 1000 + 10)) "the frontend to take $victim out of dispatch" \
      eval "tail -n +$((n0 + 1)) '$FE_LOG' | grep 'accelerator $victim/' | grep -qE 'leaves dispatch|out of dispatch'"
    line=$(tail -n +$((n0 + 1)) "$FE_LOG" | grep "accelerator $victim/" | grep -m1 -E 'leaves dispatch|out of dispatch')
    out_ms=$(log_ms_after "$t_kill" "$line")
    line=$(tail -n +$((c0 + 1)) "$COORD_LOG" | grep -m1 -E "table [0-9]+ -> frontend $FE_ID \(1 services, 2 instances\)" || true)
    push_ms=$([[ -n $line ]] && log_ms_after "$t_kill" "$line" || echo "?")
    ver=$(sed -n 's/.* table \([0-9]*\) -> frontend.*/\1/p' <<<"$line")
    line=$(tail -n +$((n0 + 1)) "$FE_LOG" | grep -m1 "table ${ver:-none} applied" || true)
    applied_ms=$([[ -n $line ]] && log_ms_after "$t_kill" "$line" || echo "?")
    wait "$sp_pid" 2>/dev/null || true
    unset "PIDS[$sp_pid]"
    lost=$(($(fe_dropped lost) - lost0))
    exp=$(($(fe_dropped expired) - exp0))
    stats=$(sed 's/\x1b\[[0-9;]*m//g' "$TMP/sockperf-$tag-$i.out" |
      sed -n 's/.*\[Total Run\].*SentMessages=\([0-9]*\); ReceivedMessages=\([0-9]*\).*/sent=\1 received=\2/p' | head -n 1)
    raw "kill lease=$lease run=$i out_of_dispatch_ms=$out_ms table_pushed_ms=$push_ms table_applied_ms=$applied_ms frontend_lost=$lost frontend_expired=$exp sockperf ${stats:-?}"
    echo "$out_ms" >>"$TMP/kill-$tag.txt"
    say "kill -9 run $i (lease $lease ms): out of dispatch after ${out_ms} ms (table pushed at ${push_ms}, applied at ${applied_ms} ms; target ${target} ms); lost $lost expired $exp; sockperf ${stats:-?}"
    node_state_is "$victim" down || raw "kill lease=$lease run=$i: WARNING: $victim not down in the API"
    start_agent "$victim"
    vpid=$AGENT_PID
    wait_until 15 "$victim back in dispatch" svc_ready 4
  done
  stop_pid "$vpid" TERM
  stop_pid "$(pgrep_agent "$survivor")" TERM
}
pgrep_agent() { # ID: pid of our agent with that node id
  local pid
  for pid in "${!PIDS[@]}"; do [[ ${PIDS[$pid]} == "agent $1" ]] && { echo "$pid"; return; }; done
  echo 0
}

say "part A/B: coordinator with --lease-ms $FAST_LEASE, frontend, service $SERVICE on UDP $UDP_PORT"
start_coordinator fast --lease-ms "$FAST_LEASE"
start_frontend fast
create_service "$SVC_JSON"
wait_until 10 "the frontend to run the latest table" fe_current
measure_join
measure_kill "$FAST_LEASE" fast
stop_pid "$FE_PID" TERM
stop_pid "$COORD_PID" TERM

DEFAULT_LEASE=$("$BIN/lynx-coordinator" --help | sed -n 's/.*--lease-ms.*\[default \([0-9]*\)\].*/\1/p')
say "part B: coordinator with its default lease ($DEFAULT_LEASE ms)"
start_coordinator default
start_frontend default
create_service "$SVC_JSON"
wait_until 10 "the frontend to run the latest table" fe_current
measure_kill "$DEFAULT_LEASE" default
stop_pid "$FE_PID" TERM
stop_pid "$COORD_PID" TERM

# ---- C + D: API latency and memory with simulated accelerators -------------

# a page from the middle of the big lists (docs/api.md "Pages")
PAGE_NODES="/v1/nodes?limit=100&after=${NP}x00100"
PAGE_ACCELS="/v1/accelerators?limit=400&after=${NP}x00100"
api_bench() { # TAG: runs lynx-apibench on the four endpoints and two pages
  local tag=$1 base="http://$API"
  "$BIN/lynx-apibench" --count "$API_COUNT" --warmup 20 \
    "$base/v1/nodes/${NP}x00000" "$base/v1/services" "$base/v1/nodes" \
    "$base/v1/accelerators" "$base$PAGE_NODES" "$base$PAGE_ACCELS" >"$TMP/api-$tag.out" 2>&1 ||
    die "lynx-apibench ($tag) failed: $(cat "$TMP/api-$tag.out")"
  sed "s/^/api accels=$tag /" "$TMP/api-$tag.out" >>"$RAW"
}
metric() { api /metrics | awk -v n="$1" '$1 == n {print $2}'; }
sims_registered() { grep -q '^simnodes: registered' "$1"; }
all_ready() { [[ $(metric 'lynx_coordinator_nodes{state="ready"}') == "$1" ]]; }

say "part C/D: fresh coordinator (default lease), simulated nodes of $APN accelerators"
start_coordinator sim
# a service, so that /v1/services has an item; its selector matches no
# simulated node (they would only answer InstanceFailed)
create_service "{\"name\": \"$SERVICE\", \"port\": $UDP_PORT, \"app\": \"sockperf-echo\", \"placement\": {\"selector\": {\"pool\": \"real\"}}}"
"$BIN/lynx-apibench" --count 20 --warmup 0 "http://$API/v1/services" \
  "http://$API/v1/nodes" "http://$API/v1/accelerators" >/dev/null ||
  die "the API does not answer"
sleep 0.5
RSS0=$(rss_kb "$COORD_PID")

start simnodes "$TMP/sim1.out" "$BIN/lynx-simnodes" --coordinator "$CTL" \
  --nodes "$NODES_SMALL" --accels "$APN" --prefix "${NP}x"
SIM1=$LAST_PID
wait_until 60 "$NODES_SMALL simulated nodes to register" sims_registered "$TMP/sim1.out"
wait_until 10 "$NODES_SMALL nodes ready" all_ready "$NODES_SMALL"
raw "sim1 $(grep '^simnodes: registered' "$TMP/sim1.out")"
sleep 1
say "API at $SMALL_ACCELS accelerators"
api_bench "$SMALL_ACCELS"

start simnodes "$TMP/sim2.out" "$BIN/lynx-simnodes" --coordinator "$CTL" \
  --nodes $((NODES_LARGE - NODES_SMALL)) --accels "$APN" --prefix "${NP}y"
SIM2=$LAST_PID
wait_until 120 "$((NODES_LARGE - NODES_SMALL)) more simulated nodes to register" \
  sims_registered "$TMP/sim2.out"
wait_until 20 "$NODES_LARGE nodes ready" all_ready "$NODES_LARGE"
raw "sim2 $(grep '^simnodes: registered' "$TMP/sim2.out")"
[[ $(metric lynx_coordinator_accelerators) == "$LARGE_ACCELS" ]] ||
  die "the coordinator counts $(metric lynx_coordinator_accelerators) accelerators, not $LARGE_ACCELS"
sleep 2 # a couple of heartbeat rounds
RSS1=$(rss_kb "$COORD_PID")
say "API at $LARGE_ACCELS accelerators"
api_bench "$LARGE_ACCELS"
# A poller asking once a second or less often never hits the coordinator's
# list cache (kept while the registry version holds, at most 1 s): it pays
# the full encoding every time.
say "API at $LARGE_ACCELS accelerators, one request every ${COLD_INTERVAL_MS} ms"
"$BIN/lynx-apibench" --count "$COLD_COUNT" --warmup 1 --interval-ms "$COLD_INTERVAL_MS" \
  "http://$API/v1/nodes" "http://$API/v1/accelerators" >"$TMP/api-cold.out" 2>&1 ||
  die "lynx-apibench (cold) failed: $(cat "$TMP/api-cold.out")"
sed "s/^/api accels=$LARGE_ACCELS interval_ms=$COLD_INTERVAL_MS /" "$TMP/api-cold.out" >>"$RAW"
RSS2=$(rss_kb "$COORD_PID")
EXPIRIES=$(metric lynx_coordinator_lease_expiries_total)
READY_AFTER=$(metric 'lynx_coordinator_nodes{state="ready"}')
raw "memory rss_before_kb=$RSS0 rss_10k_kb=$RSS1 rss_after_api_kb=$RSS2 lease_expiries=$EXPIRIES ready_after_api=$READY_AFTER"
stop_pid "$SIM2" TERM
stop_pid "$SIM1" TERM
raw "sim1 $(grep '^simnodes: stopped' "$TMP/sim1.out" || echo 'no summary')"
raw "sim2 $(grep '^simnodes: stopped' "$TMP/sim2.out" || echo 'no summary')"
stop_pid "$COORD_PID" TERM

# ---- E, F, G: on etcd ----------------------------------------------------------

ETCD_EP=''
start_etcd_member() {
  local c p
  pick_port ETCD_CPORT
  pick_port ETCD_PPORT
  c=http://127.0.0.1:$ETCD_CPORT p=http://127.0.0.1:$ETCD_PPORT
  start etcd "$TMP/etcd.log" etcd --name cpb --data-dir "$TMP/etcd-data" \
    --listen-client-urls "$c" --advertise-client-urls "$c" \
    --listen-peer-urls "$p" --initial-advertise-peer-urls "$p" \
    --initial-cluster "cpb=$p" --initial-cluster-state new
  ETCD_EP=$c
  wait_until 20 "etcd to serve" grep -q "ready to serve client requests" "$TMP/etcd.log"
}
# HA_API[i], HA_CTL[i], HA_PID[i]: three coordinators on etcd
declare -a HA_API=() HA_CTL=() HA_PID=()
start_ha() { # I: coordinator I (0..2) on etcd
  local i=$1 cp hp
  if [[ -z ${HA_API[i]:-} ]]; then
    pick_port cp
    pick_port hp
    HA_CTL[i]=127.0.0.1:$cp
    HA_API[i]=127.0.0.1:$hp
  fi
  start "coordinator ha$i" "$TMP/coordinator-ha$i-$(now_us).log" "$BIN/lynx-coordinator" \
    --listen "${HA_CTL[i]}" --http "${HA_API[i]}" --etcd "$ETCD_EP" \
    --etcd-prefix "/$NP/" --etcd-lease-s "$ETCD_TTL_S"
  HA_PID[i]=$LAST_PID
}
ha_leader() { # sets LEADER (index) when one leads
  local i
  for i in 0 1 2; do
    [[ $(role_of "${HA_API[i]}") == leader ]] && { LEADER=$i; return 0; }
  done
  return 1
}
# F: the leader killed; ms until another takes a change
measure_failover() {
  local run i t0 code ms name
  for ((run = 1; run <= RUNS_FAILOVER; run++)); do
    wait_until 20 "a leader among the three" ha_leader
    for i in 0 1 2; do
      ((i == LEADER)) || wait_until 20 "coordinator $i to follow" eval "[[ \$(role_of ${HA_API[i]}) == follower ]]"
    done
    t0=$(now_us)
    kill -KILL "${HA_PID[LEADER]}"
    wait "${HA_PID[LEADER]}" 2>/dev/null || true
    unset "PIDS[${HA_PID[LEADER]}]"
    code=000
    for (( ; ; )); do
      for i in 0 1 2; do
        ((i == LEADER)) && continue
        name=fo$run$((RANDOM))
        code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 \
          -H 'Content-Type: application/json' \
          -d "{\"name\": \"$name\", \"port\": $((20000 + run)), \"app\": \"sockperf-echo\"}" \
          "http://${HA_API[i]}/v1/services" || true)
        [[ $code == 201 ]] && break 2
      done
      (($(now_us) - t0 < 30000000)) || die "failover run $run: no coordinator took a change within 30 s (last HTTP $code)"
      sleep 0.02
    done
    ms=$(awk -v a="$(now_us)" -v b="$t0" 'BEGIN { printf "%.0f\n", (a - b) / 1000 }')
    echo "$ms" >>"$TMP/failover.txt"
    raw "failover run=$run ttl_s=$ETCD_TTL_S first_write_ms=$ms by=coordinator$i"
    say "failover run $run: coordinator $i took a change ${ms} ms after the leader's kill (TTL ${ETCD_TTL_S} s)"
    curl -s -o /dev/null --max-time 5 -X DELETE "http://${HA_API[i]}/v1/services/$name" || true
    start_ha "$LEADER"
  done
}

if ((WITH_ETCD)); then
  say "part E: join to serving with the coordinator on etcd"
  start_etcd_member
  start_coordinator etcd --lease-ms "$FAST_LEASE" --etcd "$ETCD_EP" --etcd-prefix "/${NP}e/"
  start_frontend etcd
  create_service "$SVC_JSON"
  wait_until 10 "the frontend to run the latest table" fe_current
  measure_join etcd
  stop_pid "$FE_PID" TERM
  stop_pid "$COORD_PID" TERM

  say "part G: three coordinators on etcd, $LARGE_ACCELS simulated accelerators on the leader"
  for i in 0 1 2; do start_ha "$i"; done
  wait_until 20 "a leader among the three" ha_leader
  API=${HA_API[LEADER]}
  CTL=${HA_CTL[LEADER]}
  create_service "{\"name\": \"$SERVICE\", \"port\": $UDP_PORT, \"app\": \"sockperf-echo\", \"placement\": {\"selector\": {\"pool\": \"real\"}}}"
  start simnodes "$TMP/sim3.out" "$BIN/lynx-simnodes" --coordinator "$CTL" \
    --nodes "$NODES_LARGE" --accels "$APN" --prefix "${NP}x"
  SIM3=$LAST_PID
  wait_until 180 "$NODES_LARGE simulated nodes to register with the leader" sims_registered "$TMP/sim3.out"
  wait_until 20 "$NODES_LARGE nodes ready" all_ready "$NODES_LARGE"
  raw "sim3 $(grep '^simnodes: registered' "$TMP/sim3.out")"
  sleep 2
  FOLLOWER=$(((LEADER + 1) % 3))
  wait_until 10 "the follower to load the service" eval "curl -sf 'http://${HA_API[FOLLOWER]}/metrics' | grep -q '^lynx_coordinator_services [1-9]'"
  say "API on the etcd leader at $LARGE_ACCELS accelerators"
  api_bench etcd-leader
  say "API on an etcd follower at $LARGE_ACCELS accelerators"
  API=${HA_API[FOLLOWER]}
  api_bench etcd-follower
  API=${HA_API[LEADER]}
  stop_pid "$SIM3" TERM

  say "part F: leader failover, $RUNS_FAILOVER runs, etcd lease $ETCD_TTL_S s"
  measure_failover
  for i in 0 1 2; do stop_pid "${HA_PID[i]}" TERM; done
fi

# ---- report ------------------------------------------------------------------

verdict() { # VALUE TARGET -> PASS/MISS (value <= target)
  awk -v v="$1" -v t="$2" 'BEGIN { if (v == "n/a" || v == "") print "n/a"; else print (v + 0 <= t + 0) ? "PASS" : "MISS" }'
}
row() { printf '%-52s %14s %14s  %s\n' "$1" "$2" "$3" "$4"; }
api_field() { # TAG PATH FIELD
  grep "^apibench: url=http://[^ ]*$2 " "$TMP/api-$1.out" | sed -n "s/.* $3=\([0-9.]*\).*/\1/p"
}

JOIN_MED=$(median <"$TMP/join.txt")
JOIN_MAX=$(maxof <"$TMP/join.txt")
KF_MED=$(median <"$TMP/kill-fast.txt")
KF_MAX=$(maxof <"$TMP/kill-fast.txt")
KD_MED=$(median <"$TMP/kill-default.txt")
KD_MAX=$(maxof <"$TMP/kill-default.txt")
FO_TARGET=$((ETCD_TTL_S * 1000 + 500))
if ((WITH_ETCD)); then
  JOINE_MED=$(median <"$TMP/joinetcd.txt")
  JOINE_MAX=$(maxof <"$TMP/joinetcd.txt")
  FO_MED=$(median <"$TMP/failover.txt")
  FO_MAX=$(maxof <"$TMP/failover.txt")
fi
MEM_B=$(awk -v a="$RSS0" -v b="$RSS1" -v n="$LARGE_ACCELS" 'BEGIN { printf "%.0f", (b - a) * 1024 / n }')

OUT="bench/results/control-plane-$(date -u +%Y%m%dT%H%M%SZ).txt"
mkdir -p bench/results
{
  echo "# bench/control-plane.sh  $(date -u +%FT%TZ)  $(uname -m) $(nproc) cores"
  echo "# git $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (with local changes)'); join runs=$RUNS_JOIN, kill runs=$RUNS_KILL per lease, API requests=$API_COUNT per endpoint over one keep-alive connection, $APN accelerators per simulated node"
  row "figure" "measured" "target" "result"
  row "join to serving, median (ms)" "$JOIN_MED" "<= $JOIN_TARGET" "$(verdict "$JOIN_MED" "$JOIN_TARGET")"
  row "join to serving, max (ms)" "$JOIN_MAX" "<= $JOIN_TARGET" "$(verdict "$JOIN_MAX" "$JOIN_TARGET")"
  row "kill -9 -> out of dispatch, lease $FAST_LEASE, median (ms)" "$KF_MED" "<= $((FAST_LEASE + 100))" "$(verdict "$KF_MED" $((FAST_LEASE + 100)))"
  row "kill -9 -> out of dispatch, lease $FAST_LEASE, max (ms)" "$KF_MAX" "<= $((FAST_LEASE + 100))" "$(verdict "$KF_MAX" $((FAST_LEASE + 100)))"
  row "kill -9 -> out of dispatch, lease $DEFAULT_LEASE, median (ms)" "$KD_MED" "<= $((DEFAULT_LEASE + 100))" "$(verdict "$KD_MED" $((DEFAULT_LEASE + 100)))"
  row "kill -9 -> out of dispatch, lease $DEFAULT_LEASE, max (ms)" "$KD_MAX" "<= $((DEFAULT_LEASE + 100))" "$(verdict "$KD_MAX" $((DEFAULT_LEASE + 100)))"
  for n in "$SMALL_ACCELS" "$LARGE_ACCELS"; do
    for ep in "/v1/nodes/{id}" /v1/services /v1/nodes /v1/accelerators "$PAGE_NODES" "$PAGE_ACCELS"; do
      path=${ep//\{id\}/${NP}x00000}
      p50=$(api_field "$n" "$path" p50_ms)
      p99=$(api_field "$n" "$path" p99_ms)
      row "API GET $ep @ $n accels, p50 / p99 (ms)" "$p50 / $p99" "p99 <= $API_TARGET" \
        "$(verdict "$p99" "$API_TARGET")$( ((n == LARGE_ACCELS)) || echo ' (target is at 10,000)')"
    done
  done
  for ep in /v1/nodes /v1/accelerators; do
    p50=$(api_field cold "$ep" p50_ms)
    mx=$(api_field cold "$ep" max_ms)
    row "API GET $ep @ $LARGE_ACCELS, 1 req/1.1 s, p50 / max (ms)" "$p50 / $mx" "p99 <= $API_TARGET" \
      "$(verdict "$mx" "$API_TARGET") (cache miss, $COLD_COUNT requests)"
  done
  if ((WITH_ETCD)); then
    row "join to serving on etcd, median (ms)" "$JOINE_MED" "<= $JOIN_TARGET" "$(verdict "$JOINE_MED" "$JOIN_TARGET")"
    row "join to serving on etcd, max (ms)" "$JOINE_MAX" "<= $JOIN_TARGET" "$(verdict "$JOINE_MAX" "$JOIN_TARGET")"
    row "leader kill -9 -> first write, TTL $ETCD_TTL_S s, median (ms)" "$FO_MED" "<= $FO_TARGET" "$(verdict "$FO_MED" "$FO_TARGET")"
    row "leader kill -9 -> first write, TTL $ETCD_TTL_S s, max (ms)" "$FO_MAX" "<= $FO_TARGET" "$(verdict "$FO_MAX" "$FO_TARGET")"
    for who in leader follower; do
      for ep in "/v1/nodes/{id}" /v1/services /v1/nodes /v1/accelerators "$PAGE_NODES" "$PAGE_ACCELS"; do
        path=${ep//\{id\}/${NP}x00000}
        p50=$(api_field "etcd-$who" "$path" p50_ms)
        p99=$(api_field "etcd-$who" "$path" p99_ms)
        row "API GET $ep @ $LARGE_ACCELS, etcd $who, p50 / p99" "$p50 / $p99" "p99 <= $API_TARGET" "$(verdict "$p99" "$API_TARGET")"
      done
    done
  else
    echo "# parts E-G (etcd) skipped: $( ((${NO_ETCD:-0})) && echo NO_ETCD=1 || echo 'etcd is not installed')"
  fi
  row "coordinator memory per accelerator (bytes)" "$MEM_B" "-" "info"
  echo "# memory: VmRSS ${RSS0} kB before the simulated nodes, ${RSS1} kB with $LARGE_ACCELS accelerators ($NODES_LARGE nodes), ${RSS2} kB after the API runs"
  echo "# API details (ttfb: until the answer's first byte, i.e. the coordinator's work; bytes: body size):"
  for n in "$SMALL_ACCELS" "$LARGE_ACCELS" cold; do
    sed -e 's/^apibench: /#   /' -e "s|url=http://[^/]*|accels=${n/cold/$LARGE_ACCELS every ${COLD_INTERVAL_MS} ms} |" "$TMP/api-$n.out"
  done
  if ((WITH_ETCD)); then
    for n in etcd-leader etcd-follower; do
      sed -e 's/^apibench: /#   /' -e "s|url=http://[^/]*|accels=$LARGE_ACCELS $n |" "$TMP/api-$n.out"
    done
  fi
  echo "# raw:"
  sed 's/^/#   /' "$RAW"
} | tee "$OUT"
echo "written to $OUT" >&2
