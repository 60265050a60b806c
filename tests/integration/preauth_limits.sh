#!/usr/bin/env bash
# preauth_limits: what a stranger on the network can hold of an agent or a
# coordinator before it authenticates (common/connguard.h,
# docs/design.md "Errors and bad input").
#
#  1. 100 data connections each announcing a 4 MiB HELLO and sending 1 MiB
#     of it: each is closed on its header, and the agent's memory does not
#     grow (it buffered what came, up to 4 MiB per connection, before).
#  2. One address opens 20 idle data connections and 20 idle control
#     connections: 8 of each are let in, the rest refused at once and
#     counted by reason on the agent's --metrics; a frontend from another
#     address connects and is served meanwhile.
#  3. Wrong region keys from one address: the first 5 are answered at once,
#     later ones only after a growing delay; counted.
#  4. 300 garbage connections to the coordinator's control port: closed
#     and counted, but logged rate-limited, not one warning each.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init preauth_limits
it_require sockperf curl python3
it_require_coord
pick_ports AGENT_PORT DATA_PORT UDP_PORT METRICS_PORT AMETRICS_PORT COORD_PORT API_PORT

rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
ametric() { METRICS_PORT=$AMETRICS_PORT metric "$@"; }

# py_conns ADDR PORT N MODE HOLD_S [MARK]: N connections from source ADDR to
# 127.0.0.1:PORT; MODE idle (send nothing) or big-hello (a HELLO header
# announcing 4 MiB, then its bytes). Creates the file MARK (if given) once
# all is sent, holds them HOLD_S seconds, then prints "open=<connections
# still open> refused=<closed by the peer>".
py_conns() {
  python3 - "$@" <<'PY'
import socket, struct, sys, time
addr, port, n, mode, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
mark = sys.argv[6] if len(sys.argv) > 6 else None
conns = []
for _ in range(n):
    s = socket.socket()
    s.bind((addr, 0))
    s.connect(("127.0.0.1", port))
    conns.append(s)
    if mode == "big-hello":
        s.settimeout(2)
        # op HELLO, flags, zero, len 4 MiB, off, wr_id (tcp transport header)
        s.sendall(struct.pack("<BBHIQQ", 1, 0, 0, 4 << 20, 0, 0))
        chunk = b"\x01" * 65536  # (not zeros: pages of zeros may not count)
        try:
            for _ in range(16):  # 1 MiB of it, sent within the hello timeout
                s.send(chunk)
        except OSError:
            pass
if mark:
    open(mark, "w").close()
time.sleep(hold)
open_, refused = 0, 0
for s in conns:
    s.setblocking(False)
    try:
        d = s.recv(1)
        refused += 1 if d == b"" else 0
        open_ += 0 if d == b"" else 1
    except BlockingIOError:
        open_ += 1
    except OSError:
        refused += 1
print("open=%d refused=%d" % (open_, refused))
PY
}

# ---- 1. 4 MiB HELLOs ------------------------------------------------------------
log "== 1. 100 connections announcing 4 MiB HELLOs"
start_agent --transport tcp --data-listen "127.0.0.1:$DATA_PORT" \
  --data-unauth-max 1000 --data-unauth-per-client 1000
A=$AGENT_PID
rss0=$(rss_kb "$A")
py_conns 127.0.0.1 "$DATA_PORT" 100 big-hello 3 "$IT_DIR/sent" >"$IT_DIR/big.out" &
BIG=$!
track "$BIG" big-hellos
until [[ -e $IT_DIR/sent ]]; do
  is_alive "$BIG" || fail "the 4 MiB HELLO sender died: $(cat "$IT_DIR/big.out")"
  sleep 0.05
done
sleep 1 # (what the agent would buffer has arrived by now; the senders still hold on)
rss1=$(rss_kb "$A")
wait_exit "$BIG" 20 || fail "the 4 MiB HELLO sender did not finish"
out=$(cat "$IT_DIR/big.out")
log "agent RSS ${rss0} kB -> ${rss1} kB while 100 strangers sent 4 MiB HELLOs ($out)"
assert_lt $((rss1 - rss0)) 32768 "kB the agent's memory grew (1 MiB per stranger before)"
[[ $out == "open=0 refused=100" ]] || it_check_failed "the agent kept strangers' connections: $out"
stop "$A" 10

# ---- 2. caps -----------------------------------------------------------------------
log "== 2. caps on the data and control ports"
start_agent --transport tcp --data-listen "127.0.0.1:$DATA_PORT" \
  --metrics "127.0.0.1:$AMETRICS_PORT"
A=$AGENT_PID A_LOG=$AGENT_LOG
d_out=$(py_conns 127.0.0.2 "$DATA_PORT" 20 idle 1)
c_out=$(py_conns 127.0.0.2 "$AGENT_PORT" 20 idle 1)
log "data port: $d_out; control port: $c_out"
[[ $d_out == "open=8 refused=12" ]] || it_check_failed "data port from one address: $d_out, want open=8 refused=12"
[[ $c_out == "open=8 refused=12" ]] || it_check_failed "control port from one address: $c_out, want open=8 refused=12"
assert_eq "$(ametric lynx_agent_data_connections_refused_total 'reason="per_source"')" 12 \
  "agent data port refusals (per_source)"
assert_eq "$(ametric lynx_agent_control_connections_refused_total 'reason="per_source"')" 12 \
  "agent control port refusals (per_source)"
assert_ge "$(ametric lynx_agent_data_connections_accepted_total)" 8 "agent data connections admitted"
# a stranger holding its share: the frontend from another address gets in
py_conns 127.0.0.2 "$DATA_PORT" 8 idle 4 >/dev/null &
HOLDER=$!
track "$HOLDER" stranger
start_frontend
run_sockperf "$IT_DIR/pp.out" ping-pong -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 1
check_sockperf "$IT_DIR/pp.out"
wait_exit "$HOLDER" 10
n=$(grep -c 'data connection from 127.0.0.2' "$A_LOG")
assert_le "$n" 16 "log lines about the 24 refused data connections of 127.0.0.2 (rate-limited)"

# ---- 3. wrong keys -----------------------------------------------------------------
log "== 3. wrong region keys from one address"
# the protocol version the agent speaks, as the code says it
TCP_VER=$(sed -n 's/^#define TCP_VERSION \([0-9][0-9]*\)u.*/\1/p' \
  "$(dirname "${BASH_SOURCE[0]}")/../../transport/tcp_wire.h")
is_uint "$TCP_VER" || fail "no TCP_VERSION in transport/tcp_wire.h"
python3 - "$DATA_PORT" 8 "$TCP_VER" >"$IT_DIR/keys.out" <<'PY'
import socket, struct, sys, time
port, n, ver = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    s = socket.socket()
    s.bind(("127.0.0.4", 0))
    s.connect(("127.0.0.1", port))
    t0 = time.monotonic()
    # tcp HELLO of the current version: magic, version, 0, region id (here
    # one no region has: a guess), epoch, size, producer
    hello = struct.pack("<IHHQQQQ", 0x3154584C, ver, 0, 0x1234 + i, 1, 4096, 0)
    s.sendall(struct.pack("<BBHIQQ", 1, 0, 0, len(hello), 0, 0) + hello)
    s.settimeout(30)
    reply = s.recv(24)
    err = struct.unpack("<BBHIQQ", reply)[4] if len(reply) == 24 else -1
    print("%d %.3f %d" % (i, time.monotonic() - t0, err))
    s.close()
PY
cat "$IT_DIR/keys.out" >&2
fast=$(awk '$1 < 5 && $2 < 0.9 && $3 == 2' "$IT_DIR/keys.out" | wc -l)
assert_eq "$fast" 5 "wrong keys answered at once with ENOENT (the free allowance)"
slow=$(awk '$1 >= 5 && $2 >= 0.9 && $3 == 2' "$IT_DIR/keys.out" | wc -l)
assert_eq "$slow" 3 "wrong keys answered only after a delay (ENOENT, held back)"
assert_ge "$(ametric lynx_agent_data_auth_failures_total)" 8 "agent wrong credentials counted"
assert_ge "$(ametric lynx_agent_data_auth_delayed_total)" 3 "agent refusals held back"
# the frontend (another address, the right key) was never slowed down
run_sockperf "$IT_DIR/pp2.out" ping-pong -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 1
check_sockperf "$IT_DIR/pp2.out"
stop_daemons

# ---- 4. the coordinator's control port ------------------------------------------
log "== 4. 300 garbage connections to the coordinator's control port"
start_coordinator --control-unauth-per-client 1000 --control-unauth-max 1000
before=$(grep -c 'closing control connection' "$COORD_LOG")
python3 - "$COORD_PORT" 300 <<'PY'
import socket, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
for i in range(n):
    s = socket.socket()
    s.connect(("127.0.0.1", port))
    s.sendall(b"GARBAGE, not a lynx frame\r\n")
    s.settimeout(5)
    try:
        while s.recv(4096):
            pass
    except OSError:
        pass
    s.close()
PY
lines=$(($(grep -c 'closing control connection' "$COORD_LOG") - before))
log "coordinator: $lines log lines for 300 garbage connections"
assert_lt "$lines" 40 "log lines about 300 garbage control connections (rate-limited)"
assert_ge "$(METRICS_PORT=$API_PORT metric lynx_coordinator_control_connections_accepted_total)" 300 \
  "coordinator control connections counted"
grep -q 'similar suppressed' "$COORD_LOG" ||
  it_check_failed "the coordinator's log does not say how many lines it suppressed"
exit 0
