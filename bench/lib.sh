# shellcheck shell=bash
# bench/lib.sh - what the bench scripts share (sourced from the repository
# root): the processes a script starts are listed in pids and stopped by
# cleanup, and at exit with $TMP removed.
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap 'cleanup; rm -rf "$TMP"' EXIT

# cpu_ticks PID: utime + stime of the whole process (every thread), in
# clock ticks (getconf CLK_TCK a second).
cpu_ticks() {
  local stat
  stat=$(cat "/proc/$1/stat")
  stat=${stat##*) }
  awk '{ print $12 + $13 }' <<<"$stat"
}

# wait_log FILE PATTERN: until PATTERN is in FILE (up to 10 s); else prints
# FILE and returns 1
wait_log() { # file pattern: up to 10 s
  for _ in $(seq 100); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "timed out waiting for '$2' in $1:"; cat "$1"; return 1
}

# sockperf_pct OUT: "p50 p99" (usec) of a sockperf ping-pong or under-load
# output, 0 for a missing one
sockperf_pct() {
  sed 's/\x1b\[[0-9;]*m//g' "$1" | awk '
    /percentile 50.000 =/ { p50 = $NF } /percentile 99.000 =/ { p99 = $NF }
    END { printf "%s %s\n", (p50 == "" ? 0 : p50), (p99 == "" ? 0 : p99) }'
}

# sockperf_stat OUT FIELD: dropped | replies_per_s
sockperf_stat() {
  sed 's/\x1b\[[0-9;]*m//g' "$1" | awk -v f="$2" '
    /dropped messages =/ { for (i = 1; i <= NF; i++) if ($i == "dropped") d = $(i + 3) }
    /\[Valid Duration\]/ { for (i = 1; i <= NF; i++) {
      if ($i ~ /^RunTime=/) { split($i, a, "="); t = a[2] + 0 }
      if ($i ~ /^ReceivedMessages=/) { split($i, b, "="); r = b[2] + 0 } } }
    END { gsub(";", "", d); if (f == "dropped") print d + 0; else printf "%.0f\n", (t > 0 ? r / t : 0) }'
}
