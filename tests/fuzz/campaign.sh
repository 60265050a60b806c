#!/usr/bin/env bash
# campaign.sh BIN EXECUTIONS [HARNESS...]: a fuzzing campaign that can span
# sessions: each libFuzzer harness BIN/fuzz_<name> (default: every one with
# a corpus in tests/fuzz/corpus/) runs until its ledger holds EXECUTIONS
# executions, in runs of at most FUZZ_CHUNK seconds (default 600), each
# resuming from the corpus the earlier runs grew. Stops at the first crash
# or timeout, keeping the input (FUZZ_CAMPAIGN/<name>/crash-*, timeout-*)
# and the end of its output; a crash becomes a corpus file and a fix
# (docs/fuzzing.md).
#
# State, outside the tree: FUZZ_CAMPAIGN (default BIN/../fuzz-campaign)
# holds per harness its grown corpus (seeded from the tree's), and its
# ledger <name>.ledger, a line per run: "<UTC start> <git rev> <executions>
# <seconds> <ok|starved|TIMEOUT|CRASH>". FUZZ_DEADLINE=UNIX_TIME stops
# starting runs after that time (a run ends by it too), so a session can
# give it what it has. FUZZ_TIMEOUT: libFuzzer's -timeout (25 s).
#
# Every run is watched (hang-watch.sh): when it ends on a timeout, the
# stacks of all the hung process's threads, its threads' scheduler times
# and FZ_RERUNS (100) reruns of the input are kept in
# FUZZ_CAMPAIGN/<name>/hang-<UTC start>/, and the run is a TIMEOUT, a
# failure, unless it is shown starved: its threads spent at least half of
# its last FUZZ_TIMEOUT seconds waiting for a CPU, and the input reran
# 100 times in time (then "starved", and the campaign goes on). A timeout
# whose input merely reruns in time is a failure: that is how a race
# that hangs once in 170,000 inputs (issue 32) looks.
#
# At the end a line per harness: "<name>: <total> executions in <runs>
# runs, <seconds> s: ok" (or "... so far" when short of EXECUTIONS, or
# CRASH, or TIMEOUT); FUZZ_SUMMARY=FILE appends them to FILE. Exit 0
# unless a harness crashed or timed out (1).
set -uo pipefail
if (($# < 2)) || ! [[ $2 =~ ^[0-9]+$ ]]; then
  echo "usage: $0 BIN EXECUTIONS [HARNESS...]" >&2
  exit 2
fi
bin=$(cd "$1" && pwd) || exit 2
target=$2
shift 2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=fuzz-options.sh
source "$here/fuzz-options.sh"
# shellcheck source-path=SCRIPTDIR source=hang-watch.sh
source "$here/hang-watch.sh"
state=${FUZZ_CAMPAIGN:-$bin/../fuzz-campaign}
chunk=${FUZZ_CHUNK:-600}
deadline=${FUZZ_DEADLINE:-0}
tmo=${FUZZ_TIMEOUT:-25}
rev=$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)
fuzz_names "$here" "$@"
names=("${FUZZ_NAMES[@]}")
mkdir -p "$state"

total_of() { awk '{ s += $3 } END { print s + 0 }' "$1" 2>/dev/null || echo 0; }

crashed=0
for h in "${names[@]}"; do
  exe=$bin/fuzz_$h
  [[ -x $exe ]] || { echo "campaign: $exe is not built" >&2; exit 1; }
  dir=$state/$h ledger=$state/$h.ledger
  mkdir -p "$dir/corpus" "$dir/out"
  touch "$ledger"
  [[ -n $(ls -A "$dir/corpus") ]] || cp -R "$here/corpus/$h/." "$dir/corpus/"
  # per-harness libFuzzer options (-max_len=..., -dict=...)
  fuzz_options "$here" "$h"
  opts=(${FUZZ_OPTS[@]+"${FUZZ_OPTS[@]}"})
  while (($(total_of "$ledger") < target)); do
    secs=$chunk now=$(date +%s)
    if ((deadline)); then
      ((now + 30 < deadline)) || break
      ((deadline - now < secs)) && secs=$((deadline - now))
    fi
    left=$((target - $(total_of "$ledger")))
    start=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    t0=$(date +%s)
    fz_watched "$dir/out" "$dir/log" "$exe" -runs="$left" \
      -max_total_time="$secs" -print_final_stats=1 -timeout="$tmo" \
      -rss_limit_mb=4096 -artifact_prefix="$dir/" "${opts[@]}" "$dir/corpus"
    rc=$?
    execs=$(awk '/stat::number_of_executed_units/ {print $2}' "$dir/log" | tail -n 1)
    result=ok
    ((rc == 0)) || result=CRASH
    if ((rc != 0)) && grep -q 'ERROR: libFuzzer: timeout' "$dir/log"; then
      # kept whatever the verdict: the run's log, its threads' stacks and
      # scheduler times, the reruns
      hang=$dir/hang-$start
      fz_keep_hang "$dir/log" "$dir" "$hang" "$exe" "$tmo" "${opts[@]}"
      verdict=$FZ_VERDICT art=$FZ_ART
      if [[ $verdict == starved:* ]]; then
        result=starved
        mv "$art" "$hang/" # kept, out of the way of the next timeout
      else
        result=TIMEOUT
      fi
    fi
    [[ $result == ok ]] && rm -f "$dir/log.stacks" "$dir/log.sched"
    echo "$start $rev ${execs:-0} $(($(date +%s) - t0)) $result" >>"$ledger"
    if [[ $result == starved ]]; then
      echo "campaign: $h: a timeout shown starved ($verdict): going on (kept in $hang/)" >&2
      continue
    fi
    if [[ $result == TIMEOUT ]]; then
      echo "---- $h: $verdict"
      echo "---- input: ${art:-none written}; the run's log, every thread's stacks (log.stacks), scheduler times and reruns: $hang/"
      if [[ -f $hang/log.stacks ]]; then
        echo "---- $h: the stacks of every thread of the hung process ($hang/log.stacks) ----"
        cat "$hang/log.stacks"
      else
        echo "---- $h: no stacks were taken (the watcher saw neither the timeout report nor a quiet process)"
      fi
      echo "---- $h: the end of libFuzzer's output ----"
      tail -n 40 "$hang/log"
      crashed=1
      break
    fi
    if ((rc != 0)); then
      echo "---- $h: the end of libFuzzer's output (input kept in $dir/) ----"
      tail -n 60 "$dir/log"
      crashed=1
      break
    fi
  done
  runs=$(grep -c . "$ledger")
  secs=$(awk '{ s += $4 } END { print s + 0 }' "$ledger")
  tot=$(total_of "$ledger")
  if grep -q CRASH "$ledger"; then
    line="$h: $tot executions in $runs runs, $secs s: CRASH"
  elif grep -q TIMEOUT "$ledger"; then
    line="$h: $tot executions in $runs runs, $secs s: TIMEOUT"
  elif ((tot >= target)); then
    line="$h: $tot executions in $runs runs, $secs s: ok"
  else
    line="$h: $tot executions in $runs runs, $secs s: ok so far ($target wanted)"
  fi
  echo "$line"
  [[ -n ${FUZZ_SUMMARY:-} ]] && echo "$line" >>"$FUZZ_SUMMARY"
  ((crashed)) && exit 1
done
exit 0
