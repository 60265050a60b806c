#!/usr/bin/env bash
# cppcheck.sh - static analysis of the C sources (HACKING.md, "Checks"):
# cppcheck's warning, portability and performance checks and its errors
# (undefined behaviour, leaks, bad frees, out-of-bounds access, use of
# uninitialised memory), over every file outside tests/ that a build
# compiles. Exit 1 with each finding as FILE:LINE: [id] message; 77 (a
# skip, saying so) without cppcheck.
#
# The chosen set is what a reviewer would act on: style checks (variable
# scope, const parameters, redundant assignments) are left out, as they
# are matters of taste that the format and the review settle. A finding
# that is wrong (cppcheck cannot see an initialisation) is silenced at the
# line with a comment saying why: // cppcheck-suppress ID
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v cppcheck >/dev/null 2>&1; then
  echo "SKIP: cppcheck is not installed (deploy/install-deps.sh test installs it)"
  exit 77
fi
dirs=(common proto transport accel coordinator cli agent frontend bench)
incs=()
for d in "${dirs[@]}"; do incs+=(-I "$d"); done
jobs=$(nproc 2>/dev/null || echo 2)
out=$(cppcheck -q -j "$jobs" --std=c11 --language=c -D__linux__ -D__GNUC__ \
  --enable=warning,portability,performance --inline-suppr \
  --suppress=missingIncludeSystem --error-exitcode=1 \
  --template='{file}:{line}: [{id}] {message}' \
  "${incs[@]}" "${dirs[@]}" 2>&1)
rc=$?
if ((rc != 0)) || [[ -n $out ]]; then
  echo "$out"
  echo "cppcheck: $(grep -c '^[^ ]*:[0-9]*: \[' <<<"$out") finding(s) (cppcheck $(cppcheck --version | awk '{print $2}'))"
  exit 1
fi
echo "cppcheck: ${#dirs[@]} folders, no finding (cppcheck $(cppcheck --version | awk '{print $2}'))"
