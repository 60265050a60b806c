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
