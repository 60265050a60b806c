# shellcheck shell=bash
# netns.sh - multi-host harness of Lynx-C: "hosts" are network namespaces
# joined by veth pairs to one bridge. Source it, then:
#
#   source tests/multihost/netns.sh
#   mh_begin my_test DEADLINE_S    # daemons built, tools there, then mh_init
#   mh_init my_test [DEADLINE_S]   # exit 77 when namespaces cannot be made;
#                                  # temp dir $MH_DIR, traps, watchdog, bridge
#   mh_host coord                  # namespace + veth + 10.77.0.1/24, lo up
#   mh_host h1 10.77.0.11          # an address of your choice
#   mh_ip h1                       # -> 10.77.0.11
#   mh_exec h1 ip addr             # a command inside the host
#   mh_spawn h1 agent-h1 "$BIN/lynx-agent" ...   # daemon in h1, log
#                                  # $MH_DIR/agent-h1.<seq>.log; sets MH_PID
#                                  # and MH_LOG
#   mh_kill_host h2                # kill -9 every process of h2
#   mh_stop PID [TIMEOUT_S]        # SIGTERM, wait; sets MH_RC
#   mh_wait_until TIMEOUT_S WHAT CMD...  # until CMD succeeds
#   mh_wait_log FILE PATTERN [TIMEOUT_S] [COUNT] [PID]
#   mh_node_id h1                  # -> mh<id>nh1, a node id unique to the run
#
# Naming. Every object of a run carries the run id (the pid of the shell
# that called mh_init): namespaces are lxmh-<id>-<host> and lxmh-<id>-br
# (which holds the bridge and the host-side ends of the veth pairs, so
# nothing of a run is ever created in the root namespace), node ids made
# with mh_node_id are mh<id>n<name>. The run is recorded in
# /run/lynx-mh/<id> (the pid's start time and the temp dir), so parallel
# runs never collide, and mh_init removes what earlier runs of this harness
# left behind when they were killed (their recorded process is gone): their
# namespaces, the processes in them, their /dev/shm/lynx-mh<id>n* region
# files and temp dirs. Nothing else is touched.
#
# Cleanup (EXIT trap: success, failure, INT, TERM, the watchdog's deadline)
# SIGTERMs the daemons started with mh_spawn, waits up to 3 s, SIGKILLs
# every process left in the run's namespaces, deletes the namespaces (which
# deletes their veth pairs and the bridge), removes the run's region files
# and temp dir (kept with MH_KEEP=1), and prints every log of $MH_DIR when
# the script fails (exit status other than 0 and 77). The watchdog also
# tears the run down if the script itself is killed with SIGKILL.
#
# Hooks: set MH_ON_FAIL to the name of a function to run first on failure
# (e.g. to scrape metrics while the daemons still run).
#
# Works under `set -euo pipefail`; shellcheck-clean.

MH_SUBNET=${MH_SUBNET:-10.77.0}
MH_PREFIX=lxmh
MH_RUNDIR=${MH_RUNDIR:-/run/lynx-mh}
MH_NAME=${MH_NAME:-$(basename "$0" .sh)}
MH_ID=''
MH_DIR=''
MH_BR=''
MH_WATCHDOG=''
MH_CLEANED=0
MH_SEQ=0
MH_NEXT_IP=1
MH_PID=''
MH_LOG=''
# shellcheck disable=SC2034 # for the caller: exit status of the last daemon
# mh_stop or mh_reap collected
MH_RC=''
MH_ON_FAIL=${MH_ON_FAIL:-}
declare -a MH_HOSTS=()
declare -A MH_IPS=()
declare -A MH_PIDS=() # pid -> label of daemons we started (our children)
# The time scale (LYNX_TEST_TIME_SCALE, docs/testing.md; as
# tests/integration/lib.sh): the watchdog and every wait here are
# multiplied by it.
MH_TS=${LYNX_TEST_TIME_SCALE:-1}
if ! [[ $MH_TS =~ ^[1-9][0-9]?$ ]]; then
  echo "LYNX_TEST_TIME_SCALE=$MH_TS: want a whole number from 1 to 99" >&2
  exit 2
fi

# ---- messages -----------------------------------------------------------

mh_log() { printf '[%s] %s: %s\n' "$(date +%H:%M:%S.%3N)" "$MH_NAME" "$*"; }
mh_fail() {
  printf '[%s] %s: FAIL: %s\n' "$(date +%H:%M:%S.%3N)" "$MH_NAME" "$*" >&2
  exit 1
}
mh_skip() {
  printf '%s: SKIP: %s\n' "$MH_NAME" "$*"
  exit 77
}
mh_now_ms() { echo $(($(date +%s%N) / 1000000)); }

# ---- runs -----------------------------------------------------------------

# mh_starttime PID: the process's start time (clock ticks since boot), or
# nothing when it does not exist.
mh_starttime() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  # fields after the command: state is field 3, starttime field 22
  awk '{ print $20 }' <<<"$stat"
}

# mh_run_alive ID: the run ID's shell still runs (same pid, same start time).
mh_run_alive() {
  local rec
  [[ -r $MH_RUNDIR/$1 ]] || return 1
  rec=$(head -n 1 "$MH_RUNDIR/$1" 2>/dev/null) || return 1
  [[ -n $rec && $rec == "$(mh_starttime "$1")" ]]
}

# mh_run_namespaces ID: the namespaces of run ID, one a line.
mh_run_namespaces() {
  ip netns list 2>/dev/null | awk -v p="$MH_PREFIX-$1-" 'index($1, p) == 1 { print $1 }'
}

# mh_kill_ns NS: SIGKILL every process of namespace NS; waits (2 s at most)
# until they are gone.
mh_kill_ns() {
  local ns=$1 pids i
  for ((i = 0; i < 40; i++)); do
    pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ') || pids=''
    [[ -z ${pids// /} ]] && return 0
    # shellcheck disable=SC2086 # a list of pids
    kill -KILL $pids 2>/dev/null || true
    sleep 0.05
  done
  return 0
}

# mh_teardown_run ID [KEEP_DIR]: kills every process in run ID's
# namespaces, deletes them, its region files, its temp dir (unless KEEP_DIR
# is 1 or MH_KEEP=1) and its record. Quiet, never fails.
mh_teardown_run() {
  local id=$1 keep=${2:-0} ns f
  for ns in $(mh_run_namespaces "$id"); do
    mh_kill_ns "$ns"
  done
  for ns in $(mh_run_namespaces "$id"); do
    ip netns del "$ns" 2>/dev/null || true
  done
  for f in /dev/shm/lynx-mh"$id"n*; do
    [[ -e $f ]] && rm -f "$f"
  done
  # the run's temp dir (second line of its record), unless kept
  f=$(sed -n 2p "$MH_RUNDIR/$id" 2>/dev/null) || f=''
  if [[ $f == */lynx-mh-* && -d $f && $keep != 1 && ${MH_KEEP:-0} != 1 ]]; then
    rm -rf "$f"
  fi
  rm -f "$MH_RUNDIR/$id"
  return 0
}

# mh_remove_stale: tears down earlier runs of this harness whose shell is
# gone (crashed or killed with SIGKILL), and their leftover region files.
mh_remove_stale() {
  local ns id f
  local -A seen=()
  while read -r ns; do
    [[ $ns =~ ^$MH_PREFIX-([0-9]+)- ]] || continue
    id=${BASH_REMATCH[1]}
    [[ $id == "$$" || -n ${seen[$id]:-} ]] && continue
    seen[$id]=1
    mh_run_alive "$id" && continue
    mh_log "removing what stale run $id left behind: $(mh_run_namespaces "$id" | tr '\n' ' ')"
    mh_teardown_run "$id"
  done < <(ip netns list 2>/dev/null | awk '{ print $1 }')
  for f in /dev/shm/lynx-mh*n*; do
    [[ -e $f ]] || continue
    [[ $f =~ ^/dev/shm/lynx-mh([0-9]+)n ]] || continue
    id=${BASH_REMATCH[1]}
    [[ $id == "$$" ]] && continue
    mh_run_alive "$id" || rm -f "$f"
  done
  for f in "$MH_RUNDIR"/*; do
    [[ -e $f ]] || continue
    id=$(basename "$f")
    [[ $id =~ ^[0-9]+$ && $id != "$$" ]] || continue
    mh_run_alive "$id" || mh_teardown_run "$id"
  done
  return 0
}

# ---- set-up -------------------------------------------------------------

# mh_init NAME [DEADLINE_S]: skips (77) unless namespaces, veth pairs and a
# bridge can be made; removes stale runs; creates $MH_DIR, the bridge, the
# traps and a watchdog that ends the script after DEADLINE_S (default 150).
mh_init() {
  MH_NAME=${1:-$MH_NAME}
  local deadline=${2:-${MH_DEADLINE_S:-150}} err
  ((EUID == 0)) || mh_skip "network namespaces need root (running as uid $EUID)"
  command -v ip >/dev/null 2>&1 || mh_skip "the 'ip' command (iproute2) is not installed"
  ip netns list >/dev/null 2>&1 || mh_skip "'ip netns' is not supported here"
  MH_ID=$$
  mkdir -p "$MH_RUNDIR" 2>/dev/null || mh_skip "cannot create $MH_RUNDIR"
  mh_remove_stale
  MH_DIR=$(mktemp -d "${TMPDIR:-/tmp}/lynx-mh-$MH_NAME.XXXXXX") ||
    mh_fail "cannot create a temp dir"
  { mh_starttime "$MH_ID"; echo "$MH_DIR"; } >"$MH_RUNDIR/$MH_ID"
  trap mh_cleanup EXIT
  trap 'mh_log "interrupted"; exit 130' INT
  trap 'mh_log "terminated"; exit 143' TERM
  mh_watchdog "$deadline"
  MH_BR=$MH_PREFIX-$MH_ID-br
  if ! err=$(ip netns add "$MH_BR" 2>&1); then
    mh_skip "cannot create a network namespace: $err"
  fi
  if ! err=$({ ip -n "$MH_BR" link add br0 type bridge &&
    ip -n "$MH_BR" link set br0 up &&
    ip -n "$MH_BR" link add probe0 type veth peer name probe1 &&
    ip -n "$MH_BR" link del probe0; } 2>&1); then
    mh_skip "cannot create a bridge and veth pairs in a namespace: $err"
  fi
  mh_log "run $MH_ID: temp dir $MH_DIR, bridge namespace $MH_BR, subnet $MH_SUBNET.0/24, deadline ${deadline}s"
}

# mh_begin NAME DEADLINE_S: the start of a test of the daemons in
# $LYNX_BIN_DIR: they must be built (fails otherwise), sockperf, curl, jq
# and timeout installed (skips otherwise); then mh_init NAME with
# $MH_DEADLINE_S or DEADLINE_S. Sets BIN (the daemons' directory) and T0.
mh_begin() {
  local b t
  BIN=$LYNX_BIN_DIR
  for b in lynx-coordinator lynx-agent lynx-frontend lynxctl; do
    [[ -x $BIN/$b ]] || mh_fail "$BIN/$b is missing: build first (make)"
  done
  for t in sockperf curl jq timeout; do
    command -v "$t" >/dev/null 2>&1 || mh_skip "$t is not installed"
  done
  mh_init "$1" "${MH_DEADLINE_S:-$2}"
  T0=$(mh_now_ms)
}

# mh_pingpong NAME HOST ADDRESS PORT SECONDS: sockperf ping-pong from HOST
# to ADDRESS:PORT, its output in $MH_DIR/sockperf-NAME.out; every message
# answered, none duplicated or out of order (lib.sh's check_sockperf).
mh_pingpong() {
  local out=$MH_DIR/sockperf-$1.out rc=0
  mh_log "sockperf ping-pong -i $3 -p $4 -m 64 -t $5 (from $2)"
  mh_exec "$2" timeout -k 3 $((40 * MH_TS)) sockperf ping-pong -i "$3" -p "$4" \
    -m 64 -t "$5" >"$out" 2>&1 </dev/null || rc=$?
  ((rc == 0)) || { cat "$out"; mh_fail "sockperf ping-pong exited $rc"; }
  check_sockperf "$out"
}

# mh_watchdog DEADLINE_S: a background watcher. At the deadline it sends
# SIGTERM to the script (whose trap cleans up); if the script disappears
# without cleaning up (SIGKILL), it tears the run down itself.
mh_watchdog() {
  local deadline=$(($1 * MH_TS)) main=$$
  (
    sp=''
    trap '[[ -n $sp ]] && kill "$sp" 2>/dev/null; exit 0' TERM
    trap '' INT
    end=$(($(date +%s) + deadline))
    warned=0
    for (( ; ; )); do
      if ! kill -0 "$main" 2>/dev/null; then
        # the script is gone; if it did not clean up, do it
        if [[ -n $(mh_run_namespaces "$MH_ID") || -e $MH_RUNDIR/$MH_ID ]]; then
          echo "[$MH_NAME] watchdog: the script (pid $main) died without cleaning up: tearing run $MH_ID down" >&2
          mh_teardown_run "$MH_ID"
        fi
        exit 0
      fi
      if ((warned == 0 && $(date +%s) >= end)); then
        echo "[$MH_NAME] watchdog: the script exceeded ${deadline}s: SIGTERM" >&2
        kill -TERM "$main" 2>/dev/null
        warned=1
      fi
      sleep 0.3 &
      sp=$!
      wait "$sp"
      sp=''
    done
  ) </dev/null >/dev/null &
  MH_WATCHDOG=$!
}

# mh_ns HOST: the namespace name of HOST.
mh_ns() { printf '%s-%s-%s' "$MH_PREFIX" "$MH_ID" "$1"; }

# mh_ip HOST: HOST's address.
mh_ip() {
  [[ -n ${MH_IPS[$1]:-} ]] || mh_fail "mh_ip: no host '$1'"
  printf '%s' "${MH_IPS[$1]}"
}

# mh_node_id NAME: a node id unique to this run ("mh<id>n<NAME>"; NAME of
# letters and digits only).
mh_node_id() { printf 'mh%sn%s' "$MH_ID" "$1"; }

# mh_host NAME [ADDRESS]: a host: namespace, loopback up, a veth pair whose
# other end is on the bridge, ADDRESS/24 on its eth0 (default: the next free
# $MH_SUBNET.N). NAME: at most 14 characters [A-Za-z0-9_].
mh_host() {
  local name=$1 addr=${2:-} ns veth err
  [[ $name =~ ^[A-Za-z0-9_]{1,14}$ ]] || mh_fail "mh_host: bad host name '$name'"
  [[ -z ${MH_IPS[$name]:-} ]] || mh_fail "mh_host: host '$name' exists"
  if [[ -z $addr ]]; then
    while [[ " ${MH_IPS[*]} " == *" $MH_SUBNET.$MH_NEXT_IP "* ]]; do
      MH_NEXT_IP=$((MH_NEXT_IP + 1))
    done
    addr=$MH_SUBNET.$MH_NEXT_IP
    MH_NEXT_IP=$((MH_NEXT_IP + 1))
  fi
  ns=$(mh_ns "$name")
  veth=v$name
  if ! err=$({ ip netns add "$ns" &&
    ip -n "$ns" link set lo up &&
    ip -n "$MH_BR" link add "$veth" type veth peer name eth0 netns "$ns" &&
    ip -n "$MH_BR" link set "$veth" master br0 up &&
    ip -n "$ns" addr add "$addr/24" dev eth0 &&
    ip -n "$ns" link set eth0 up; } 2>&1); then
    if ((${#MH_HOSTS[@]} == 0)); then
      mh_skip "cannot create host $name ($ns): $err"
    fi
    mh_fail "cannot create host $name ($ns): $err"
  fi
  MH_HOSTS+=("$name")
  MH_IPS[$name]=$addr
  mh_log "host $name: namespace $ns, $addr/24"
}

# mh_exec HOST CMD...: runs CMD inside HOST.
mh_exec() {
  local host=$1
  shift
  ip netns exec "$(mh_ns "$host")" "$@"
}

# mh_wait_reachable FROM TO [TIMEOUT_S]: until FROM pings TO's address
# (does nothing when ping is not installed).
mh_wait_reachable() {
  local end=$(($(date +%s) + ${3:-5} * MH_TS))
  command -v ping >/dev/null 2>&1 || return 0
  until mh_exec "$1" ping -c1 -W1 "$(mh_ip "$2")" >/dev/null 2>&1; do
    (($(date +%s) < end)) || mh_fail "host $1 cannot reach $2 ($(mh_ip "$2"))"
    sleep 0.1
  done
}

# ---- processes ------------------------------------------------------------

# mh_alive PID: running and not a zombie.
mh_alive() {
  local st
  kill -0 "$1" 2>/dev/null || return 1
  st=$(sed -n 's/^.*) \(.\).*/\1/p' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $st && $st != Z ]]
}

# mh_spawn HOST LABEL CMD...: starts CMD in the background inside HOST, its
# output in $MH_DIR/LABEL.<seq>.log. Sets MH_PID (the command's own pid:
# ip netns exec execs it) and MH_LOG.
mh_spawn() {
  local host=$1 label=$2
  shift 2
  MH_SEQ=$((MH_SEQ + 1))
  MH_LOG=$MH_DIR/$label.$MH_SEQ.log
  ip netns exec "$(mh_ns "$host")" "$@" >"$MH_LOG" 2>&1 </dev/null &
  MH_PID=$!
  MH_PIDS[$MH_PID]="$label@$host"
  mh_log "started $label in $host, pid $MH_PID: $(basename "$1") ${*:2}"
}

# mh_reap PID: forgets a daemon that exited, collecting its status in MH_RC.
# shellcheck disable=SC2034 # MH_RC is for the caller
mh_reap() {
  MH_RC=0
  wait "$1" 2>/dev/null || MH_RC=$?
  unset "MH_PIDS[$1]"
}

# mh_stop PID [TIMEOUT_S] [SIGNAL]: signals PID and waits for it; fails when
# it is still running after TIMEOUT_S (10). Sets MH_RC to its exit status.
mh_stop() {
  local pid=$1 t=${2:-10} sig=${3:-TERM} end
  kill -"$sig" "$pid" 2>/dev/null || true
  end=$(($(mh_now_ms) + t * 1000 * MH_TS))
  while mh_alive "$pid"; do
    (($(mh_now_ms) < end)) || mh_fail "${MH_PIDS[$pid]:-pid $pid} still runs ${t}s after SIG$sig"
    sleep 0.05
  done
  mh_reap "$pid"
}

# mh_kill_host HOST: SIGKILL every process running in HOST (as a machine
# that loses power), waits until they are gone and reaps our daemons there.
mh_kill_host() {
  local host=$1 ns pid pids
  ns=$(mh_ns "$host")
  pids=$(ip netns pids "$ns" | tr '\n' ' ')
  mh_log "kill -9 of every process of host $host: ${pids:-none}"
  { # (reaped here, with stderr closed, so bash prints no "Killed" notice)
    mh_kill_ns "$ns"
    for pid in "${!MH_PIDS[@]}"; do
      [[ ${MH_PIDS[$pid]} == *"@$host" ]] || continue
      mh_alive "$pid" && continue
      mh_reap "$pid"
    done
  } 2>/dev/null
  [[ -z $(ip netns pids "$ns") ]] || mh_fail "processes of $host survived SIGKILL: $(ip netns pids "$ns" | tr '\n' ' ')"
}

# mh_wait_until TIMEOUT_S WHAT CMD...: until CMD succeeds; fails with
# "WHAT: not within the time allowed" after TIMEOUT_S.
mh_wait_until() {
  local end=$(($(mh_now_ms) + $1 * 1000 * MH_TS)) what=$2
  shift 2
  until "$@"; do
    (($(mh_now_ms) < end)) || mh_fail "$what: not within the time allowed"
    sleep 0.1
  done
}

# mh_wait_log FILE PATTERN [TIMEOUT_S] [COUNT] [PID]: until FILE holds COUNT
# (1) lines with the fixed string PATTERN; fails on timeout or when PID
# exits first.
mh_wait_log() {
  local file=$1 pat=$2 t=${3:-10} count=${4:-1} pid=${5:-} n end
  end=$(($(mh_now_ms) + t * 1000 * MH_TS))
  for (( ; ; )); do
    n=$(grep -cF -- "$pat" "$file" 2>/dev/null) || n=0
    ((n >= count)) && return 0
    if [[ -n $pid ]] && ! mh_alive "$pid"; then
      mh_fail "$(basename "$file" .log) exited while we waited for '$pat' in its log"
    fi
    (($(mh_now_ms) < end)) || mh_fail "timed out after ${t}s waiting for '$pat' (x$count) in $(basename "$file")"
    sleep 0.05
  done
}

# ---- cleanup --------------------------------------------------------------

mh_print_logs() {
  local f
  for f in "$MH_DIR"/*; do
    [[ -f $f && -s $f ]] || continue
    echo "----- $(basename "$f") -----"
    tail -n 200 "$f"
  done
  echo "----- end of logs -----"
}

mh_cleanup() {
  local rc=$? pid end
  ((MH_CLEANED)) && return 0
  MH_CLEANED=1
  set +e
  trap '' INT TERM
  if ((rc != 0 && rc != 77)) && [[ -n $MH_ON_FAIL ]]; then
    "$MH_ON_FAIL" >/dev/null 2>&1
  fi
  for pid in "${!MH_PIDS[@]}"; do
    mh_alive "$pid" && kill -TERM "$pid" 2>/dev/null
  done
  end=$(($(mh_now_ms) + 3000))
  for pid in "${!MH_PIDS[@]}"; do
    while mh_alive "$pid" && (($(mh_now_ms) < end)); do sleep 0.05; done
    if mh_alive "$pid"; then
      echo "[$MH_NAME] cleanup: ${MH_PIDS[$pid]} (pid $pid) ignored SIGTERM for 3s: SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null
    fi
  done
  if [[ -n $MH_ID ]]; then
    mh_teardown_run "$MH_ID" 1
    for pid in "${!MH_PIDS[@]}"; do wait "$pid" 2>/dev/null; done
    if [[ -n $(mh_run_namespaces "$MH_ID") ]]; then
      echo "[$MH_NAME] cleanup: namespaces left: $(mh_run_namespaces "$MH_ID" | tr '\n' ' ')" >&2
      ((rc == 0)) && rc=1
    fi
  fi
  if [[ -n $MH_WATCHDOG ]]; then
    kill -TERM "$MH_WATCHDOG" 2>/dev/null
    wait "$MH_WATCHDOG" 2>/dev/null
  fi
  if ((rc != 0 && rc != 77)) && [[ -n $MH_DIR ]]; then
    echo "[$MH_NAME] FAILED (exit $rc); logs of $MH_DIR:" >&2
    mh_print_logs >&2
  fi
  if [[ -n $MH_DIR && -d $MH_DIR ]]; then
    if [[ ${MH_KEEP:-0} == 1 ]]; then
      echo "[$MH_NAME] kept $MH_DIR" >&2
    else
      rm -rf "$MH_DIR"
    fi
  fi
  ((rc == 0)) && mh_log "PASS"
  exit "$rc"
}
