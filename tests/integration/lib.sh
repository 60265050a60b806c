# lib.sh - shared helpers of the Lynx-C integration tests. Source it first:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"
#   it_init my_test            # temp dir, traps, watchdog
#   it_require sockperf curl   # exit 77 (skip) when a tool is missing
#   pick_ports AGENT_PORT UDP_PORT METRICS_PORT
#   start_agent [extra agent options]     # waits for "serving descriptors"
#   start_frontend [extra frontend options]  # waits for "serving UDP"
#   v=$(metric lynx_frontend_responded_total) || fail "cannot scrape"
#
# The binaries' directory comes from the first script argument or
# $LYNX_BIN_DIR (ctest passes both), else ../../build/bin.
#
# Every process started through these helpers is recorded; on exit (normal,
# failure, INT, TERM or the watchdog) the cleanup trap SIGTERMs what is still
# running, waits, SIGKILLs leftovers, and checks that no /dev/shm/lynx-* file
# of this test's agents (node id $IT_NODE) remains. A lynx daemon that needs
# SIGKILL, or a region file left by an agent that was not killed with -9 on
# purpose (kill9), turns the test into a failure. When the test fails, the
# logs of every process are printed.

set -u
set -o pipefail

IT_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LYNX_BIN_DIR=${1:-${LYNX_BIN_DIR:-$IT_LIB_DIR/../../build/bin}}
export LYNX_BIN_DIR

# The agents' transport: shm (region files in /dev/shm, checked by the
# tests) unless the ctest entry says tcp.
IT_TRANSPORT=${IT_TRANSPORT:-shm}
IT_NAME=${IT_NAME:-$(basename "$0" .sh)}
[[ $IT_TRANSPORT == shm ]] || IT_NAME+=".$IT_TRANSPORT"
IT_DIR=
IT_NODE=
IT_WATCHDOG=

# The time scale (docs/testing.md): LYNX_TEST_TIME_SCALE, a whole number
# (ctest passes the build's: 2 under the sanitizers, 5 under emulation, 3
# for make test-busy, else 1), multiplies every wall-clock bound: the
# watchdog, every wait of these helpers, and the bounds the tests assert
# on elapsed time (written as $(ts_ms N) or $(ts_s N)). A bound that is
# the product's own (a lease, a timeout the test gave a daemon) is not
# scaled; the slack a test allows above it is.
TS=${LYNX_TEST_TIME_SCALE:-1}
if ! [[ $TS =~ ^[1-9][0-9]?$ ]]; then
  echo "LYNX_TEST_TIME_SCALE=$TS: want a whole number from 1 to 99" >&2
  exit 2
fi
ts_ms() { echo $(($1 * TS)); } # ts_ms MS: MS times the time scale
ts_s() { echo $(($1 * TS)); }  # ts_s S: the same for seconds

# the watchdog's, below ctest's TIMEOUT of 120 (it_init scales both)
IT_DEADLINE_S=${IT_DEADLINE_S:-100}
declare -A IT_PIDS=()   # pid -> name of every running process we started
declare -A IT_KILLED9=() # agent pids killed with SIGKILL on purpose
declare -A IT_STARTED=() # every pid this test started (untracked ones too)
declare -a IT_PORTS=()  # ports picked so far
IT_SEQ=0
IT_CLEANED=0

# ---- messages ---------------------------------------------------------

log() { printf '[%s] %s: %s\n' "$(date +%H:%M:%S.%3N)" "$IT_NAME" "$*"; }
fail() {
  printf '[%s] %s: FAIL: %s\n' "$(date +%H:%M:%S.%3N)" "$IT_NAME" "$*" >&2
  exit 1
}
skip() {
  printf '%s: SKIP: %s\n' "$IT_NAME" "$*"
  exit 77
}

is_uint() { [[ ${1:-} =~ ^[0-9]+$ ]]; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }

# Assertions fail the test at once; with IT_SOFT=1 they record the failure,
# return 1 and let the test go on (it_done then fails it), so one run
# reports every broken invariant.
IT_SOFT=0
IT_NFAIL=0
it_check_failed() {
  if ((IT_SOFT)); then
    printf '[%s] %s: FAILED CHECK: %s\n' "$(date +%H:%M:%S.%3N)" "$IT_NAME" "$*" >&2
    IT_NFAIL=$((IT_NFAIL + 1))
    return 1
  fi
  fail "$@"
}
# it_done: exit 0, or 1 when a soft check failed.
it_done() {
  ((IT_NFAIL == 0)) || fail "$IT_NFAIL check(s) failed (see FAILED CHECK above)"
  exit 0
}

# assert_eq ACTUAL EXPECTED WHAT
assert_eq() {
  if ! is_uint "$1" || ! is_uint "$2"; then
    it_check_failed "$3: not numbers: '$1' vs '$2'"
    return 1
  fi
  (($1 == $2)) || { it_check_failed "$3: got $1, want $2"; return 1; }
  log "ok: $3 = $1"
}
# assert_str ACTUAL EXPECTED WHAT: the same text
assert_str() {
  [[ $1 == "$2" ]] || { it_check_failed "$3: got '$1', want '$2'"; return 1; }
  log "ok: $3 = '$1'"
}
# assert_gt ACTUAL BOUND WHAT
assert_gt() {
  if ! is_uint "$1" || ! is_uint "$2"; then
    it_check_failed "$3: not numbers: '$1' vs '$2'"
    return 1
  fi
  (($1 > $2)) || { it_check_failed "$3: got $1, want > $2"; return 1; }
  log "ok: $3 = $1 (> $2)"
}
# assert_ge ACTUAL BOUND WHAT
assert_ge() {
  if ! is_uint "$1" || ! is_uint "$2"; then
    it_check_failed "$3: not numbers: '$1' vs '$2'"
    return 1
  fi
  (($1 >= $2)) || { it_check_failed "$3: got $1, want >= $2"; return 1; }
  log "ok: $3 = $1 (>= $2)"
}
# assert_lt ACTUAL BOUND WHAT
assert_lt() {
  if ! is_uint "$1" || ! is_uint "$2"; then
    it_check_failed "$3: not numbers: '$1' vs '$2'"
    return 1
  fi
  (($1 < $2)) || { it_check_failed "$3: got $1, want < $2"; return 1; }
  log "ok: $3 = $1 (< $2)"
}
# assert_le ACTUAL BOUND WHAT
assert_le() {
  if ! is_uint "$1" || ! is_uint "$2"; then
    it_check_failed "$3: not numbers: '$1' vs '$2'"
    return 1
  fi
  (($1 <= $2)) || { it_check_failed "$3: got $1, want <= $2"; return 1; }
  log "ok: $3 = $1 (<= $2)"
}
# assert_log FILE PATTERN WHAT: FILE holds the fixed string PATTERN.
assert_log() {
  grep -qF -- "$2" "$1" || { it_check_failed "$3: no '$2' in $(basename "$1")"; return 1; }
  log "ok: $3"
}

# ---- set-up -------------------------------------------------------------

# it_init NAME: temp dir, node id, traps, watchdog. Checks the binaries.
it_init() {
  IT_NAME=${1:-$IT_NAME}
  IT_DIR=$(mktemp -d "${TMPDIR:-/tmp}/lynx-it-$IT_NAME.XXXXXX") ||
    { echo "$IT_NAME: cannot create a temp dir" >&2; exit 1; }
  # node ids: at most 31 characters, no '-': region files are
  # /dev/shm/lynx-<node>-<agent pid>-a<i>
  IT_NODE="it${$}r${RANDOM}"
  trap it_cleanup EXIT
  trap 'log "interrupted"; exit 130' INT
  trap 'log "terminated"; exit 143' TERM
  IT_DEADLINE_S=$((IT_DEADLINE_S * TS))
  # a deadline of our own, so the cleanup runs even when ctest would kill us
  # (the watchdog takes its sleep down with it when the cleanup stops it)
  (
    trap 'kill "$sp" 2>/dev/null; exit 0' TERM
    sleep "$IT_DEADLINE_S" &
    sp=$!
    wait "$sp"
    echo "[$IT_NAME] watchdog: the test exceeded ${IT_DEADLINE_S}s" >&2
    kill -TERM $$ 2>/dev/null
  ) </dev/null >/dev/null &
  IT_WATCHDOG=$!
  local b
  for b in lynx-agent lynx-frontend; do
    [[ -x $LYNX_BIN_DIR/$b ]] || fail "$LYNX_BIN_DIR/$b is missing: build first (make)"
  done
  log "bin dir $LYNX_BIN_DIR, temp dir $IT_DIR, node id $IT_NODE"
}

# it_require TOOL...: skip (77) when one is missing.
it_require() {
  local t
  for t in "$@"; do
    command -v "$t" >/dev/null 2>&1 || skip "$t is not installed"
  done
}

# it_extra WHAT WHY: skip (77) unless LYNX_TEST_EXTRA (words, as
# PostgreSQL's PG_TEST_EXTRA) names WHAT: for tests that change the machine
# (WHY says how). `make test-all LYNX_TEST_EXTRA=host` runs them; CI does.
it_extra() {
  [[ " ${LYNX_TEST_EXTRA:-} " == *" $1 "* ]] ||
    skip "it $2: runs only with LYNX_TEST_EXTRA=$1 (docs/testing.md)"
}

# ---- ports ----------------------------------------------------------------

# Ports in use on this machine (TCP and UDP, any state, v4 and v6).
used_ports() {
  local f hex
  # (TCP sockets in TIME_WAIT, state 06, hold no port a listener with
  # SO_REUSEADDR cannot take: left out, as a machine churning
  # connections has tens of thousands of them)
  for f in /proc/net/tcp /proc/net/tcp6 /proc/net/udp /proc/net/udp6; do
    [[ -r $f ]] || continue
    awk 'FNR > 1 && $4 != "06" { n = split($2, a, ":"); print a[n] }' "$f"
  done | sort -u | while read -r hex; do
    [[ $hex =~ ^[0-9A-Fa-f]{4}$ ]] && echo $((16#$hex))
  done | sort -un
}

# pick_ports VAR...: assigns each VAR a distinct port that is free for both
# TCP and UDP. Candidates come from below the ephemeral range (so outgoing
# connections do not take them), starting at a point derived from $$.
pick_ports() {
  local used p var tries lo=20000 span=12000
  used=" $(used_ports | tr '\n' ' ') ${IT_PORTS[*]:-} "
  p=$((lo + ($$ * 97 + RANDOM) % span))
  for var in "$@"; do
    for ((tries = 0; tries < span; tries++)); do
      p=$((lo + (p - lo + 1) % span))
      [[ $used == *" $p "* ]] && continue
      break
    done
    used+="$p "
    IT_PORTS+=("$p")
    printf -v "$var" '%s' "$p"
  done
  log "ports: $(for var in "$@"; do printf '%s=%s ' "$var" "${!var}"; done)"
}

# ---- processes ------------------------------------------------------------

# is_alive PID: running (a zombie does not count).
is_alive() {
  local st
  kill -0 "$1" 2>/dev/null || return 1
  st=$(sed -n 's/^.*) \(.\).*/\1/p' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ $st != Z && -n $st ]]
}

# track PID NAME / untrack PID
track() { IT_PIDS[$1]=$2; IT_STARTED[$1]=1; }
untrack() { unset "IT_PIDS[$1]"; }

# wait_exit PID TIMEOUT_S: waits for PID (our child) to exit and reaps it.
# Returns 0 and sets WAIT_RC to its exit status; returns 1 on timeout.
WAIT_RC='' # exit status of the last process wait_exit or stop reaped
wait_exit() {
  local pid=$1 end=$(($(date +%s%N) / 1000000 + ${2:-10} * 1000 * TS))
  while is_alive "$pid"; do
    (($(date +%s%N) / 1000000 < end)) || return 1
    sleep 0.05
  done
  wait "$pid" 2>/dev/null
  WAIT_RC=$?
  untrack "$pid"
  return 0
}

# stop PID [TIMEOUT_S] [SIGNAL]: signals PID and waits; fails the test when it
# does not exit in time. Sets WAIT_RC.
stop() {
  local pid=$1 t=${2:-10} sig=${3:-TERM}
  kill -"$sig" "$pid" 2>/dev/null
  wait_exit "$pid" "$t" || fail "${IT_PIDS[$pid]:-pid $pid} did not exit within $((t * TS))s of SIG$sig"
}

# wait_log FILE PATTERN [TIMEOUT_S] [COUNT] [PID]: waits until FILE holds at
# least COUNT lines with the fixed string PATTERN. Fails when PID (if given)
# dies first or on timeout.
wait_log() {
  local file=$1 pat=$2 t=${3:-10} count=${4:-1} pid=${5:-}
  local end=$(($(date +%s%N) / 1000000 + t * 1000 * TS)) n
  for (( ; ; )); do
    n=$(grep -cF -- "$pat" "$file" 2>/dev/null)
    ((${n:-0} >= count)) && return 0
    if [[ -n $pid ]] && ! is_alive "$pid"; then
      fail "$(basename "$file" .log) exited while we waited for '$pat' in its log"
    fi
    (($(date +%s%N) / 1000000 < end)) ||
      fail "timed out after $((t * TS))s waiting for '$pat' (x$count) in $(basename "$file")"
    sleep 0.05
  done
}

# start_agent [OPTION...]: starts lynx-agent on 127.0.0.1:$AGENT_PORT with
# node id $IT_NODE, 2 CPU accelerators x 4 mqueues of sockperf-echo (extra
# options are appended; do not repeat these). Waits until it serves unless
# NOWAIT=1. Sets AGENT_PID and AGENT_LOG.
AGENT_PID='' AGENT_LOG=''
start_agent() {
  local -a base=(--listen "127.0.0.1:$AGENT_PORT" --node-id "$IT_NODE")
  local have_accels=0 have_mq=0 have_app=0 have_transport=0 a
  for a in "$@"; do
    case $a in
    --cpu-accels) have_accels=1 ;; --mqueues) have_mq=1 ;; --app) have_app=1 ;;
    --transport) have_transport=1 ;;
    esac
  done
  ((have_accels)) || base+=(--cpu-accels 2)
  ((have_transport)) || base+=(--transport "$IT_TRANSPORT")
  ((have_mq)) || base+=(--mqueues 4)
  ((have_app)) || base+=(--app sockperf-echo)
  spawn_daemon lynx-agent agent "" "${base[@]}" "$@"
  AGENT_PID=$SPAWN_PID AGENT_LOG=$SPAWN_LOG
  [[ ${NOWAIT:-0} == 1 ]] ||
    wait_log "$AGENT_LOG" "serving descriptors on" 10 1 "$AGENT_PID"
}

# start_frontend [OPTION...]: starts lynx-frontend for the agent on
# $AGENT_PORT, serving UDP 127.0.0.1:$UDP_PORT and metrics on
# 127.0.0.1:$METRICS_PORT. Waits for "serving UDP" unless NOWAIT=1. Sets
# FRONTEND_PID and FRONTEND_LOG.
FRONTEND_PID='' FRONTEND_LOG=''
start_frontend() {
  local -a base=(--agent "127.0.0.1:$AGENT_PORT" --udp "127.0.0.1:$UDP_PORT"
    --metrics "127.0.0.1:$METRICS_PORT")
  spawn_daemon lynx-frontend frontend "" "${base[@]}" "$@"
  FRONTEND_PID=$SPAWN_PID FRONTEND_LOG=$SPAWN_LOG
  [[ ${NOWAIT:-0} == 1 ]] ||
    wait_log "$FRONTEND_LOG" "serving UDP" 10 1 "$FRONTEND_PID"
}

# spawn_daemon PROG STEM SUFFIX ARGS...: starts build/bin/PROG in the
# background with its log in $IT_DIR/STEM.<seq>.log, tracked for cleanup.
# Sets SPAWN_PID and SPAWN_LOG. With the array SPAWN_WRAP set, PROG runs
# under it (e.g. SPAWN_WRAP=(faketime -f -1d)); it must exec PROG, so that
# SPAWN_PID is PROG's.
SPAWN_WRAP=()
spawn_daemon() {
  local prog=$1 stem=$2 suffix=$3
  shift 3
  IT_SEQ=$((IT_SEQ + 1))
  SPAWN_LOG=$IT_DIR/$stem.$IT_SEQ.log
  ${SPAWN_WRAP[@]+"${SPAWN_WRAP[@]}"} "$LYNX_BIN_DIR/$prog" "$@" >"$SPAWN_LOG" 2>&1 </dev/null &
  SPAWN_PID=$!
  track "$SPAWN_PID" "$prog#$IT_SEQ$suffix"
  log "started $prog#$IT_SEQ$suffix pid $SPAWN_PID: $*"
}

# agent_shm PID: region files of agent PID of this test.
agent_shm() {
  compgen -G "/dev/shm/lynx-$IT_NODE-$1-*" || true
}

# stop_daemons: SIGTERM the frontend and the agent started last; both must
# exit 0, and the agent must leave no shared-memory region behind.
stop_daemons() {
  local apid=$AGENT_PID
  stop "$FRONTEND_PID" 10
  assert_eq "$WAIT_RC" 0 "frontend exit status on SIGTERM"
  stop "$AGENT_PID" 10
  assert_eq "$WAIT_RC" 0 "agent exit status on SIGTERM"
  [[ -z $(agent_shm "$apid") ]] || fail "agent $apid left $(agent_shm "$apid")"
}

# kill9 PID: SIGKILL an agent on purpose; its region files are expected to
# stay behind (the next agent, or the cleanup, removes them).
kill9() {
  IT_KILLED9[$1]=1
  log "SIGKILL to ${IT_PIDS[$1]:-pid $1}"
  { kill -KILL "$1" && wait "$1"; } 2>/dev/null # (no "Killed" job notice)
  is_alive "$1" && fail "pid $1 survived SIGKILL"
  untrack "$1"
}

# ---- metrics --------------------------------------------------------------

# metric NAME [LABELMATCH]: sums the samples of NAME (exact metric name)
# whose label set contains LABELMATCH (a substring such as 'reason="lost"' or
# 'accel="0",mqueue="1"'). Scrapes 127.0.0.1:$METRICS_PORT, or reads the
# file $METRICS_FROM when set. Prints the sum; returns 1 (and prints a
# reason on stderr) when the scrape fails or no sample matches.
metric() {
  local name=$1 match=${2:-} text
  if [[ -n ${METRICS_FROM:-} ]]; then
    text=$(<"$METRICS_FROM") || return 1
  else
    text=$(curl -sf --max-time 5 "http://127.0.0.1:$METRICS_PORT/metrics") || {
      echo "metric: cannot scrape 127.0.0.1:$METRICS_PORT/metrics" >&2
      return 1
    }
  fi
  awk -v name="$name" -v match_="$match" '
    /^#/ { next }
    {
      key = $1; val = $NF
      series = key; labels = ""
      i = index(key, "{")
      if (i) { series = substr(key, 1, i - 1); labels = substr(key, i) }
      if (series != name) next
      if (match_ != "" && index(labels, match_) == 0) next
      sum += val; n++
    }
    END {
      if (!n) { printf "metric: no sample of %s%s\n", name,
                  (match_ != "" ? " matching " match_ : "") > "/dev/stderr"; exit 1 }
      printf "%.0f\n", sum
    }' <<<"$text"
}

# scrape FILE [URL]: saves one scrape of URL (default: the frontend's,
# 127.0.0.1:$METRICS_PORT) (for consistent multi-metric assertions:
# METRICS_FROM=FILE metric ...).
scrape() {
  local url=${2:-http://127.0.0.1:$METRICS_PORT/metrics}
  curl -sf --max-time 5 "$url" >"$1" || fail "cannot scrape $url"
}

# scrape_stable FILE [TIMEOUT_S] [URL]: scrapes URL (scrape's) until two
# scrapes 300 ms apart (longer than the agent's 250 ms sampling of its
# accelerators) agree: nothing in flight any more; at most TIMEOUT_S
# (default 5, times the time scale). The adaptive poller's own timer wake-ups
# (lynx_frontend_sleeps_total{woken_by="timer"}) count on while the
# frontend is idle: left out of the comparison. Past the timeout the test
# fails, naming what still moved (a counter that moves on its own makes
# every later comparison of counts a race).
scrape_stable() {
  local t=${2:-5} end
  end=$(($(now_ms) + $(ts_ms $((t * 1000)))))
  local quiet='woken_by="timer"'
  scrape "$1" "${3:-}"
  for (( ; ; )); do
    sleep 0.3
    scrape "$1.next" "${3:-}"
    if cmp -s <(grep -vF "$quiet" "$1") <(grep -vF "$quiet" "$1.next"); then
      rm -f "$1.next"
      return 0
    fi
    if (($(now_ms) >= end)); then
      diff <(grep -vF "$quiet" "$1") <(grep -vF "$quiet" "$1.next") | head -20 >&2
      fail "metrics still moving after $(ts_ms $((t * 1000))) ms (above: what moved)"
    fi
    mv -f "$1.next" "$1"
  done
}

# wait_metric NAME LABELMATCH MIN TIMEOUT_S: waits until the metric is >= MIN.
wait_metric() {
  local end=$(($(now_ms) + $4 * 1000 * TS)) v
  for (( ; ; )); do
    v=$(metric "$1" "$2" 2>/dev/null)
    is_uint "$v" && ((v >= $3)) && return 0
    (($(now_ms) < end)) || fail "timed out after $(($4 * TS))s waiting for $1{$2} >= $3 (last: ${v:-none})"
    sleep 0.05
  done
}

# ---- the fuzz tool as a quick probe -----------------------------------------

LYNX_UDP_FUZZ=${LYNX_UDP_FUZZ:-$LYNX_BIN_DIR/lynx-udp-fuzz}

# summary_vars FILE TAG FIRST_KEY PREFIX: a tool's one-line summary
# ("TAG: FIRST_KEY=v k2=v2 ...") in FILE: sets PREFIX<key> for every
# key=value, and SUMMARY to the line without its tag.
SUMMARY=''
summary_vars() {
  local line kv
  line=$(grep -m1 "^$2: $3=" "$1") || { cat "$1"; fail "no summary line from $2"; }
  SUMMARY=${line#"$2": }
  for kv in $SUMMARY; do
    [[ $kv == *=* ]] && printf -v "$4${kv%%=*}" '%s' "${kv#*=}"
  done
}

# fuzz_summary FILE: sets FZ_<key> for every key=value of the summary line.
fuzz_summary() { summary_vars "$1" udp_fuzz sent FZ_; }

# probe_udp WHAT [SEED] [COUNT]: the service on $UDP_PORT answers: COUNT
# datagrams that fit a slot (lynx-udp-fuzz --max-size 2032), every expected
# reply arrives and is byte-exact.
probe_udp() {
  local what=$1 seed=${2:-7} count=${3:-300} out rc
  [[ -x $LYNX_UDP_FUZZ ]] || fail "$LYNX_UDP_FUZZ is missing: build first (make)"
  IT_SEQ=$((IT_SEQ + 1))
  out=$IT_DIR/probe.$IT_SEQ.out
  timeout -k 2 "$(ts_s 30)" "$LYNX_UDP_FUZZ" --port "$UDP_PORT" --count "$count" \
    --seed "$seed" --max-size 2032 --drain-ms 2000 >"$out" 2>&1 </dev/null
  rc=$?
  fuzz_summary "$out"
  log "probe ($what): $(grep -m1 '^udp_fuzz: sent=' "$out")"
  assert_eq "$rc" 0 "$what: lynx-udp-fuzz exit status (byte-exact replies)"
  assert_gt "$FZ_expected_replies" 0 "$what: replies expected"
  assert_eq "$FZ_received_replies" "$FZ_expected_replies" "$what: replies received"
}

# lenet_load OUT ARGS...: lynx-lenet-load against $UDP_PORT with the test
# set in $DATA and the reference $REF, every answer checked (its exit
# status must be 0); its summary in L_* (summary_vars) and logged.
lenet_load() {
  local out=$1 rc
  shift
  timeout -k 5 "$(ts_s 90)" "$LYNX_BIN_DIR/lynx-lenet-load" --target "127.0.0.1:$UDP_PORT" \
    --data "$DATA" --ref "$REF" --timeout-ms 3000 "$@" >"$out" 2>&1
  rc=$?
  cat "$out" >&2
  assert_eq "$rc" 0 "lynx-lenet-load exit status (no wrong or malformed answer)"
  summary_vars "$out" lenet_load sent L_
  log "$SUMMARY"
}

# ---- sockperf -------------------------------------------------------------

# run_sockperf OUT ARGS...: runs sockperf (bounded by timeout) with its output
# in OUT; fails the test when it does not exit 0.
run_sockperf() {
  local out=$1 rc
  shift
  log "sockperf $*"
  timeout -k 3 "$(ts_s 40)" sockperf "$@" >"$out" 2>&1 </dev/null
  rc=$?
  ((rc == 0)) || { cat "$out"; fail "sockperf $* exited $rc"; }
}

# sockperf_stats OUT: sets SP_SENT SP_RCVD (total run), SP_VSENT SP_VRCVD
# (valid duration), SP_DROP SP_DUP SP_OOO. Fails when a line is missing.
sockperf_stats() {
  local clean line re
  clean=$(sed 's/\x1b\[[0-9;]*m//g' "$1")
  if grep -q 'No messages were received' <<<"$clean"; then
    echo "$clean"
    it_check_failed "sockperf ($(basename "$1")): no messages were received from the server"
    SP_SENT=0 SP_RCVD=0 SP_VSENT=0 SP_VRCVD=0 SP_DROP=0 SP_DUP=0 SP_OOO=0
    return 1
  fi
  re='\[Total Run\][^;]*;[^;]*;[[:space:]]*SentMessages=([0-9]+);[[:space:]]*ReceivedMessages=([0-9]+)'
  line=$(grep -m1 'Total Run' <<<"$clean")
  [[ $line =~ $re ]] || { echo "$clean"; fail "no '[Total Run]' line in sockperf's output"; }
  SP_SENT=${BASH_REMATCH[1]} SP_RCVD=${BASH_REMATCH[2]}
  re='\[Valid Duration\][^;]*;[[:space:]]*SentMessages=([0-9]+);[[:space:]]*ReceivedMessages=([0-9]+)'
  line=$(grep -m1 'Valid Duration' <<<"$clean")
  [[ $line =~ $re ]] || { echo "$clean"; fail "no '[Valid Duration]' line in sockperf's output"; }
  SP_VSENT=${BASH_REMATCH[1]} SP_VRCVD=${BASH_REMATCH[2]}
  re='#[[:space:]]*dropped messages[[:space:]]*=[[:space:]]*([0-9]+);[[:space:]]*#[[:space:]]*duplicated messages[[:space:]]*=[[:space:]]*([0-9]+);[[:space:]]*#[[:space:]]*out-of-order messages[[:space:]]*=[[:space:]]*([0-9]+)'
  line=$(grep -m1 'dropped messages' <<<"$clean")
  [[ $line =~ $re ]] || { echo "$clean"; fail "no '# dropped messages = N; # duplicated messages = N; # out-of-order messages = N' line in sockperf's output"; }
  SP_DROP=${BASH_REMATCH[1]} SP_DUP=${BASH_REMATCH[2]} SP_OOO=${BASH_REMATCH[3]}
  log "sockperf: sent $SP_SENT received $SP_RCVD (valid: $SP_VSENT/$SP_VRCVD), dropped $SP_DROP duplicated $SP_DUP out-of-order $SP_OOO"
}

# check_sockperf OUT: messages were received, none dropped, duplicated or
# out of order.
check_sockperf() {
  local what
  what="sockperf ($(basename "$1"))"
  sockperf_stats "$1" || return 1
  assert_gt "$SP_RCVD" 0 "$what: messages received"
  assert_gt "$SP_VRCVD" 0 "$what: messages received in the valid duration"
  assert_eq "$SP_DROP" 0 "$what: dropped messages"
  assert_eq "$SP_DUP" 0 "$what: duplicated messages"
  assert_eq "$SP_OOO" 0 "$what: out-of-order messages"
}

# pingpong NAME [SECONDS]: sockperf ping-pong of 64-byte messages for
# SECONDS (1) to the frontend's UDP service on 127.0.0.1:$UDP_PORT, judged
# by check_sockperf (output in $IT_DIR/pingpong-NAME.out).
pingpong() {
  local out=$IT_DIR/pingpong-$1.out
  run_sockperf "$out" ping-pong -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t "${2:-1}"
  check_sockperf "$out"
}

# sockperf_base: the frontend's counters before a sockperf run that
# check_sockperf_served judges (sets SPB_RCV, SPB_RESP, SPB_DROP).
sockperf_base() {
  SPB_RCV=$(metric lynx_frontend_received_total) || fail "cannot read received_total"
  SPB_RESP=$(metric lynx_frontend_responded_total) || fail "cannot read responded_total"
  SPB_DROP=$(metric lynx_frontend_dropped_total) || fail "cannot read dropped_total"
}

# underload_start OUT SECONDS [HOST]: sockperf_base, then sockperf
# under-load at 2000 msg/s (every message answered) to HOST (127.0.0.1)
# in the background, for check_sockperf_served OUT; sets UNDERLOAD_PID.
underload_start() {
  sockperf_base
  sockperf under-load -i "${3:-127.0.0.1}" -p "$UDP_PORT" -m 64 -t "$2" --mps 2000 \
    --reply-every 1 --buffer-size 4194304 >"$1" 2>&1 </dev/null &
  UNDERLOAD_PID=$!
}

# check_no_drops WHO: the frontend on $METRICS_PORT dropped nothing as
# lost, expired, in doubt or fenced.
check_no_drops() {
  local r v
  for r in lost expired in_doubt fenced; do
    v=$(metric lynx_frontend_dropped_total "reason=\"$r\"") || v=0
    assert_eq "$v" 0 "requests $1 dropped as $r"
  done
}

# check_sockperf_served OUT: an under-load run judged by what the frontend
# did since sockperf_base: it answered every request it received, dropped
# none, and sockperf got answers, none duplicated or out of order. Replies
# sockperf counts dropped are then late (a loaded machine runs sockperf's
# reader after its run ended) or lost in its own socket: the scheduler's
# doing, logged but not failed.
check_sockperf_served() {
  local what rcv resp drop end
  what="sockperf ($(basename "$1"))"
  sockperf_stats "$1" || return 1
  assert_gt "$SP_RCVD" 0 "$what: messages received"
  assert_eq "$SP_DUP" 0 "$what: duplicated messages"
  assert_eq "$SP_OOO" 0 "$what: out-of-order messages"
  end=$(($(now_ms) + $(ts_ms 10000)))
  for (( ; ; )); do # answers still in flight at the end of the run
    rcv=$(metric lynx_frontend_received_total) || fail "cannot read received_total"
    resp=$(metric lynx_frontend_responded_total) || fail "cannot read responded_total"
    ((resp - SPB_RESP >= rcv - SPB_RCV)) && break
    (($(now_ms) < end)) || break
    sleep 0.05
  done
  drop=$(metric lynx_frontend_dropped_total) || fail "cannot read dropped_total"
  assert_eq $((drop - SPB_DROP)) 0 "$what: requests the frontend dropped"
  assert_eq $((resp - SPB_RESP)) $((rcv - SPB_RCV)) "$what: requests the frontend answered (of those it received)"
  assert_ge $((resp - SPB_RESP)) "$SP_RCVD" "$what: answers sent (at least those sockperf got)"
  ((SP_DROP == 0)) ||
    log "note: sockperf counted $SP_DROP answers dropped; the frontend answered all $((rcv - SPB_RCV)) requests it received, so they were late or lost at sockperf's socket"
}

# ---- coordinator mode ---------------------------------------------------------
#
#   pick_ports COORD_PORT API_PORT METRICS_PORT UDP_PORT
#   start_coordinator --lease-ms 1000      # waits until it serves control + API
#   node_ids N1 N2                         # N1=<IT_NODE>n1 ...
#   start_node_agent "$N1"                 # waits for "registered with coordinator"
#   start_coord_frontend                   # waits for its first "table N applied"
#   api POST /v1/services -d '{...}'       # sets API_STATUS, API_BODY (a file)
#   wait_node_state "$N1" down 3000        # sets WAITED_MS
#
# Node ids of these agents are $IT_NODE followed by a suffix; node_ids
# records them in IT_NODES so that the cleanup checks their
# /dev/shm/lynx-<node>-* region files as it does $IT_NODE's.

declare -a IT_NODES=() # node ids besides $IT_NODE whose region files are checked

# node_ids VAR...: assigns each VAR a node id of this test, "<IT_NODE>n<i>"
# (i counts from 1 over the calls; ids may not contain '-'), and records it.
node_ids() {
  local var
  for var in "$@"; do
    IT_NODES+=("${IT_NODE}n$((${#IT_NODES[@]} + 1))")
    printf -v "$var" '%s' "${IT_NODES[-1]}"
  done
}

# node_shm NODE [PID]: region files of node NODE (of agent PID only if given).
node_shm() {
  compgen -G "/dev/shm/lynx-$1-${2:-*}-*" || true
}

# it_require_coord: the coordinator and lynxctl are built, jq is installed.
it_require_coord() {
  local b
  for b in lynx-coordinator lynxctl; do
    [[ -x $LYNX_BIN_DIR/$b ]] || fail "$LYNX_BIN_DIR/$b is missing: build first (make)"
  done
  it_require jq curl
}

# run_in_session OUT SCRIPT ARG...: bash SCRIPT ARG... in a session of its
# own (its pid is its process group, for a terminal's Ctrl-C: kill -INT
# -- -PID), with SIGINT at its default (a background job of a script would
# inherit it ignored), its output in OUT; tracked for cleanup. Sets
# RUN_PID. The environment passes through.
run_in_session() {
  local out=$1
  shift
  python3 -c '
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
os.setsid()
os.execvp("bash", ["bash"] + sys.argv[1:])' "$@" >"$out" 2>&1 </dev/null &
  RUN_PID=$!
  track "$RUN_PID" "$(basename "$1")"
}

# start_etcd [NAME]: a single-member etcd (Debian's etcd-server) on free
# loopback ports, its data in $IT_DIR/etcd-NAME (NAME: e1), tracked for
# cleanup. Waits until it answers. Sets ETCD_URL and ETCD_PID. Callers
# it_require etcd first.
ETCD_URL='' ETCD_PID=''
start_etcd() {
  local name=${1:-e1} cport pport end
  pick_ports cport pport
  ETCD_URL=http://127.0.0.1:$cport
  etcd --name "$name" --data-dir "$IT_DIR/etcd-$name" \
    --listen-client-urls "$ETCD_URL" --advertise-client-urls "$ETCD_URL" \
    --listen-peer-urls "http://127.0.0.1:$pport" \
    --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
    --initial-cluster "$name=http://127.0.0.1:$pport" \
    >"$IT_DIR/etcd-$name.log" 2>&1 </dev/null &
  ETCD_PID=$!
  track "$ETCD_PID" "etcd($name)"
  log "started etcd($name) pid $ETCD_PID on $ETCD_URL"
  end=$(($(now_ms) + $(ts_ms 10000)))
  until ETCDCTL_API=3 etcdctl --endpoints "$ETCD_URL" --command-timeout=1s \
    endpoint health >/dev/null 2>&1; do
    (($(now_ms) < end)) || fail "etcd($name) did not serve within 10 s: $(tail -3 "$IT_DIR/etcd-$name.log")"
    is_alive "$ETCD_PID" || fail "etcd($name) exited: $(tail -3 "$IT_DIR/etcd-$name.log")"
    sleep 0.1
  done
}

# etcd_get KEY: the value etcd holds under KEY ("" when none).
etcd_get() {
  ETCDCTL_API=3 etcdctl --endpoints "$ETCD_URL" --command-timeout=2s get \
    --print-value-only "$1"
}

# The API's scheme, and the CA to trust it with: a test of the API over
# HTTPS (tls.sh) sets API_SCHEME=https and API_CACERT=FILE before
# start_coordinator; api, ctl and the /readyz wait follow them.
API_SCHEME=http API_CACERT=''
# api_url: where the coordinator's API is.
api_url() { echo "$API_SCHEME://127.0.0.1:$API_PORT"; }

# start_coordinator [OPTION...]: lynx-coordinator with control on
# 127.0.0.1:$COORD_PORT, the API on 127.0.0.1:$API_PORT and its state in
# $COORD_STATE (default $IT_DIR/state; kept across restarts). Waits for the
# API's /readyz unless NOWAIT=1. Sets COORD_PID and COORD_LOG.
COORD_PID='' COORD_LOG='' COORD_STATE=''
start_coordinator() {
  COORD_STATE=${COORD_STATE:-$IT_DIR/state}
  local -a base=(--listen "127.0.0.1:$COORD_PORT" --http "127.0.0.1:$API_PORT"
    --state-dir "$COORD_STATE")
  local end
  spawn_daemon lynx-coordinator coordinator "" "${base[@]}" "$@"
  COORD_PID=$SPAWN_PID COORD_LOG=$SPAWN_LOG
  [[ ${NOWAIT:-0} == 1 ]] && return 0
  wait_log "$COORD_LOG" "serving control on" 10 1 "$COORD_PID"
  end=$(($(now_ms) + $(ts_ms 5000)))
  until curl -sf --max-time 2 ${API_CACERT:+--cacert "$API_CACERT"} \
    "$(api_url)/readyz" >/dev/null 2>&1; do
    is_alive "$COORD_PID" || fail "lynx-coordinator#$IT_SEQ exited before it was ready"
    (($(now_ms) < end)) || fail "lynx-coordinator#$IT_SEQ: /readyz not 200 within 5 s"
    sleep 0.05
  done
}

# assert_never_fenced LOG WHEN: the agent logging to LOG never fenced
# itself (agent/link.c logs when its lease fence passes); WHEN says during
# what, in the message.
assert_never_fenced() {
  if grep -qF "no heartbeat answered within the lease" "$1"; then
    it_check_failed "the agent fenced itself $2: $(grep -F "no heartbeat answered" "$1" | head -2)"
    return 1
  fi
  log "ok: the agent never fenced itself $2"
}

# start_coord_as X CTL API OPTION...: one of several coordinators (on
# etcd: the options say which), named X, with control on 127.0.0.1:CTL and
# the API on 127.0.0.1:API; waits until it serves control. Sets PID_X and
# LOG_X.
start_coord_as() {
  local x=$1 ctl=$2 api=$3
  shift 3
  spawn_daemon lynx-coordinator "coord-$x" "($x)" --listen "127.0.0.1:$ctl" \
    --http "127.0.0.1:$api" "$@"
  printf -v "PID_$x" '%s' "$SPAWN_PID"
  printf -v "LOG_$x" '%s' "$SPAWN_LOG"
  wait_log "$SPAWN_LOG" "serving control on" 10 1 "$SPAWN_PID"
}

# coord_role API_PORT: "leader", "follower" or "" (not answering)
coord_role() {
  curl -sf --max-time 1 "http://127.0.0.1:$1/readyz" | jq -r '.role // ""' 2>/dev/null
}

# wait_role API_PORT ROLE TIMEOUT_MS: until the coordinator on API_PORT has
# ROLE; sets WAITED_MS. Returns 1 (no failure) on timeout.
wait_role() {
  local t0 end
  t0=$(now_ms) end=$(($(now_ms) + $3 * TS))
  until [[ $(coord_role "$1") == "$2" ]]; do
    (($(now_ms) < end)) || return 1
    sleep 0.05
  done
  WAITED_MS=$(($(now_ms) - t0))
}

# start_node_agent NODE [OPTION...]: lynx-agent in coordinator mode for node
# NODE with 2 CPU accelerators (unless --cpu-accels is given). Waits for
# "registered with coordinator" unless NOWAIT=1. Sets AGENT_PID, AGENT_LOG.
start_node_agent() {
  local node=$1 a have_accels=0 have_transport=0
  shift
  local -a base=(--coordinator "127.0.0.1:$COORD_PORT" --node-id "$node")
  for a in "$@"; do
    [[ $a == --cpu-accels ]] && have_accels=1
    [[ $a == --transport ]] && have_transport=1
  done
  ((have_accels)) || base+=(--cpu-accels 2)
  ((have_transport)) || base+=(--transport "$IT_TRANSPORT")
  spawn_daemon lynx-agent "agent-$node" "($node)" "${base[@]}" "$@"
  AGENT_PID=$SPAWN_PID AGENT_LOG=$SPAWN_LOG
  [[ ${NOWAIT:-0} == 1 ]] ||
    wait_log "$AGENT_LOG" "registered with coordinator" 10 1 "$AGENT_PID"
}

# start_coord_frontend [OPTION...]: lynx-frontend in coordinator mode, its
# services bound on 127.0.0.1, metrics on 127.0.0.1:$METRICS_PORT. Waits for
# its first "table N applied" unless NOWAIT=1. Sets FRONTEND_PID, FRONTEND_LOG.
start_coord_frontend() {
  local -a base=(--coordinator "127.0.0.1:$COORD_PORT" --bind 127.0.0.1
    --metrics "127.0.0.1:$METRICS_PORT")
  spawn_daemon lynx-frontend frontend "" "${base[@]}" "$@"
  FRONTEND_PID=$SPAWN_PID FRONTEND_LOG=$SPAWN_LOG
  [[ ${NOWAIT:-0} == 1 ]] ||
    wait_log "$FRONTEND_LOG" " applied" 10 1 "$FRONTEND_PID"
}

# api METHOD PATH [CURL_ARG...]: one call to the coordinator's API on
# $API_PORT. Sets API_STATUS (000 when nothing answered), API_BODY and
# API_HEADERS (files holding the last answer). Returns 0 when it answered.
API_STATUS='' API_BODY='' API_HEADERS=''
api() {
  local method=$1 path=$2
  shift 2
  API_BODY=$IT_DIR/api-body.out API_HEADERS=$IT_DIR/api-headers.out
  API_STATUS=$(curl -s --max-time 10 -X "$method" -o "$API_BODY" -D "$API_HEADERS" \
    -w '%{http_code}' ${API_CACERT:+--cacert "$API_CACERT"} "$@" \
    "$(api_url)$path" 2>/dev/null)
  [[ -n $API_STATUS && $API_STATUS != 000 ]]
}

# api_json PATH JQ_FILTER: GET PATH (must be 200), then jq -r FILTER on it.
api_json() {
  api GET "$1" || { it_check_failed "GET $1: the coordinator did not answer"; return 1; }
  [[ $API_STATUS == 200 ]] || { it_check_failed "GET $1: HTTP $API_STATUS: $(head -c 300 "$API_BODY")"; return 1; }
  jq -r "$2" "$API_BODY"
}

# svc NAME JQ_FILTER: service NAME's JSON (GET /v1/services/NAME), filtered.
svc() { api_json "/v1/services/$1" "$2"; }

# wait_svc NAME JQ_TEST TIMEOUT_S: until service NAME's JSON passes JQ_TEST
# (a failed check after TIMEOUT_S, returning 1).
wait_svc() {
  local end=$(($(now_ms) + $(ts_s "$3") * 1000))
  until [[ $(svc "$1" "$2") == true ]]; do
    (($(now_ms) < end)) || { it_check_failed "service $1: not ($2) after $3 s: $(svc "$1" '.state + ": " + .reason')"; return 1; }
    sleep 0.1
  done
}

# serve_service NAME JSON_FIELDS: creates service NAME through the API
# ({"name": NAME, JSON_FIELDS}; must answer 201) and waits until the
# frontend started last serves it.
serve_service() {
  api POST /v1/services -d "{\"name\":\"$1\",$2}"
  [[ $API_STATUS == 201 ]] || fail "POST /v1/services ($1): HTTP $API_STATUS: $(cat "$API_BODY")"
  wait_log "$FRONTEND_LOG" "serving service $1" 5 1 "$FRONTEND_PID"
}

# ctl [ARG...]: lynxctl against the coordinator on $API_PORT.
ctl() {
  "$LYNX_BIN_DIR/lynxctl" --api "$(api_url)" ${API_CACERT:+--cacert "$API_CACERT"} "$@"
}

# node_state NODE: the node's state from lynxctl nodes --json ("" when the
# node is not listed or the coordinator does not answer).
node_state() {
  ctl nodes --json 2>/dev/null |
    jq -r --arg n "$1" '.items[] | select(.id == $n) | .state' 2>/dev/null
}

# wait_node_state NODE STATE TIMEOUT_MS: polls until NODE is in STATE. Sets
# WAITED_MS (from the call). Returns 1 (no failure) on timeout, with the last
# state seen in NODE_STATE.
WAITED_MS='' NODE_STATE=''
wait_node_state() {
  local t0 end
  t0=$(now_ms)
  end=$((t0 + $3 * TS))
  for (( ; ; )); do
    NODE_STATE=$(node_state "$1")
    WAITED_MS=$(($(now_ms) - t0))
    [[ $NODE_STATE == "$2" ]] && return 0
    (($(now_ms) < end)) || return 1
    sleep 0.02
  done
}

# accel_requests: "id requests" per accelerator, from lynxctl accelerators --json.
accel_requests() {
  ctl accelerators --json | jq -r '.items[] | "\(.id) \(.requests)"'
}
# wait_requests_grow TIMEOUT_S ID=BASE...: until every accelerator ID reports
# more than BASE requests in accel_requests (heartbeats come every lease/3);
# 1 (each laggard recorded as a failure) after TIMEOUT_S.
wait_requests_grow() {
  local t=$1 end kv id base v ok
  local -A cur=()
  shift
  end=$(($(now_ms) + t * 1000 * TS))
  for (( ; ; )); do
    ok=1
    cur=()
    while read -r id v; do cur[$id]=$v; done < <(accel_requests || true)
    for kv in "$@"; do
      id=${kv%=*} base=${kv#*=}
      v=${cur[$id]:-}
      if ! is_uint "$v" || ((v <= base)); then ok=0; fi
    done
    if ((ok)); then
      for kv in "$@"; do
        log "ok: accelerator ${kv%=*}: requests ${cur[${kv%=*}]} (> ${kv#*=})"
      done
      return 0
    fi
    if (($(now_ms) >= end)); then
      for kv in "$@"; do
        id=${kv%=*} base=${kv#*=}
        v=${cur[$id]:-none}
        if ! is_uint "$v" || ((v <= base)); then
          it_check_failed "accelerator $id: requests $v after $((t * TS))s of waiting, want > $base"
        fi
      done
      return 1
    fi
    sleep 0.1
  done
}

# json_error_check WHAT STATUS CODE MESSAGE_PART: the last api answer has HTTP
# STATUS, is application/json, and is {"error":{"code":CODE,"message":...}}
# with MESSAGE_PART (a fixed string, may be empty) in the message.
json_error_check() {
  local what=$1 status=$2 code=$3 part=$4 got_code msg ctype
  [[ $API_STATUS == "$status" ]] ||
    { it_check_failed "$what: HTTP $API_STATUS, want $status ($(head -c 300 "$API_BODY"))"; return 1; }
  ctype=$(grep -i '^content-type:' "$API_HEADERS" | tr -d '\r')
  [[ $ctype == *application/json* ]] ||
    { it_check_failed "$what: Content-Type '$ctype', want application/json"; return 1; }
  got_code=$(jq -r '.error.code // empty' "$API_BODY" 2>/dev/null)
  msg=$(jq -r '.error.message // empty' "$API_BODY" 2>/dev/null)
  [[ $got_code == "$code" ]] ||
    { it_check_failed "$what: error code '$got_code', want '$code' ($(head -c 300 "$API_BODY"))"; return 1; }
  [[ -n $msg && $msg == *"$part"* ]] ||
    { it_check_failed "$what: error message '$msg' does not name '$part'"; return 1; }
  log "ok: $what: $status $code: $msg"
}

# ---- raw control connections ---------------------------------------------------
#
# Hand-made protobuf for the control port: pb_* print bytes as \xHH escapes
# (for printf %b), so their lengths are ${#s}/4.

pb_varint() {
  local v=$1 out=''
  while ((v >= 128)); do
    printf -v out '%s\\x%02x' "$out" $(((v & 127) | 128))
    v=$((v >> 7))
  done
  printf '%s\\x%02x' "$out" "$v"
}
# pb_text TEXT: TEXT's bytes as escapes
pb_text() {
  local s=$1 i out='' LC_ALL=C
  for ((i = 0; i < ${#s}; i++)); do
    printf -v out '%s\\x%02x' "$out" "'${s:i:1}"
  done
  printf '%s' "$out"
}
# pb_uint FIELD VALUE / pb_bytes FIELD ESCAPED / pb_string FIELD TEXT
pb_uint() { pb_varint $(($1 << 3)); pb_varint "$2"; }
pb_bytes() { pb_varint $((($1 << 3) | 2)); pb_varint $((${#2} / 4)); printf '%s' "$2"; }
pb_string() { pb_bytes "$1" "$(pb_text "$2")"; }
# pb_frame ESCAPED: a control frame (4-byte big-endian length, then the bytes)
pb_frame() {
  local n=$((${#1} / 4))
  printf '\\x%02x\\x%02x\\x%02x\\x%02x%s' $((n >> 24 & 255)) $((n >> 16 & 255)) \
    $((n >> 8 & 255)) $((n & 255)) "$1"
}
# pb_hello ROLE ID [TOKEN] [VERSION]: an Envelope holding a Hello
pb_hello() {
  local body
  body="$(pb_uint 1 "${4:-1}")$(pb_string 2 "$1")$(pb_string 3 "$2")"
  [[ -n ${3:-} ]] && body+=$(pb_string 4 "$3")
  pb_bytes 1 "$body"
}

# ctl_open PORT: a TCP connection to 127.0.0.1:PORT on fd CTL_FD; CTL_LPORT is
# its local port (how the peer names it in its log).
CTL_FD='' CTL_LPORT=''
ctl_open() {
  local ino hex
  exec {CTL_FD}<>"/dev/tcp/127.0.0.1/$1" || fail "cannot connect to 127.0.0.1:$1"
  ino=$(readlink "/proc/$BASHPID/fd/$CTL_FD")
  ino=${ino#socket:[}
  ino=${ino%]}
  hex=$(awk -v ino="$ino" '$10 == ino { split($2, a, ":"); print a[2]; exit }' /proc/net/tcp)
  [[ -n $hex ]] || fail "cannot find the local port of our connection to 127.0.0.1:$1"
  CTL_LPORT=$((16#$hex))
}
# ctl_write ESCAPED: writes bytes (printf %b) on CTL_FD; errors (a peer that
# closed already) are ignored.
ctl_write() { { printf '%b' "$1" >&"$CTL_FD"; } 2>/dev/null; }
# ctl_write_file FILE
ctl_write_file() { { cat "$1" >&"$CTL_FD"; } 2>/dev/null; }
# ctl_read_until_close OUT TIMEOUT_S: reads what the peer sends into OUT until
# it closes the connection. 0 when it closed in time, 1 when it kept it open.
ctl_read_until_close() {
  timeout "$2" cat <&"$CTL_FD" >"$1" 2>/dev/null
  (($? != 124))
}
# ctl_close: closes CTL_FD.
ctl_close() { [[ -n $CTL_FD ]] && exec {CTL_FD}>&-; CTL_FD=''; }

# ---- cleanup ----------------------------------------------------------------

it_print_logs() {
  local f
  for f in "$IT_DIR"/*; do
    [[ -f $f ]] || continue
    echo "----- $(basename "$f") -----"
    case $(basename "$f") in
    metrics*) grep -v -e '^#' -e ' 0$' "$f" ;; # the non-zero samples
    *) tail -n 300 "$f" ;;
    esac
  done
  echo "----- end of logs -----"
}

it_cleanup() {
  local rc=$? pid f bad=0 deadline name apid node
  ((IT_CLEANED)) && return
  IT_CLEANED=1
  set +e
  trap - INT TERM
  if ((rc != 0 && rc != 77)) && [[ -n ${METRICS_PORT:-} && -n $IT_DIR ]]; then
    # what the frontend counted when the test failed (non-zero samples)
    curl -sf --max-time 2 "http://127.0.0.1:$METRICS_PORT/metrics" 2>/dev/null |
      grep -v -e '^#' -e ' 0$' >"$IT_DIR/metrics-at-failure.txt"
  fi
  if [[ -n $IT_WATCHDOG ]]; then
    kill -TERM "$IT_WATCHDOG" 2>/dev/null
    wait "$IT_WATCHDOG" 2>/dev/null
  fi
  for pid in "${!IT_PIDS[@]}"; do
    is_alive "$pid" && kill -TERM "$pid" 2>/dev/null
  done
  deadline=$(($(date +%s%N) / 1000000 + 5000))
  for pid in "${!IT_PIDS[@]}"; do
    while is_alive "$pid" && (($(date +%s%N) / 1000000 < deadline)); do
      sleep 0.05
    done
    if is_alive "$pid"; then
      name=${IT_PIDS[$pid]}
      echo "[$IT_NAME] cleanup: $name (pid $pid) ignored SIGTERM for 5s: SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null
      [[ $name == lynx-* ]] && { bad=1; IT_KILLED9[$pid]=1; }
    fi
    wait "$pid" 2>/dev/null
  done
  # region files of this test's agents
  for node in ${IT_NODE:+"$IT_NODE"} "${IT_NODES[@]:-}"; do
    [[ -n $node ]] || continue
    for f in /dev/shm/lynx-"$node"-*; do
      [[ -e $f ]] || continue
      apid=${f#/dev/shm/lynx-"$node"-}
      apid=${apid%%-*}
      # another's agent with the same node id (docs_api's node1): not ours
      [[ -n ${IT_STARTED[$apid]:-} ]] || continue
      if [[ -z ${IT_KILLED9[$apid]:-} ]]; then
        echo "[$IT_NAME] cleanup: FAIL: $f was left behind by agent pid $apid" >&2
        bad=1
      fi
      rm -f "$f"
    done
  done
  if ((rc == 0 && bad)); then
    rc=1
  fi
  if ((rc != 0 && rc != 77)) && [[ -n $IT_DIR ]]; then
    echo "[$IT_NAME] FAILED (exit $rc); logs of $IT_DIR:" >&2
    it_print_logs >&2
  fi
  if [[ -n $IT_DIR && ${LYNX_IT_KEEP:-0} != 1 ]]; then
    rm -rf "$IT_DIR"
  elif [[ -n $IT_DIR ]]; then
    echo "[$IT_NAME] kept $IT_DIR" >&2
  fi
  ((rc == 0)) && log "PASS"
  exit "$rc"
}
