#!/usr/bin/env bash
# control_badinput: bad input to the coordinator, on its control port and on
# its JSON API. Each is refused with a clear reason; nothing else is
# disturbed.
#
#  1. Control port (protobuf frames, 4-byte length + lynx.Envelope), each on
#     a new connection: text, random bytes, length headers announcing 100 MB
#     or one byte over the cap, frames that do not decode (garbage, empty,
#     a truncated protobuf inside a whole frame, a whole frame of the cap's
#     size), a frame cut short by the peer's close, a first message that is
#     not a Hello, Hellos with a wrong protocol version, an unknown role or
#     no id, an agent's message before its Register, a Register for another
#     node. The coordinator closes each connection, logs why (and tells the
#     peer in a HelloReply / RegisterReply where the protocol has one), and
#     stays up.
#  2. Epochs, with a hand-made agent: a heartbeat carrying an old epoch
#     closes the connection; a Register with an older epoch is refused.
#  3. Twenty connections of random bytes at once.
#     Afterwards: /healthz and /readyz answer 200, the agent registered
#     before all this is still registered (it never lost its connection),
#     and a new agent registers.
#  4. JSON API: garbage bodies (400, the message names the problem), unknown
#     paths (404), wrong methods (405 with Allow), oversized bodies (413),
#     conflicts (409) - each a JSON {"error": {"code", "message"}} - and the
#     API keeps serving.
#  5. A coordinator with --token-file: an agent with a wrong token or none,
#     and a frontend with a wrong token, are refused: each logs the reason
#     and exits non-zero (retrying cannot heal it), the coordinator logs the
#     refusal; an agent with the token registers. Changes without the
#     bearer token, or with a wrong one, get 401 (JSON, WWW-Authenticate);
#     reads need no token; with the token a change goes through.
#  6. SIGTERM: every daemon exits 0.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init control_badinput
it_require curl timeout head
it_require_coord
pick_ports COORD_PORT API_PORT B_COORD_PORT B_API_PORT SVC_PORT SVC_PORT2
node_ids N1 N2 N3 N4 N5
RAW="${IT_NODE}raw" # hand-made agents (no regions)
CAP=1048576         # the coordinator's default --frame-max
PRE_CAP=4096        # what a peer may send before its Hello passed (LYNX_CTL_UNTRUSTED_MAX)
IT_SOFT=1           # report every refusal that falls short, then fail (it_done)

# ---- helpers ------------------------------------------------------------------

NREF=0
# conn_lines FROM: the coordinator's log lines after line FROM that name our
# connection (127.0.0.1:$CTL_LPORT).
conn_lines() {
  tail -n +"$(($1 + 1))" "$COORD_LOG" | grep -E "127\.0\.0\.1:$CTL_LPORT([^0-9]|$)"
}

# refused WHAT BYTES REASON_ERE [REPLY_TEXT] [close]: sends BYTES (\xHH
# escapes) on a new control connection. The coordinator must close the
# connection within 5 s, log a line naming the connection that matches
# REASON_ERE, stay up, and (with REPLY_TEXT) tell us REPLY_TEXT before it
# closes. With "close" we close our side right after sending (the
# coordinator sees the end of the stream).
refused() {
  local what=$1 bytes=$2 reason=$3 reply=${4:-} mode=${5:-} out from end lines
  NREF=$((NREF + 1))
  out=$IT_DIR/ctl-reply.$NREF.bin
  from=$(wc -l <"$COORD_LOG")
  ctl_open "$COORD_PORT"
  if [[ $bytes == @* ]]; then ctl_write_file "${bytes#@}"; else ctl_write "$bytes"; fi
  if [[ $mode == close ]]; then
    ctl_close
  elif ! ctl_read_until_close "$out" 5; then
    ctl_close
    it_check_failed "$what: the coordinator kept the connection open for 5 s"
    return 1
  else
    ctl_close
  fi
  end=$(($(now_ms) + 3000))
  for (( ; ; )); do
    lines=$(conn_lines "$from")
    if grep -qE -- "$reason" <<<"$lines"; then
      log "ok: $what: $(grep -E -- "$reason" <<<"$lines" | tail -n 1 | cut -c 14-)"
      break
    fi
    if (($(now_ms) >= end)); then
      it_check_failed "$what: the coordinator logged no reason matching /$reason/ for 127.0.0.1:$CTL_LPORT; it logged: ${lines:-nothing}"
      break
    fi
    sleep 0.05
  done
  is_alive "$COORD_PID" || fail "$what: the coordinator died"
  if [[ -n $reply ]]; then
    if tr -d '\000' <"$out" | grep -qaF -- "$reply"; then
      log "ok: $what: the reply says '$reply'"
    else
      it_check_failed "$what: the coordinator's reply does not say '$reply' ($(od -An -c "$out" | head -c 300))"
    fi
  fi
  return 0
}

# hello_reg ROLE HELLO_ID NODE_ID EPOCH: Hello + Register frames, escaped.
hello_reg() {
  local acc reg
  acc=$(pb_bytes 5 "$(pb_uint 1 0)$(pb_string 2 cpu)$(pb_string 3 handmade)")
  reg="$(pb_string 1 "$3")$(pb_string 2 127.0.0.1:1)$(pb_uint 3 "$4")$acc"
  printf '%s%s' "$(pb_frame "$(pb_hello "$1" "$2")")" "$(pb_frame "$(pb_bytes 4 "$reg")")"
}

# http_ok WHAT: the API still answers /healthz with 200.
http_ok() {
  api GET /healthz
  [[ $API_STATUS == 200 ]] || it_check_failed "$1: /healthz answered HTTP $API_STATUS"
}

# ---- 1. bad frames on the control port ----------------------------------------
log "== 1. bad frames on the control port"
start_coordinator --lease-ms 1000
CA=$COORD_PID CA_LOG=$COORD_LOG
start_node_agent "$N1"
A1=$AGENT_PID A1_LOG=$AGENT_LOG

big_hdr='\x05\xf5\xe1\x00' # 100,000,000
# before a Hello has passed, frames are capped at PRE_CAP: a stranger's
# length word never makes the coordinator buffer more
refused "text" 'GARBAGE, not a lynx frame\r\n' "frame larger than the $PRE_CAP-byte cap"
head -c 4096 /dev/urandom >"$IT_DIR/random.bin"
printf '\x9c' | dd of="$IT_DIR/random.bin" bs=1 count=1 conv=notrunc status=none # length > cap
refused "4 KiB of random bytes" "@$IT_DIR/random.bin" "frame larger than the $PRE_CAP-byte cap"
refused "length header announcing 100 MB" "$big_hdr" "frame larger than the $PRE_CAP-byte cap"
{ printf '\x05\xf5\xe1\x00'; head -c 262144 /dev/zero; } >"$IT_DIR/100mb-start.bin"
refused "100 MB frame, the first 256 KiB of it" "@$IT_DIR/100mb-start.bin" \
  "frame larger than the $PRE_CAP-byte cap"
refused "length header one byte over the cap before Hello" '\x00\x00\x10\x01' \
  "frame larger than the $PRE_CAP-byte cap"
# once its Hello passed, a peer may send frames up to --frame-max
refused "a valid Hello, then a length header one byte over --frame-max" \
  "$(pb_frame "$(pb_hello agent "${RAW}f")")"'\x00\x10\x00\x01' \
  "frame larger than the $CAP-byte cap"
refused "frame that does not decode" '\x00\x00\x00\x08\xff\xff\xff\xff\xff\xff\xff\xff' \
  "does not decode"
refused "empty frame (an Envelope without a message)" '\x00\x00\x00\x00' "does not decode"
# a Hello whose length says 12 bytes, inside a frame that has 5 of them
refused "truncated protobuf inside a whole frame" '\x00\x00\x00\x07\x0a\x0c\x08\x01\x12\x05\x61' \
  "does not decode"
{ printf '\x00\x00\x10\x00'; head -c "$PRE_CAP" /dev/zero; } >"$IT_DIR/cap-frame.bin"
refused "a whole frame of the cap's size that does not decode" "@$IT_DIR/cap-frame.bin" \
  "does not decode"
for i in 1 2 3; do # random bodies in well-formed frames
  head -c 64 /dev/urandom >"$IT_DIR/random64.bin"
  { printf '\x00\x00\x00\x40'; cat "$IT_DIR/random64.bin"; } >"$IT_DIR/random-frame.bin"
  refused "64 random bytes in a frame (#$i)" "@$IT_DIR/random-frame.bin" \
    "does not decode|not a Hello|refusing|unknown role|valid id|unexpected"
done
# the peer goes away in the middle of a frame: say so, not just "closed"
refused "frame cut short by the peer's close (64 announced, 10 sent)" \
  '\x00\x00\x00\x40\x0a\x0c\x08\x01\x12\x05\x61\x67\x65\x6e' \
  "frame|truncated|incomplete|partial" "" close
refused "first message is a Heartbeat, not a Hello" "$(pb_frame "$(pb_bytes 6 "$(pb_string 1 x)")")" \
  "first message is not a Hello"
refused "Hello with protocol version 99" "$(pb_frame "$(pb_hello agent "$RAW" "" 99)")" \
  "protocol version 99 not supported" "protocol version 99 not supported"
refused "Hello with an unknown role" "$(pb_frame "$(pb_hello bogus "$RAW")")" \
  "unknown role" "unknown role 'bogus'"
refused "Hello without an id" "$(pb_frame "$(pb_hello agent "")")" \
  "valid id|without.*id|no id" "hello without a valid id"
refused "agent's Heartbeat before its Register" \
  "$(pb_frame "$(pb_hello agent "$RAW")")$(pb_frame "$(pb_bytes 6 "$(pb_string 1 "$RAW")")")" \
  "agent sent message case 6 before Register"
refused "Register for another node than the Hello's" "$(hello_reg agent "${RAW}a" "${RAW}b" 5)" \
  "registers node '${RAW}b' but said hello as '${RAW}a'" "but said hello as"
assert_eq "$(grep -c 'registered from' "$CA_LOG")" 1 "registrations after the bad frames (only $N1)"

# ---- 2. epochs ------------------------------------------------------------------
log "== 2. a hand-made agent: old epochs are refused"
ref0=$(METRICS_PORT=$API_PORT metric lynx_coordinator_refused_epochs_total) || fail "no refused_epochs_total"
ctl_open "$COORD_PORT"
RAW_LPORT=$CTL_LPORT
ctl_write "$(hello_reg agent "$RAW" "$RAW" 1000)"
timeout 1 cat <&"$CTL_FD" >"$IT_DIR/raw-reply.bin"
# the hand-made agent sends no heartbeat, so with a 1 s lease it may be down
# again by now: look for the registration itself, not the current state
wait_log "$CA_LOG" "node $RAW registered from" 3
log "ok: hand-made agent $RAW registered (the test's protobuf encoding is right)"
from=$(wc -l <"$CA_LOG")
ctl_write "$(pb_frame "$(pb_bytes 6 "$(pb_string 1 "$RAW")$(pb_uint 2 999)$(pb_uint 3 1)")")"
ctl_read_until_close "$IT_DIR/raw-reply2.bin" 5 ||
  it_check_failed "heartbeat with an old epoch: the connection stayed open"
ctl_close
wait_log "$CA_LOG" "closing control connection 127.0.0.1:$RAW_LPORT: message carries an old epoch" 3
log "ok: heartbeat with an old epoch: connection closed (message carries an old epoch)"
refused "Register with an epoch older than the node's" "$(hello_reg agent "$RAW" "$RAW" 999)" \
  "epoch 999 is older than 1000" "epoch 999 is older than 1000"
ref1=$(METRICS_PORT=$API_PORT metric lynx_coordinator_refused_epochs_total)
assert_ge "$ref1" $((ref0 + 2)) "coordinator refused_epochs_total"
wait_node_state "$RAW" down 3000 || it_check_failed "hand-made agent $RAW not down after its lease"
api DELETE "/v1/nodes/$RAW"
assert_eq "$API_STATUS" 200 "DELETE /v1/nodes/$RAW (forget the down node)"

# ---- 3. a burst of garbage, then nothing disturbed --------------------------------
log "== 3. twenty connections of random bytes at once"
declare -a burst=()
for i in $(seq 20); do
  (
    exec 3<>"/dev/tcp/127.0.0.1/$COORD_PORT" || exit 1
    { head -c 4096 /dev/urandom >&3; } 2>/dev/null
    timeout 5 cat <&3 >/dev/null 2>&1
  ) &
  burst+=($!)
done
for p in "${burst[@]}"; do wait "$p"; done
sleep 0.2
is_alive "$CA" || fail "the coordinator died under the burst"
log "ok: the coordinator is up after the burst"
api GET /healthz
assert_eq "$API_STATUS" 200 "/healthz after the bad frames"
api GET /readyz
assert_eq "$API_STATUS" 200 "/readyz after the bad frames"
assert_eq "$(node_state "$N1" | grep -c '^ready$')" 1 "$N1 still ready"
assert_eq "$(grep -c 'lost the coordinator' "$A1_LOG")" 0 "$N1's agent never lost the coordinator"
start_node_agent "$N2"
A2=$AGENT_PID
wait_node_state "$N2" ready 3000 || it_check_failed "$N2 not ready (state '$NODE_STATE')"
log "ok: a new agent registers after the bad frames"

# ---- 4. the JSON API ----------------------------------------------------------------
log "== 4. bad requests to the JSON API"
# post_svc WHAT BODY STATUS CODE PART: POST /v1/services with BODY.
post_svc() {
  api POST /v1/services -H 'Content-Type: application/json' --data-binary "$2"
  json_error_check "$1" "$3" "$4" "$5"
}
post_svc "garbage body" '{garbage' 400 invalid_argument "malformed JSON"
post_svc "truncated JSON" "{\"name\":\"t\",\"port\":" 400 invalid_argument "unexpected end of input"
post_svc "empty body" '' 400 invalid_argument "empty body"
post_svc "JSON array body" '[1,2]' 400 invalid_argument "expected a JSON object"
# (the message gives the position of the problem: ' x' is at offset 39)
post_svc "data after the JSON value" "{\"name\":\"t\",\"port\":$SVC_PORT,\"app\":\"echo\"} x" \
  400 invalid_argument "offset 39"
post_svc "port as a string" '{"name":"t","port":"12","app":"echo"}' 400 invalid_argument "port"
post_svc "port out of range" '{"name":"t","port":70000,"app":"echo"}' 400 invalid_argument "port"
post_svc "unknown field" "{\"name\":\"t\",\"port\":$SVC_PORT,\"app\":\"echo\",\"bogus\":1}" \
  400 invalid_argument "bogus"
post_svc "missing name" "{\"port\":$SVC_PORT,\"app\":\"echo\"}" 400 invalid_argument "name"
post_svc "unknown field in placement" \
  "{\"name\":\"t\",\"port\":$SVC_PORT,\"app\":\"echo\",\"placement\":{\"replica\":2}}" \
  400 invalid_argument "placement.replica"
post_svc "nesting 10000 deep" "$(printf '%.0s[' $(seq 10000))" 400 invalid_argument "JSON"
head -c 2048 /dev/urandom >"$IT_DIR/random-body.bin"
printf '\x01' | dd of="$IT_DIR/random-body.bin" bs=1 count=1 conv=notrunc status=none
api POST /v1/services --data-binary "@$IT_DIR/random-body.bin"
json_error_check "2 KiB of random bytes" 400 invalid_argument "JSON"
api GET "/v1/watch?since=abc"
json_error_check "watch since=abc" 400 invalid_argument "since"
http_ok "after the garbage bodies"

for req in "GET /nope" "GET /v1" "GET /v1/nodes/a/b/c" "POST /v1/unknown" "DELETE /v1/frontends/x"; do
  api ${req% *} "${req#* }"
  json_error_check "$req" 404 not_found "${req#* }"
done
api GET "/v1/nodes/nosuchnode"
json_error_check "GET an unknown node" 404 not_found "nosuchnode"
api GET "/v1/services/nosuchsvc"
json_error_check "GET an unknown service" 404 not_found "nosuchsvc"
api DELETE "/v1/services/nosuchsvc"
json_error_check "DELETE an unknown service" 404 not_found "nosuchsvc"
api POST "/v1/nodes/nosuchnode/drain"
json_error_check "drain an unknown node" 404 not_found "nosuchnode"

for req in "PUT /v1/nodes" "DELETE /healthz" "PATCH /v1/services" "POST /v1/accelerators" \
  "DELETE /v1/watch" "GET /v1/nodes/$N1/drain"; do
  api ${req% *} "${req#* }"
  json_error_check "$req" 405 method_not_allowed "${req% *}" &&
    { grep -qi '^allow: ' "$API_HEADERS" || it_check_failed "$req: 405 without an Allow header"; }
done

head -c 100000 /dev/zero | tr '\0' ' ' >"$IT_DIR/big-body.txt"
api POST /v1/services --data-binary "@$IT_DIR/big-body.txt"
json_error_check "100 kB body (Content-Length)" 413 payload_too_large "65536"
api POST /v1/services -H 'Transfer-Encoding: chunked' --data-binary "@$IT_DIR/big-body.txt"
json_error_check "100 kB chunked body" 413 payload_too_large "65536"
http_ok "after the 413s"

svc="{\"name\":\"bad1\",\"port\":$SVC_PORT,\"app\":\"echo\",\"placement\":\"all\"}"
api POST /v1/services -d "$svc"
assert_eq "$API_STATUS" 201 "POST a valid service (the API still takes changes)"
api POST /v1/services -d "$svc"
json_error_check "the same service again" 409 conflict "already exists"
api POST /v1/services -d "{\"name\":\"bad2\",\"port\":$SVC_PORT,\"app\":\"echo\"}"
json_error_check "another service on the same port" 409 conflict "port"
api DELETE /v1/services/bad1
assert_eq "$API_STATUS" 200 "DELETE the service"
assert_eq "$(api_json /v1/services '.items | length')" 0 "services left"
is_alive "$CA" || fail "the coordinator died"
http_ok "at the end of the API checks"

# ---- 5. a coordinator with a token -------------------------------------------------
log "== 5. a coordinator with --token-file"
TOKEN="tok${RANDOM}${RANDOM}x"
echo "$TOKEN" >"$IT_DIR/token" && chmod 600 "$IT_DIR/token"
echo "not-the-token" >"$IT_DIR/wrong-token" && chmod 600 "$IT_DIR/wrong-token"
on_b() { local COORD_PORT=$B_COORD_PORT API_PORT=$B_API_PORT; "$@"; }
COORD_STATE=$IT_DIR/state-b on_b start_coordinator --lease-ms 1000 --token-file "$IT_DIR/token"
CB=$COORD_PID CB_LOG=$COORD_LOG

# refused_peer WHAT PID LOG NODE: PID is refused for its token: it says so and
# exits non-zero; the coordinator logs the refusal.
refused_peer() {
  local what=$1 pid=$2 plog=$3 id=$4
  wait_exit "$pid" 10 || fail "$what did not give up within 10 s"
  ((WAIT_RC != 0)) || it_check_failed "$what exited 0; want non-zero (it cannot heal)"
  log "ok: $what exited $WAIT_RC"
  assert_log "$plog" "refused us: wrong cluster token" "$what says the coordinator refused its token"
  grep -qE "refusing 127\.0\.0\.1:[0-9]+ \([a-z]+ $id\): wrong cluster token" "$CB_LOG" ||
    it_check_failed "$what: the coordinator did not log the refusal of $id"
  log "ok: the coordinator logged: $(grep -m1 -E "refusing .* $id\)" "$CB_LOG" | cut -c 14-)"
}
NOWAIT=1 on_b start_node_agent "$N3" --token-file "$IT_DIR/wrong-token"
refused_peer "agent with a wrong token" "$AGENT_PID" "$AGENT_LOG" "$N3"
NOWAIT=1 on_b start_node_agent "$N4"
refused_peer "agent without a token" "$AGENT_PID" "$AGENT_LOG" "$N4"
IT_SEQ=$((IT_SEQ + 1))
FB_LOG=$IT_DIR/frontend-wrongtoken.$IT_SEQ.log
"$LYNX_BIN_DIR/lynx-frontend" --coordinator "127.0.0.1:$B_COORD_PORT" --bind 127.0.0.1 \
  --frontend-id "${IT_NODE}fe" --token-file "$IT_DIR/wrong-token" >"$FB_LOG" 2>&1 </dev/null &
FB=$!
track "$FB" "lynx-frontend#$IT_SEQ(wrong token)"
refused_peer "frontend with a wrong token" "$FB" "$FB_LOG" "${IT_NODE}fe"
assert_eq "$(on_b ctl nodes --json | jq '.items | length')" 0 "nodes registered with the token coordinator"

on_b start_node_agent "$N5" --token-file "$IT_DIR/token"
A5=$AGENT_PID
assert_eq "$(on_b node_state "$N5" | grep -c '^ready$')" 1 "agent with the right token: ready"

svc="{\"name\":\"tok\",\"port\":$SVC_PORT2,\"app\":\"echo\"}"
on_b api POST /v1/services -d "$svc"
json_error_check "POST without a token" 401 unauthenticated "Authorization" &&
  { grep -qi '^www-authenticate: Bearer' "$API_HEADERS" || it_check_failed "401 without WWW-Authenticate: Bearer"; }
on_b api POST /v1/services -H "Authorization: Bearer not-the-token" -d "$svc"
json_error_check "POST with a wrong token" 401 unauthenticated "wrong token"
on_b api POST /v1/services -H "Authorization: Basic $(printf 'a:%s' "$TOKEN" | base64)" -d "$svc"
json_error_check "POST with Basic instead of Bearer" 401 unauthenticated "Bearer"
on_b api POST "/v1/nodes/$N5/drain"
json_error_check "drain without a token" 401 unauthenticated "Authorization"
on_b api DELETE "/v1/nodes/$N5"
json_error_check "DELETE a node without a token" 401 unauthenticated "Authorization"
on_b api POST /v1/services -H "Authorization: Bearer not-the-token" --data-binary "@$IT_DIR/big-body.txt"
json_error_check "100 kB body with a wrong token" 401 unauthenticated "wrong token"
on_b ctl --token-file "$IT_DIR/wrong-token" service delete tok >"$IT_DIR/lynxctl.out" 2>&1
rc=$?
assert_eq "$rc" 1 "lynxctl with a wrong token: exit status"
assert_log "$IT_DIR/lynxctl.out" "401" "lynxctl with a wrong token names the 401"
assert_eq "$(on_b node_state "$N5" | grep -c '^ready$')" 1 "$N5 still ready (no drain went through)"
on_b api GET /v1/services
assert_eq "$API_STATUS" 200 "GET /v1/services without a token"
assert_eq "$(jq '.items | length' "$API_BODY")" 0 "services after the refused changes"
on_b api POST /v1/services -H "Authorization: Bearer $TOKEN" -d "$svc"
assert_eq "$API_STATUS" 201 "POST with the token"
on_b api DELETE /v1/services/tok -H "Authorization: bearer $TOKEN"
assert_eq "$API_STATUS" 200 "DELETE with the token (scheme in lower case)"
on_b http_ok "token coordinator at the end"

# ---- 6. SIGTERM ---------------------------------------------------------------------
log "== 6. SIGTERM: every daemon exits 0"
for p in "$A1" "$A2" "$A5" "$CA" "$CB"; do
  name=${IT_PIDS[$p]}
  stop "$p" 10
  assert_eq "$WAIT_RC" 0 "$name exit status on SIGTERM"
done
it_done
