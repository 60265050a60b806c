# deploy/lib-run.sh - what `make run` and `make run-ha` share: starting the
# daemons in sessions of their own with a log each in $LOGDIR, waiting for
# their log lines, stopping them in reverse order on Ctrl-C or exit, and
# noticing one that dies by itself. Sourced; the caller sets LOGDIR.

pids=()
stop() {
  trap - INT TERM EXIT
  echo
  echo "stopping..."
  # in reverse order: frontend first (drains), then agent (leaves), then
  # coordinator(s), then etcd
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
  echo "stopped; logs in $LOGDIR"
}
trap 'stop; exit 0' INT TERM
trap stop EXIT

fail() {
  echo "lynx failed to start: $*" >&2
  tail -n 20 "$LOGDIR"/*.log >&2
  exit 1
}

wait_for() { # FILE PATTERN WHAT
  for _ in $(seq 100); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || fail "$3 exited"; done
    sleep 0.1
  done
  fail "$3 did not come up in 10 s"
}

declare -A names=() progs=()
# start NAME PROG ARGS...: PROG in its own session, its log in NAME.log
start() {
  local name=$1
  shift
  setsid "$@" >"$LOGDIR/$name.log" 2>&1 </dev/null &
  pids+=($!)
  names[$!]=$name
  progs[$!]=$(basename "$1")
}

# watch [PID...]: returns when one of those daemons (default: all) exits by
# itself (Ctrl-C runs the trap instead), naming it, its status and its log;
# exits 1.
watch() {
  rc=0
  (($#)) || set -- "${pids[@]}"
  wait -n -p gone "$@" || rc=$?
  echo "${progs[$gone]:-?} (pid ${gone:-?}) exited with status $rc; its log: $LOGDIR/${names[$gone]:-}.log" >&2
  tail -n 5 "$LOGDIR/${names[$gone]:-}.log" >&2 || true
  exit 1
}
