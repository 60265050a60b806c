#!/usr/bin/env bash
# usage_errors: what an operator sees for a mistake, the same in every
# program (common/options.h): exit 2 for a usage error (unknown option, a
# value malformed, out of range or contradicting another), exit 1 for a
# runtime failure (a file that cannot be read, an address that cannot be
# bound, a missing device); the message names the option and the value, and
# nothing waits or retries. A token file or state directory others may read
# is used, with a warning naming it, its mode and the fix.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init usage_errors
it_require_coord
it_require python3 timeout
pick_ports HELD
IT_SOFT=1 # report every message that falls short

# a TCP port another process holds
python3 - "$HELD" <<'PY' &
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(1)
time.sleep(60)
PY
track $! port-holder
until ss -ltn "( sport = :$HELD )" | grep -q LISTEN; do sleep 0.05; done
mkdir -p "$IT_DIR/token-dir"
printf 'secret\n' >"$IT_DIR/token"
chmod 600 "$IT_DIR/token"

# expect WANT_RC PROG ARGS... -- TEXT...: PROG exits WANT_RC within 10 s and
# its output holds every TEXT.
expect() {
  local want=$1 prog=$2 out=$IT_DIR/out.txt rc t
  shift 2
  local -a args=()
  while [[ $1 != -- ]]; do args+=("$1"); shift; done
  shift
  timeout -k 2 "$(ts_s 10)" "$LYNX_BIN_DIR/$prog" "${args[@]}" >"$out" 2>&1 </dev/null
  rc=$?
  if ((rc != want)); then
    it_check_failed "$prog ${args[*]}: exit $rc, want $want; said: $(head -c 400 "$out")"
    return
  fi
  for t in "$@"; do
    grep -qF -- "$t" "$out" ||
      { it_check_failed "$prog ${args[*]}: exit $rc but no '$t' in: $(head -c 400 "$out")"; return; }
  done
  log "ok: $prog ${args[*]}: exit $rc: $(grep -vi '^[0-9:. ]*info' "$out" | head -1)"
}

log "== usage errors: exit 2, option and value named"
expect 2 lynx-agent --listen 127.0.0.1:99999 -- --listen 99999
expect 2 lynx-agent --coordinator coordinator-host -- --coordinator coordinator-host
expect 2 lynx-agent --data-listen 0.0.0.0:70000 -- --data-listen 70000
expect 2 lynx-agent --frobnicate -- --frobnicate
expect 2 lynx-agent --slots 100 -- --slots 100
expect 2 lynx-agent --gpu-idle-ns 2000000 -- --gpu-idle-ns 2000000 1000000
expect 2 lynx-agent --slots 0 -- --slots "'0'"
expect 2 lynx-agent --node-id node-1 -- --node-id node-1
expect 2 lynx-agent --app nope -- --app nope
expect 2 lynx-agent --coordinator 127.0.0.1:1 --app echo -- --app echo
expect 2 lynx-agent --transport carrier-pigeon -- --transport carrier-pigeon
expect 2 lynx-agent --labels zone -- --labels zone
expect 2 lynx-agent --log-level loud -- --log-level loud
expect 2 lynx-frontend --udp 99999 -- --udp 99999
expect 2 lynx-frontend --agent 127.0.0.1:1 --coordinator 127.0.0.1:2 -- \
  --agent 127.0.0.1:1 --coordinator 127.0.0.1:2
expect 2 lynx-frontend --tcp 7000 --framing fixed:0 -- --framing fixed:0
# each mode's options, in the other: refused, not ignored
expect 2 lynx-frontend --coordinator 127.0.0.1:1 --udp 7000 -- \
  "--udp is static mode's" "--coordinator"
expect 2 lynx-frontend --coordinator 127.0.0.1:1 --tcp 7000 -- "--tcp is static mode's"
expect 2 lynx-frontend --coordinator 127.0.0.1:1 --framing fixed:8 -- \
  "--framing is static mode's"
expect 2 lynx-frontend --agent 127.0.0.1:1 --bind 127.0.0.1 -- \
  "--bind is for --coordinator mode"
expect 2 lynx-frontend --udp 7000 --tcp 7001 -- "--udp 7000 and --tcp 7001" \
  "either UDP or TCP"
expect 2 lynx-frontend --framing fixed:16 -- "--framing fixed:16" "needs --tcp"
expect 2 lynx-frontend --metrics localhost -- --metrics localhost
expect 2 lynx-frontend --workers 0 -- --workers "'0'"
expect 2 lynx-frontend --rx iouring -- --rx iouring
expect 2 lynx-coordinator --lease-ms 5 -- --lease-ms "'5'"
# incoherent leases (docs/configuration.md, "Options derived from others"):
# refused before anything is reached, with the value that would do
expect 2 lynx-coordinator --etcd http://127.0.0.1:1 --lease-ms 3000 -- \
  "--lease-ms 3000 cannot ride out a leader failover" "give --lease-ms 8500 or more"
expect 2 lynx-coordinator --etcd http://127.0.0.1:1 --etcd-lease-s 5 --suspect-ms 1500 \
  --lease-ms 9499 -- "give --lease-ms 9500 or more"
expect 2 lynx-coordinator --suspect-ms 4000 --lease-ms 3000 -- \
  "--suspect-ms 4000 is longer than --lease-ms 3000"
expect 2 lynx-coordinator --http x:1 -- --http x:1
expect 2 lynx-coordinator --http-conn-max 10 --http-conn-per-client 100 -- \
  "--http-conn-per-client 100 is more than --http-conn-max 10"
expect 2 lynx-coordinator --log-level loud -- --log-level loud
expect 2 lynxctl frobnicate -- frobnicate

log "== runtime failures: exit 1, what failed named"
expect 1 lynx-agent --token-file "$IT_DIR/no-such-token" -- --token-file "$IT_DIR/no-such-token"
expect 1 lynx-agent --cpu-accels 1 --transport shm --listen "127.0.0.1:$HELD" -- "127.0.0.1:$HELD"
expect 1 lynx-agent --transport rdma --cpu-accels 1 -- --transport rdma
expect 1 lynx-frontend --token-file "$IT_DIR/no-such-token" -- --token-file "$IT_DIR/no-such-token"
expect 1 lynx-frontend --metrics "127.0.0.1:$HELD" -- --metrics "127.0.0.1:$HELD"
expect 1 lynx-coordinator --token-file "$IT_DIR/token-dir" --state-dir "$IT_DIR/st1" -- "is a directory" \
  --token-file "$IT_DIR/token-dir"
expect 1 lynx-coordinator --listen "127.0.0.1:$HELD" --state-dir "$IT_DIR/st2" -- "127.0.0.1:$HELD"
# the API's address: taken, or none of this host's (TEST-NET-1): each
# failure says which
pick_ports P0
expect 1 lynx-coordinator --listen "127.0.0.1:$P0" --http "127.0.0.1:$HELD" \
  --state-dir "$IT_DIR/st3" -- "127.0.0.1:$HELD" "Address already in use" \
  "another process serves that port"
expect 1 lynx-coordinator --listen "127.0.0.1:$P0" --http 192.0.2.1:7780 \
  --state-dir "$IT_DIR/st4" -- "192.0.2.1:7780" "Cannot assign requested address" \
  "no interface of this host has that address"
expect 1 lynxctl --token-file "$IT_DIR/no-such-token" nodes -- "$IT_DIR/no-such-token"
: >"$IT_DIR/empty-token"
expect 1 lynx-frontend --token-file "$IT_DIR/empty-token" -- "$IT_DIR/empty-token" "empty"

# warns WANT PROG ARGS... -- TEXT...: PROG, run until it has logged its
# configuration (each daemon's "config {" line, which comes after every
# check of its files), says every TEXT (WANT 1) or none of them (WANT 0)
# on its output. A PROG that logs no configuration within 10 s (times the
# time scale) fails the check: "no warning" is known only once it is past
# the point where it would have warned.
warns() {
  local want=$1 prog=$2 out=$IT_DIR/warn.txt t pid end
  shift 2
  local -a args=()
  while [[ $1 != -- ]]; do args+=("$1"); shift; done
  shift
  "$LYNX_BIN_DIR/$prog" "${args[@]}" >"$out" 2>&1 </dev/null &
  pid=$!
  end=$(($(now_ms) + $(ts_ms 10000)))
  until grep -qF 'config {' "$out"; do
    if ! is_alive "$pid" || (($(now_ms) >= end)); then
      kill -KILL "$pid" 2>/dev/null
      wait "$pid" 2>/dev/null
      it_check_failed "$prog ${args[*]}: no configuration logged (exited or $(ts_s 10) s): $(head -c 400 "$out")"
      return
    fi
    sleep 0.05
  done
  kill -TERM "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  for t in "$@"; do
    if ((want)) && ! grep -qF -- "$t" "$out"; then
      it_check_failed "$prog ${args[*]}: no warning '$t' in: $(head -c 400 "$out")"
      return
    elif ((!want)) && grep -qF -- "$t" "$out"; then
      it_check_failed "$prog ${args[*]}: a warning '$t' it should not give: $(grep -F -- "$t" "$out")"
      return
    fi
  done
  log "ok: $prog ${args[*]}: $( ((want)) && grep -m1 -F -- "$1" "$out" || echo "no warning")"
}

log "== loose permissions: warned, with the file, its mode and the fix"
printf 'secret\n' >"$IT_DIR/token644" && chmod 644 "$IT_DIR/token644"
printf 'secret\n' >"$IT_DIR/token640" && chmod 640 "$IT_DIR/token640"
pick_ports P1 P2
warns 1 lynx-coordinator --token-file "$IT_DIR/token644" --state-dir "$IT_DIR/st3" \
  --listen "127.0.0.1:$P1" --http "127.0.0.1:$P2" -- \
  "$IT_DIR/token644 can be read by every user (mode 0644)" "chmod 600 $IT_DIR/token644"
warns 1 lynx-agent --token-file "$IT_DIR/token640" --coordinator "127.0.0.1:$P1" -- \
  "$IT_DIR/token640 can be read by its group (mode 0640)"
warns 1 lynx-frontend --token-file "$IT_DIR/token644" --coordinator "127.0.0.1:$P1" -- \
  "can be read by every user (mode 0644)"
warns 0 lynx-frontend --token-file "$IT_DIR/token" --coordinator "127.0.0.1:$P1" -- \
  "can be read by"
mkdir -p "$IT_DIR/st-loose" && chmod 755 "$IT_DIR/st-loose"
warns 1 lynx-coordinator --state-dir "$IT_DIR/st-loose" --listen "127.0.0.1:$P1" \
  --http "127.0.0.1:$P2" -- "--state-dir $IT_DIR/st-loose can be read by every user (mode 0755)" \
  "chmod 700 $IT_DIR/st-loose"
warns 0 lynx-coordinator --state-dir "$IT_DIR/st4" --listen "127.0.0.1:$P1" \
  --http "127.0.0.1:$P2" -- "--state-dir"
it_done
