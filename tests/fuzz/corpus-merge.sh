#!/usr/bin/env bash
# corpus-merge.sh BIN CAMPAIGN [HARNESS...]: what a campaign learned, into
# the tree (docs/testing.md, "Fuzz corpora"). For each libFuzzer harness
# BIN/fuzz_<name> (default: every one with a corpus in tests/fuzz/corpus/):
# libFuzzer's -merge=1 starts from the tree's named files (seed-*, crash-*:
# always kept) and adds, from the tree's learned-* files and the campaign's
# grown corpus (CAMPAIGN/<name>/corpus, campaign.sh's), only the inputs
# that reach coverage those do not; the result replaces the tree's
# learned-* files (learned-<sha1 of the input>), the smallest first up to
# CORPUS_CAP bytes (2 MB) per harness. Prints a line per harness: inputs
# and bytes before and after.
set -uo pipefail
if (($# < 2)); then
  echo "usage: $0 BIN CAMPAIGN [HARNESS...]" >&2
  exit 2
fi
bin=$(cd "$1" && pwd) || exit 2
camp=$2
shift 2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cap=${CORPUS_CAP:-2097152}
# shellcheck source-path=SCRIPTDIR source=fuzz-options.sh
source "$here/fuzz-options.sh"
fuzz_names "$here" "$@"
names=("${FUZZ_NAMES[@]}")
scratch=$(mktemp -d "${TMPDIR:-/tmp}/lynx-merge.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

bytes() { find "$1" -maxdepth 1 -type f ${2:+-name "$2"} -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }'; }
count() { find "$1" -maxdepth 1 -type f ${2:+-name "$2"} | wc -l; }

failed=0
for h in "${names[@]}"; do
  exe=$bin/fuzz_$h tree=$here/corpus/$h grown=$camp/$h/corpus
  [[ -x $exe ]] || { echo "corpus-merge: $exe is not built" >&2; exit 1; }
  [[ -d $tree ]] || { echo "corpus-merge: no $tree" >&2; exit 1; }
  w=$scratch/$h
  mkdir -p "$w/out" "$w/old"
  find "$tree" -maxdepth 1 -type f ! -name 'learned-*' -exec cp {} "$w/out/" \;
  find "$tree" -maxdepth 1 -type f -name 'learned-*' -exec cp {} "$w/old/" \;
  before="$(count "$tree") inputs, $(bytes "$tree") bytes"
  named=$(count "$w/out") named_bytes=$(bytes "$w/out")
  fuzz_options "$here" "$h"
  opts=(${FUZZ_OPTS[@]+"${FUZZ_OPTS[@]}"})
  ins=("$w/old")
  [[ -d $grown ]] && ins+=("$grown")
  if ! "$exe" -merge=1 -timeout=25 -rss_limit_mb=4096 "${opts[@]}" \
    "$w/out" "${ins[@]}" >"$w/log" 2>&1; then
    tail -n 20 "$w/log" >&2
    echo "corpus-merge: $h: the merge failed (above)" >&2
    failed=1
    continue
  fi
  # the files the merge added (named by libFuzzer: the input's sha1)
  find "$tree" -maxdepth 1 -type f -name 'learned-*' -delete
  total=$named_bytes kept=0 dropped=0
  while read -r size f; do
    n=$(basename "$f")
    if ((total + size > cap)); then
      dropped=$((dropped + 1))
      continue
    fi
    total=$((total + size))
    cp "$f" "$tree/learned-$n"
    kept=$((kept + 1))
  done < <(find "$w/out" -maxdepth 1 -type f -regextype posix-extended \
    -regex '.*/[0-9a-f]{40}' -printf '%s %p\n' | sort -n)
  echo "$h: $before -> $(count "$tree") inputs, $(bytes "$tree") bytes ($named named, $kept learned kept, $dropped over the ${cap}-byte cap dropped)"
done
exit "$failed"
