#!/usr/bin/env bash
# check-format.sh - is every C, header and CUDA file of the tree formatted
# as .clang-format says? (HACKING.md, "Format")
#
#   tools/check-format.sh          lists the files that are not, and a diff
#                                  of the first few; exit 1 if any
#   tools/check-format.sh --fix    formats them in place
#
# The files are git's (tracked and untracked, not ignored), or every such
# file under the tree without git. clang-format 14 is what .clang-format
# was written for: another version is not used (it may break a few lines
# elsewhere); without it the check is skipped (exit 77), saying so.
set -uo pipefail
cd "$(dirname "$0")/.."
fix=0
[[ ${1:-} == --fix ]] && fix=1

cf=""
for c in clang-format-14 clang-format; do
  if command -v "$c" >/dev/null 2>&1 &&
    "$c" --version 2>/dev/null | grep -q 'version 14\.'; then
    cf=$c
    break
  fi
done
if [[ -z $cf ]]; then
  echo "SKIP: clang-format 14 is not installed (deploy/install-deps.sh test installs clang-format-14)"
  exit 77
fi

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files --cached --others --exclude-standard \
    -- '*.c' '*.h' '*.cu' '*.cuh' | while read -r f; do [[ -f $f ]] && echo "$f"; done)
else
  mapfile -t files < <(find . -path ./.git -prune -o -path './build*' -prune \
    -o -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) \
    -print | sed 's|^\./||' | sort)
fi
if ((${#files[@]} == 0)); then
  echo "check-format: no source files found" >&2
  exit 1
fi

if ((fix)); then
  "$cf" -i --style=file "${files[@]}"
  echo "check-format: ${#files[@]} files formatted with $cf"
  exit 0
fi

# one run over every file: each departure is a "FILE:LINE:COL: error:
# code should be clang-formatted" line on stderr
out=$("$cf" --style=file --dry-run -Werror "${files[@]}" 2>&1)
rc=$?
mapfile -t bad < <(sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: error: code should be clang-formatted.*/\1/p' <<<"$out" | sort -u)
if ((rc != 0 && ${#bad[@]} == 0)); then
  echo "check-format: $cf failed (exit $rc):" >&2
  echo "$out" | head -20 >&2
  exit 1
fi
if ((${#bad[@]} == 0)); then
  echo "check-format: ${#files[@]} files, all formatted as .clang-format says ($cf)"
  exit 0
fi
echo "check-format: ${#bad[@]} of ${#files[@]} files are not formatted as .clang-format says:"
printf '  %s\n' "${bad[@]}"
for f in "${bad[@]:0:3}"; do
  "$cf" --style=file "$f" | diff -u --label "$f" --label "$f (formatted)" "$f" - | head -40
done
echo "check-format: tools/check-format.sh --fix formats them"
exit 1
