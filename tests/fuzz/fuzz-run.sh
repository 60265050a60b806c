#!/usr/bin/env bash
# fuzz-run.sh [--skip-missing] BIN SECONDS [HARNESS...]: runs each libFuzzer
# harness BIN/fuzz_<name> (default: every one with a corpus directory in
# tests/fuzz/corpus/) for SECONDS seconds, starting from a scratch copy of
# its corpus, so that the tree is never written to. Fails when any crashed
# (memory error, undefined behaviour, leak, a property of the harness,
# timeout, out of memory): the input that did it is kept in
# FUZZ_ARTIFACTS/<name>/ (default BIN/../fuzz-artifacts) and its run's
# output is shown. `make fuzz` runs it; ctest's fuzz_<name>.libfuzzer
# tests run one harness each for a few seconds.
#
# A line per harness: "<name>: <executions> executions in <s> s: ok" (or
# CRASH). FUZZ_SUMMARY=FILE appends those lines to FILE too.
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
names=("$@")
if ((${#names[@]} == 0)); then
  for d in "$here"/corpus/*/; do names+=("$(basename "$d")"); done
fi
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
  (cd "$work/out" &&
    "$exe" -max_total_time="$secs" -print_final_stats=1 -timeout=25 \
      -rss_limit_mb=4096 -artifact_prefix="$work/out/" "${opts[@]}" \
      "$work/corpus" >"$work/log" 2>&1)
  rc=$?
  execs=$(awk '/stat::number_of_executed_units/ {print $2}' "$work/log" | tail -n 1)
  if ((rc == 0)); then
    line="$h: ${execs:-?} executions in $secs s: ok"
  else
    failed=1
    line="$h: ${execs:-?} executions in $secs s: CRASH (exit $rc)"
    mkdir -p "$arts/$h"
    found=0
    for a in "$work/out"/crash-* "$work/out"/leak-* "$work/out"/timeout-* \
      "$work/out"/oom-* "$work/out"/slow-unit-*; do
      [[ -f $a ]] || continue
      cp "$a" "$arts/$h/"
      line+="; input kept: $arts/$h/$(basename "$a")"
      found=1
    done
    ((found)) || line+="; no input was written"
    echo "---- $h: the end of libFuzzer's output ----"
    tail -n 60 "$work/log"
    echo "----"
  fi
  echo "$line"
  [[ -n ${FUZZ_SUMMARY:-} ]] && echo "$line" >>"$FUZZ_SUMMARY"
done
exit $failed
