#!/usr/bin/env bash
# fuzz-run.sh [--skip-missing] BIN SECONDS [HARNESS...]: runs each libFuzzer
# harness BIN/fuzz_<name> (default: every one with a corpus directory in
# tests/fuzz/corpus/) for SECONDS seconds, starting from a scratch copy of
# its corpus, so that the tree is never written to. Fails when any crashed
# (memory error, undefined behaviour, leak, a property of the harness,
# timeout, out of memory): the input that did it is kept in
# FUZZ_ARTIFACTS/<name>/ (default BIN/../fuzz-artifacts) and its run's
# output is shown. `make fuzz` runs it; ctest's fuzz_<name>.libfuzzer
# tests run one harness each for a few seconds. FUZZ_TIMEOUT: libFuzzer's
# -timeout (25 s).
#
# Every run is watched (hang-watch.sh). A timeout is a failure whatever
# its cause (TIMEOUT), with the stacks of every thread of the hung
# process, its threads' scheduler times and FZ_RERUNS (100) reruns of the
# input kept beside the input, and the verdict campaign.sh would give it
# (hangs again, reruns in time but was not starved, shown starved).
#
# A line per harness: "<name>: <executions> executions in <s> s: ok" (or
# CRASH, or TIMEOUT). FUZZ_SUMMARY=FILE appends those lines to FILE too.
# --skip-missing: exit 77 (a ctest skip) when BIN/fuzz_<name> is missing.
set -uo pipefail
skip_missing=0
if [[ ${1:-} == --skip-missing ]]; then
  skip_missing=1
  shift
fi
if (($# < 2)) || ! [[ $2 =~ ^[0-9]+$ ]] || (($2 < 1)); then
  echo "usage: $0 [--skip-missing] BIN SECONDS [HARNESS...]" >&2
  exit 2
fi
bin=$1 secs=$2
shift 2
# absolute: each harness runs in a scratch directory of its own
[[ -d $bin ]] && bin=$(cd "$bin" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=fuzz-options.sh
source "$here/fuzz-options.sh"
# shellcheck source-path=SCRIPTDIR source=hang-watch.sh
source "$here/hang-watch.sh"
tmo=${FUZZ_TIMEOUT:-25}
fuzz_names "$here" "$@"
names=("${FUZZ_NAMES[@]}")
arts=${FUZZ_ARTIFACTS:-$bin/../fuzz-artifacts}
scratch=$(mktemp -d "${TMPDIR:-/tmp}/lynx-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
failed=0
for h in "${names[@]}"; do
  exe=$bin/fuzz_$h
  if [[ ! -x $exe ]]; then
    if ((skip_missing)); then
      echo "SKIP: $exe is not built (no clang with libFuzzer: see the test fuzz_libfuzzer_build)"
      exit 77
    fi
    echo "fuzz-run: $exe is not built" >&2
    exit 1
  fi
  work=$scratch/$h
  mkdir -p "$work/corpus" "$work/out"
  cp -R "$here/corpus/$h/." "$work/corpus/"
  # per-harness libFuzzer options (-max_len=..., -dict=...)
  fuzz_options "$here" "$h"
  opts=(${FUZZ_OPTS[@]+"${FUZZ_OPTS[@]}"})
  fz_watched "$work/out" "$work/log" "$exe" -max_total_time="$secs" \
    -print_final_stats=1 -timeout="$tmo" -rss_limit_mb=4096 \
    -artifact_prefix="$work/out/" "${opts[@]}" "$work/corpus"
  rc=$?
  execs=$(awk '/stat::number_of_executed_units/ {print $2}' "$work/log" | tail -n 1)
  if ((rc == 0)); then
    line="$h: ${execs:-?} executions in $secs s: ok"
  else
    failed=1
    mkdir -p "$arts/$h"
    found=0 inputs=()
    for a in "$work/out"/crash-* "$work/out"/leak-* "$work/out"/timeout-* \
      "$work/out"/oom-* "$work/out"/slow-unit-*; do
      [[ -f $a ]] || continue
      cp "$a" "$arts/$h/"
      inputs+=("$arts/$h/$(basename "$a")")
      found=1
    done
    if grep -q 'ERROR: libFuzzer: timeout' "$work/log"; then
      hang=$arts/$h/hang-$(date -u +%Y%m%dT%H%M%SZ)
      fz_keep_hang "$work/log" "$work/out" "$hang" "$exe" "$tmo" "${opts[@]}"
      line="$h: ${execs:-?} executions in $secs s: TIMEOUT (exit $rc): ${FZ_VERDICT#TIMEOUT: }; the run's log, every thread's stacks, reruns: $hang/"
    else
      line="$h: ${execs:-?} executions in $secs s: CRASH (exit $rc)"
    fi
    for a in ${inputs[@]+"${inputs[@]}"}; do line+="; input kept: $a"; done
    ((found)) || line+="; no input was written"
    if [[ -n ${hang:-} && -f $hang/log.stacks ]]; then
      echo "---- $h: the stacks of every thread of the hung process ($hang/log.stacks) ----"
      cat "$hang/log.stacks"
    fi
    echo "---- $h: the end of libFuzzer's output ----"
    tail -n 60 "$work/log"
    echo "----"
    hang=
  fi
  echo "$line"
  [[ -n ${FUZZ_SUMMARY:-} ]] && echo "$line" >>"$FUZZ_SUMMARY"
done
exit $failed
