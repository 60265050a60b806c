# shellcheck shell=bash
# hang-watch.sh - sourced by fuzz-run.sh and campaign.sh: a libFuzzer run
# watched for a hang, and the judgement of a run that ended on a timeout
# (docs/fuzzing.md, "Timeouts"). libFuzzer's own timeout report prints
# the stack of the thread its alarm lands on, the main one: a harness
# hung in a join shows the join, not the thread that never ended (issue
# 32: fuzz_tcp_agent's agent thread in uv_run). The watcher keeps every
# thread's.
#
# fz_watched OUTDIR LOG CMD...: runs CMD in OUTDIR, its output in LOG,
# and returns its exit status. Meanwhile, once a second, the scheduler
# times of each of its threads (/proc/PID/task/*/schedstat: on a CPU,
# waiting for one) go to LOG.sched, "<unix ns> <tid> <run ns> <wait ns>"
# after a line "<unix ns> start"; and the stacks of all its threads (gdb
# -p, thread apply all bt; with each thread's state, wait channel and
# scheduler times from /proc) go to LOG.stacks:
#   - when none of its threads has run or waited for a CPU for FZ_QUIET
#     seconds (10; libFuzzer's -timeout is 25): asleep, all of them,
#     which is a hang (the stacks are kept only if the run then ends on a
#     timeout: fuzz-run.sh's scratch directory goes, campaign.sh deletes
#     them);
#   - when libFuzzer's timeout report begins ("ALARM: working on the last
#     Unit", looked for every 0.1 s): the process is stopped (SIGSTOP)
#     for gdb, then continued to its end. The report's symbolizing leaves
#     the time to catch it, mostly: best effort, and the only stacks of
#     an input that spins;
# each once.
#
# fz_timeout_judge EXE TIMEOUT INPUT DIR LOG [OPTS...]: a run whose LOG
# ends in a libFuzzer timeout. Prints one line, the verdict, and returns
# 0 when it is "starved", 1 for "TIMEOUT". Starved means shown starved,
# both: (1) over the run's last TIMEOUT seconds (LOG.sched) its threads
# spent, summed, at least half of the time waiting for a CPU: not asleep
# (a hang: its threads wait for each other) nor on a CPU (a slow or
# endless input); (2) the input then runs FZ_RERUNS times (100) in one
# process with the same -timeout, watched as above, none timing out
# (DIR/rerun.log and, when one hangs, DIR/rerun.log.stacks). Anything
# else is a TIMEOUT, a failure: one whose input reruns in time included,
# which is what a race that hangs once in 170,000 inputs looks like.

FZ_QUIET=${FZ_QUIET:-10}
FZ_RERUNS=${FZ_RERUNS:-100}

# The stacks of every thread of pid, appended to file, headed with why;
# their scheduler times appended to sched too (a sample at the very end).
fz_stacks() {
  local pid=$1 file=$2 why=$3 sched=$4 t r w now
  now=$(date +%s%N)
  for t in /proc/"$pid"/task/*; do
    read -r r w _ 2>/dev/null <"$t/schedstat" &&
      echo "$now ${t##*/} $r $w" >>"$sched"
  done
  {
    echo "==== $(date -u +%Y-%m-%dT%H:%M:%SZ) pid $pid: $why"
    for t in /proc/"$pid"/task/*; do
      [[ -r $t/stat ]] || continue
      # comm may hold spaces: the state is the field after its ')'
      echo "thread ${t##*/} $(sed 's/^.*) \([A-Z]\).*$/state \1/' "$t/stat") ($(cat "$t/comm" 2>/dev/null)) wchan $(cat "$t/wchan" 2>/dev/null) schedstat $(cat "$t/schedstat" 2>/dev/null)"
    done
    if command -v gdb >/dev/null; then
      timeout 120 gdb -p "$pid" -batch -nx -ex 'set pagination off' \
        -ex 'set print thread-events off' -ex 'info threads' \
        -ex 'thread apply all bt' </dev/null 2>&1 |
        grep -v '^\[New LWP\|^\[Thread debugging\|^Using host libthread_db'
    else
      echo "(no gdb on PATH: only the thread states above, and libFuzzer's"
      echo " stack of the main thread in the log)"
    fi
  } >>"$file" 2>&1
}

# The watcher of pid (fz_watched's): samples and stacks, until pid ends.
fz_watch() {
  local pid=$1 log=$2 alarmed=0 quiet=0 tick=0 t now sum r w
  local -A prev=() cur=()
  while kill -0 "$pid" 2>/dev/null; do
    # (no grep -q in a pipe: the callers' pipefail counts tail's SIGPIPE)
    if ((!alarmed)) && [[ $(tail -c 16384 "$log" 2>/dev/null) == *"ALARM: working on the last Unit"* ]]; then
      alarmed=1
      # held while the stacks are taken: the report ends in _Exit
      kill -STOP "$pid" 2>/dev/null
      fz_stacks "$pid" "$log.stacks" "libFuzzer's timeout report began" \
        "$log.sched"
      kill -CONT "$pid" 2>/dev/null
    fi
    if ((tick++ % 10 == 0)); then
      now=$(date +%s%N) sum=0 cur=()
      for t in /proc/"$pid"/task/*; do
        read -r r w _ 2>/dev/null <"$t/schedstat" || continue
        echo "$now ${t##*/} $r $w" >>"$log.sched"
        cur[${t##*/}]=$((r + w))
        ((sum += r + w - ${prev[${t##*/}]:-$((r + w))}))
      done
      # quiet: under 5% of the second on a CPU or waiting for one
      if ((${#prev[@]} && sum < 50000000)); then
        ((quiet++))
      else
        quiet=0
      fi
      prev=()
      for t in "${!cur[@]}"; do prev[$t]=${cur[$t]}; done
      if ((quiet == FZ_QUIET)); then
        fz_stacks "$pid" "$log.stacks" \
          "no thread ran or waited for a CPU for $FZ_QUIET s" "$log.sched"
      fi
    fi
    sleep 0.1
  done
}

fz_watched() {
  local dir=$1 log=$2 pid wpid rc
  shift 2
  rm -f "$log.stacks"
  (cd "$dir" && exec "$@" >"$log" 2>&1) &
  pid=$!
  echo "$(date +%s%N) start" >"$log.sched"
  fz_watch "$pid" "$log" &
  wpid=$!
  wait "$pid"
  rc=$?
  wait "$wpid"
  return "$rc"
}

# Over the last secs seconds of sched file f (from its last sample back
# to the latest sample before that, or to the start): "<s> <run s> <wait
# s>", the wall time and what the threads spent in it, summed. A watcher
# starved beside its process samples seldom: the stretch is then longer.
fz_sched_sums() {
  awk -v secs="$2" '
    $2 == "start" { start = $1; next }
    { n++; t[n] = $1; id[n] = $2; run[n] = $3; wt[n] = $4; if ($1 > end) end = $1 }
    END {
      if (!n) { print "0 0 0"; exit }
      from = start
      for (i = 1; i <= n; i++)
        if (t[i] <= end - secs * 1e9 && t[i] > from) from = t[i]
      for (i = 1; i <= n; i++) {
        k = id[i]
        if (t[i] <= from) { r0[k] = run[i]; w0[k] = wt[i] }
        else { r1[k] = run[i]; w1[k] = wt[i]; seen[k] = 1 }
      }
      for (k in seen) { rs += r1[k] - r0[k]; ws += w1[k] - w0[k] }
      printf "%.1f %.1f %.1f\n", (end - from) / 1e9, rs / 1e9, ws / 1e9
    }' "$1" 2>/dev/null || echo "0 0 0"
}

fz_timeout_judge() {
  local exe=$1 tmo=$2 input=$3 dir=$4 log=$5 span run wait shown=0 rrc why
  shift 5
  read -r span run wait < <(fz_sched_sums "$log.sched" "$tmo")
  # (2 x wait >= span: at least half of it waiting for a CPU)
  if awk -v s="$span" -v w="$wait" 'BEGIN { exit !(s >= 1 && 2 * w >= s) }'; then
    shown=1
  fi
  why="its threads in the last ${span} s: on a CPU ${run} s, waiting for one ${wait} s (summed)"
  if [[ -z $input || ! -f $input ]]; then
    echo "TIMEOUT: no input was written; $why"
    return 1
  fi
  fz_watched "$dir" "$dir/rerun.log" "$exe" -runs="$FZ_RERUNS" -timeout="$tmo" \
    "$@" "$input"
  rrc=$?
  if grep -q 'ERROR: libFuzzer: timeout' "$dir/rerun.log"; then
    echo "TIMEOUT: it hangs again when rerun ($FZ_RERUNS runs of $input, -timeout=$tmo: $dir/rerun.log, stacks $dir/rerun.log.stacks); $why"
    return 1
  fi
  if ((rrc != 0)); then
    echo "TIMEOUT: its reruns failed otherwise (exit $rrc, $dir/rerun.log); $why"
    return 1
  fi
  if ((!shown)); then
    echo "TIMEOUT: it reran $FZ_RERUNS times in time, but the run was not starved ($why): a hang or a slow path that hits sometimes"
    return 1
  fi
  echo "starved: $why, and it reran $FZ_RERUNS times in time"
  return 0
}

# fz_keep_hang LOG OUTDIR HANG EXE TMO [OPT...]: what a libFuzzer timeout
# leaves, kept in HANG: LOG (copied), the stacks and scheduler times the
# watch wrote beside it (moved: the next run writes its own), and the
# judgement of its input, the newest OUTDIR/timeout-* (fz_timeout_judge),
# in HANG/verdict. Sets FZ_ART (the input, "" when none was written) and
# FZ_VERDICT.
fz_keep_hang() {
  local log=$1 out=$2 hang=$3 exe=$4 tmo=$5 f
  shift 5
  mkdir -p "$hang"
  cp "$log" "$hang/log"
  for f in "$log.stacks" "$log.sched"; do
    [[ -f $f ]] && mv "$f" "$hang/${f##*/}"
  done
  FZ_ART=$(ls -t "$out"/timeout-* 2>/dev/null | head -n 1)
  FZ_VERDICT=$(fz_timeout_judge "$exe" "$tmo" "$FZ_ART" "$hang" "$hang/log" "$@")
  echo "$FZ_VERDICT" >"$hang/verdict"
}
