#!/usr/bin/env bash
# tls: the API over HTTPS and the control connections over mutual TLS, with
# a test CA made by deploy/make-test-ca.sh (docs/tls.md).
#
#  1. The script makes a CA and certificates, and a second run changes
#     nothing; a second CA stands for a stranger's.
#  2. A coordinator with --tls-ca/--tls-cert/--tls-key, an agent and a
#     frontend with their certificates: sockperf is served, nothing lost.
#  3. The API over https: lynxctl --cacert and $LYNX_CACERT, curl --cacert;
#     without the CA, or in plain HTTP, it fails (lynxctl says why).
#  4. The control port speaks TLS: gnutls-cli completes a handshake with
#     it, checking its certificate against the CA; without a client
#     certificate it is refused with the reason.
#  5. Refused, counted, and the cluster unharmed: an agent whose certificate
#     another CA signed (it exits 1 saying why), a plain-text agent (told
#     in plain text that TLS is required: it exits 1), garbage in a TLS
#     record (the handshake fails), an agent that does not trust the
#     coordinator's certificate (it says so).
#  6. TLS and a token: both are required (a wrong or missing token is
#     refused over TLS), the right one is served.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init tls
command -v certtool >/dev/null 2>&1 ||
  skip "certtool is not installed (Debian: gnutls-bin; deploy/install-deps.sh)"
it_require sockperf curl gnutls-cli
it_require_coord
pick_ports UDP_PORT METRICS_PORT COORD_PORT API_PORT
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# ---- 1. the CA --------------------------------------------------------------
log "== 1. a test CA made by deploy/make-test-ca.sh"
CA=$IT_DIR/ca
"$SRC/deploy/make-test-ca.sh" "$CA" agent1 frontend1 2>"$IT_DIR/ca.out" ||
  fail "make-test-ca.sh failed: $(cat "$IT_DIR/ca.out")"
for f in ca coordinator agent1 frontend1; do
  [[ -s $CA/$f.pem ]] || fail "make-test-ca.sh made no $f.pem"
done
assert_eq "$(stat -c %a "$CA/agent1-key.pem")" 600 "a key's mode"
sum1=$(cat "$CA"/*.pem | md5sum)
"$SRC/deploy/make-test-ca.sh" "$CA" agent1 frontend1 2>"$IT_DIR/ca2.out"
assert_str "$(cat "$CA"/*.pem | md5sum)" "$sum1" "a second run changes nothing"
"$SRC/deploy/make-test-ca.sh" "$IT_DIR/other" rogue 2>/dev/null ||
  fail "make-test-ca.sh (the other CA) failed"
OTHER=$IT_DIR/other

tls_of() { echo --tls-ca "$CA/ca.pem" --tls-cert "$CA/$1.pem" --tls-key "$CA/$1-key.pem"; }

# ---- 2. a cluster over TLS serves ---------------------------------------------
log "== 2. coordinator, agent and frontend over TLS serve sockperf"
API_SCHEME=https API_CACERT=$CA/ca.pem
# shellcheck disable=SC2046 # the options are words without spaces
start_coordinator $(tls_of coordinator)
assert_log "$COORD_LOG" "over TLS (peers need a certificate the CA signed)" \
  "the coordinator says its control port is TLS"
# shellcheck disable=SC2046
start_node_agent "$IT_NODE" $(tls_of agent1)
A=$AGENT_PID
# shellcheck disable=SC2046
start_coord_frontend $(tls_of frontend1)
serve_service echo "\"port\":$UDP_PORT,\"app\":\"sockperf-echo\""
run_sockperf "$IT_DIR/sp1.out" ping-pong -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 2
check_sockperf "$IT_DIR/sp1.out"

# ---- 3. the API over https -------------------------------------------------------
log "== 3. the API over https"
out=$(ctl nodes) || fail "lynxctl --cacert nodes failed: $out"
grep -q "^$IT_NODE .*ready" <<<"$out" || fail "lynxctl nodes does not list $IT_NODE ready: $out"
log "ok: lynxctl --cacert lists the node"
out=$(LYNX_CACERT=$CA/ca.pem "$LYNX_BIN_DIR/lynxctl" --api "https://localhost:$API_PORT" services) ||
  fail "lynxctl with \$LYNX_CACERT and https://localhost failed: $out"
log "ok: \$LYNX_CACERT, and the certificate names localhost"
code=$(curl -s -o /dev/null -w '%{http_code}' --cacert "$CA/ca.pem" "https://127.0.0.1:$API_PORT/v1/nodes")
assert_eq "$code" 200 "curl --cacert https://.../v1/nodes"
curl -s -o /dev/null "https://127.0.0.1:$API_PORT/v1/nodes"
assert_eq $? 60 "curl without the CA: certificate not trusted (60)"
curl -s -o /dev/null --cacert "$OTHER/ca.pem" "https://127.0.0.1:$API_PORT/v1/nodes"
assert_eq $? 60 "curl trusting another CA (60)"
curl -s -o /dev/null --max-time 5 "http://127.0.0.1:$API_PORT/v1/nodes"
rc=$?
assert_gt "$rc" 0 "plain HTTP to the https API fails (curl's status)"
"$LYNX_BIN_DIR/lynxctl" --api "https://127.0.0.1:$API_PORT" nodes >/dev/null 2>"$IT_DIR/ctl.err"
assert_eq $? 3 "lynxctl without --cacert: unreachable (3)"
assert_log "$IT_DIR/ctl.err" "TLS: is its certificate signed by the CA given with --cacert" \
  "lynxctl says a certificate is the trouble"

# ---- 4. the control port speaks TLS --------------------------------------------
log "== 4. gnutls-cli against the control port"
{ sleep 1; } | timeout 5 gnutls-cli --x509cafile "$CA/ca.pem" -p "$COORD_PORT" 127.0.0.1 \
  >"$IT_DIR/gcli.out" 2>&1
assert_log "$IT_DIR/gcli.out" "Handshake was completed" "a TLS handshake with the control port"
assert_log "$IT_DIR/gcli.out" "The certificate is trusted" "its certificate verifies against the CA"
wait_log "$COORD_LOG" "TLS: presented no client certificate" 5 1 "$COORD_PID"
log "ok: a client without a certificate is refused with the reason"

# ---- 5. refusals ------------------------------------------------------------------
log "== 5. a certificate from another CA, a plain-text agent, an untrusted coordinator"
NOWAIT=1 start_node_agent rogue1 --cpu-accels 1 --tls-ca "$CA/ca.pem" \
  --tls-cert "$OTHER/rogue.pem" --tls-key "$OTHER/rogue-key.pem"
R=$AGENT_PID
wait_exit "$R" 10 || fail "the agent with another CA's certificate did not give up"
assert_eq "$WAIT_RC" 1 "its exit status"
assert_log "$AGENT_LOG" "refused us: TLS: client certificate: The certificate is NOT trusted" \
  "it is told why"
assert_log "$COORD_LOG" "TLS: client certificate: The certificate is NOT trusted" \
  "the coordinator logs why"

NOWAIT=1 start_node_agent plain1 --cpu-accels 1
wait_exit "$AGENT_PID" 10 || fail "the plain-text agent did not give up"
assert_eq "$WAIT_RC" 1 "its exit status"
assert_log "$AGENT_LOG" "refused us: this coordinator speaks TLS only" \
  "a plain-text agent is told, in plain text, that TLS is required"
assert_log "$COORD_LOG" "plain text, not TLS" "the coordinator logs it"
# a client that opens with a TLS record holding an empty ClientHello fails
# the handshake; the coordinator stays up
printf '\x16\x03\x01\x00\x04\x01\x00\x00\x00' | timeout 3 python3 -c '
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(sys.stdin.buffer.read())
s.settimeout(2)
try:
    s.recv(100)
except OSError:
    pass' "$COORD_PORT"
wait_log "$COORD_LOG" "TLS handshake failed" 5 1 "$COORD_PID"
log "ok: garbage in a TLS record fails the handshake"

NOWAIT=1 start_node_agent naive1 --cpu-accels 1 --tls-ca "$OTHER/ca.pem" \
  --tls-cert "$OTHER/rogue.pem" --tls-key "$OTHER/rogue-key.pem"
N=$AGENT_PID
wait_log "$AGENT_LOG" "TLS handshake failed: the peer's certificate: The certificate is NOT trusted" \
  5 1 "$N"
log "ok: an agent that does not trust the coordinator's certificate says so"
stop "$N" 10
curl -sf --cacert "$CA/ca.pem" "https://127.0.0.1:$API_PORT/metrics" >"$IT_DIR/coord.prom" ||
  fail "cannot scrape the coordinator's /metrics"
fails=$(METRICS_FROM=$IT_DIR/coord.prom metric lynx_coordinator_control_auth_failures_total)
assert_ge "$fails" 4 "auth failures counted (no certificate, another CA's, plain text, garbage)"
nodes=$(ctl nodes --json | jq -r '[.items[].id] | sort | join(",")')
assert_str "$nodes" "$IT_NODE" "only the agent with a valid certificate is a node"
run_sockperf "$IT_DIR/sp2.out" ping-pong -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 1
check_sockperf "$IT_DIR/sp2.out"
is_alive "$A" || fail "the agent died"

AGENT_PID=$A
stop_daemons
stop "$COORD_PID" 10
assert_eq "$WAIT_RC" 0 "coordinator exit status on SIGTERM"

# ---- 6. TLS and a token -----------------------------------------------------------
log "== 6. TLS and a token: both required"
printf 'tls-test-token\n' >"$IT_DIR/token"
printf 'not-the-token\n' >"$IT_DIR/wrong"
chmod 600 "$IT_DIR/token" "$IT_DIR/wrong"
# shellcheck disable=SC2046
start_coordinator $(tls_of coordinator) --token-file "$IT_DIR/token"
# shellcheck disable=SC2046
NOWAIT=1 start_node_agent wrong1 --cpu-accels 1 $(tls_of agent1) --token-file "$IT_DIR/wrong"
wait_exit "$AGENT_PID" 10 || fail "the agent with a wrong token did not give up"
assert_log "$AGENT_LOG" "refused us: wrong cluster token" "a wrong token over TLS is refused"
# shellcheck disable=SC2046
NOWAIT=1 start_node_agent none1 --cpu-accels 1 $(tls_of agent1)
wait_exit "$AGENT_PID" 10 || fail "the agent without the token did not give up"
assert_log "$AGENT_LOG" "refused us: wrong cluster token" "no token over TLS is refused"
# shellcheck disable=SC2046
start_node_agent "$IT_NODE" $(tls_of agent1) --token-file "$IT_DIR/token"
log "ok: certificate and token: registered"
stop "$AGENT_PID" 10
stop "$COORD_PID" 10

# ---- usage ----------------------------------------------------------------------
"$LYNX_BIN_DIR/lynx-coordinator" --state-dir "$IT_DIR/s2" --tls-cert "$CA/coordinator.pem" \
  --tls-key "$CA/agent1-key.pem" 2>"$IT_DIR/mismatch.err"
assert_eq $? 2 "a key that does not match: exit 2"
assert_log "$IT_DIR/mismatch.err" "the key does not match the certificate" "it says so"
it_done
