#!/usr/bin/env bash
# client_mqueue: accelerators calling a back end through client mqueues
# (docs/client-mqueues.md), with a real memcached started here.
#
#  1. service kv (app mc-get, back end db = memcached): a stored key is
#     answered with its value, a missing key with an empty payload, an
#     invalid key with ERROR.
#  2. a back end that is down when the service starts: ERROR comes back
#     promptly (not after a timeout); once memcached is up the frontend
#     reconnects (backoff) and the value is served.
#  3. the back end killed mid-run: ERROR promptly, counted as backend_down;
#     memcached back: served again, without restarting anything of ours.
#  4. two tiers: a UDP service (app relay) whose back end is a Lynx TCP
#     service (app echo, len32) answers with the second tier's reply.
#  5. face-verify (paper §6.4): images in memcached, every answer of
#     lynx-face-load checked against its own computation.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init client_mqueue
it_require memcached curl jq timeout
pick_ports COORD_PORT API_PORT METRICS_PORT MC1 MC2 KV1 KV2 T1 T2 FACE

MCD_PID=''
# start_memcached PORT: memcached on 127.0.0.1:PORT (tracked for cleanup)
start_memcached() {
  memcached -p "$1" -U 0 -l 127.0.0.1 -u root -t 1 >"$IT_DIR/memcached-$1.log" 2>&1 &
  MCD_PID=$!
  track "$MCD_PID" "memcached:$1"
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  fail "memcached on port $1 did not start"
}
# mc_set PORT KEY VALUE
mc_set() {
  local r
  exec 3<>"/dev/tcp/127.0.0.1/$1" || fail "cannot reach memcached :$1"
  printf 'set %s 0 0 %d\r\n%s\r\n' "$2" "${#3}" "$3" >&3
  IFS= read -r -t 2 r <&3 || true
  exec 3<&-
  [[ $r == STORED* ]] || fail "memcached :$1 did not store $2: '$r'"
}
# get PORT KEY: sets REPLY_LINE to lynx-kv-get's line for KEY
get() {
  REPLY_LINE=$("$LYNX_BIN_DIR/lynx-kv-get" --target "127.0.0.1:$1" \
    --timeout-ms 3000 "$2") || fail "lynx-kv-get failed"
  log "get $2 -> ${REPLY_LINE:0:120}"
}
ms_of() { sed -E 's/.*ms=([0-9]+).*/\1/' <<<"$REPLY_LINE"; }
# expect_reply PORT KEY REPLY WHAT
expect_reply() {
  get "$1" "$2"
  [[ $REPLY_LINE == "$2"$'\t'"reply=$3"$'\t'* ]] ||
    it_check_failed "$4: got '$REPLY_LINE', want reply=$3"
}
# wait_reply PORT KEY REPLY TIMEOUT_S WHAT: until KEY is answered with REPLY
wait_reply() {
  local end=$(($(now_ms) + $4 * 1000))
  while (($(now_ms) < end)); do
    get "$1" "$2"
    [[ $REPLY_LINE == "$2"$'\t'"reply=$3"$'\t'* ]] && { log "ok: $5"; return 0; }
    sleep 0.2
  done
  it_check_failed "$5: last answer '$REPLY_LINE', want reply=$3"
}
service() { # NAME PORT MEMCACHED_PORT
  api POST /v1/services -H 'Content-Type: application/json' -d "{\"name\":\"$1\",
    \"port\":$2,\"app\":\"mc-get\",\"mqueues_per_accel\":2,\"backends\":[
    {\"name\":\"db\",\"address\":\"127.0.0.1:$3\",\"proto\":\"memcached\"}]}" ||
    fail "API down"
  assert_eq "$API_STATUS" 201 "service $1 created"
}

start_memcached "$MC1"
MC1_PID=$MCD_PID
mc_set "$MC1" k1 hello
mc_set "$MC1" big "$(printf 'v%.0s' $(seq 1500))"
start_coordinator --lease-ms 3000
node_ids N1
start_node_agent "$N1" --cpu-accels 1
start_coord_frontend
# an mc-get without its back end "db" could start nowhere: refused at
# creation, naming what is missing (the agent says what each app calls)
api POST /v1/services -d "{\"name\":\"nodb\",\"port\":$KV1,\"app\":\"mc-get\"}" ||
  fail "API down"
assert_eq "$API_STATUS" 400 "mc-get service without a db back end: HTTP status"
assert_str "$(jq -r .error.code "$API_BODY")" invalid_argument "its error code"
assert_log "$API_BODY" "calls back end 'db', which this service does not give" \
  "the refusal names the missing back end"
api GET /v1/services/nodb
assert_eq "$API_STATUS" 404 "the refused service does not exist"
service kv "$KV1" "$MC1"
wait_log "$FRONTEND_LOG" "in dispatch over" 10 1 "$FRONTEND_PID"

# ---- 1. hit, miss, invalid -----------------------------------------------------------
wait_reply "$KV1" k1 hello 5 "a stored key answered with its value"
expect_reply "$KV1" nokey "" "a missing key: empty payload"
expect_reply "$KV1" "bad key" ERROR "an invalid key: ERROR"
get "$KV1" big
[[ $REPLY_LINE == *$'\t'len=1500$'\t'* ]] || it_check_failed "a 1500-byte value: $REPLY_LINE"

# ---- 2. a back end down at the start ----------------------------------------------
service kv2 "$KV2" "$MC2"
wait_log "$FRONTEND_LOG" "back end db (127.0.0.1:$MC2) down" 10 1 "$FRONTEND_PID"
sleep 0.5
expect_reply "$KV2" k2 ERROR "back end not running: ERROR"
assert_lt "$(ms_of)" "$(ts_ms 200)" "ms until ERROR while the back end is down"
start_memcached "$MC2"
MC2_PID=$MCD_PID
mc_set "$MC2" k2 world
wait_reply "$KV2" k2 world 10 "served once the back end came up"

# ---- 3. the back end killed mid-run ------------------------------------------------------
kill -9 "$MC1_PID"
wait_exit "$MC1_PID" 5 || fail "memcached did not die"
expect_reply "$KV1" k1 ERROR "back end killed: ERROR"
assert_lt "$(ms_of)" "$(ts_ms 200)" "ms until ERROR after the back end died"
down=$(metric lynx_frontend_dropped_total 'reason="backend_down"') || fail "no backend_down counter"
assert_gt "$down" 0 "requests answered 'back end down'"
start_memcached "$MC1"
mc_set "$MC1" k1 again
wait_reply "$KV1" k1 again 10 "served again after the back end returned"

# ---- 4. two tiers over a len32 back end -------------------------------------------------
api POST /v1/services -H 'Content-Type: application/json' -d "{\"name\":\"tier2\",
  \"port\":$T2,\"app\":\"echo\",\"proto\":\"tcp\"}" || fail "API down"
assert_eq "$API_STATUS" 201 "service tier2 (tcp echo) created"
api POST /v1/services -H 'Content-Type: application/json' -d "{\"name\":\"tier1\",
  \"port\":$T1,\"app\":\"relay\",\"mqueues_per_accel\":2,\"backends\":[
  {\"name\":\"next\",\"address\":\"127.0.0.1:$T2\",\"proto\":\"len32\"}]}" ||
  fail "API down"
assert_eq "$API_STATUS" 201 "service tier1 (relay) created"
wait_reply "$T1" through-two-tiers through-two-tiers 10 \
  "answered by the second tier through the first"
expect_reply "$T1" x x "a one-byte request through two tiers"

# ---- 5. face verification ----------------------------------------------------------------------
"$LYNX_BIN_DIR/lynx-face-load" --fill "127.0.0.1:$MC1" --identities 200 --seed 3 \
  >"$IT_DIR/face-fill.out" 2>&1 || { cat "$IT_DIR/face-fill.out"; fail "face fill"; }
api POST /v1/services -H 'Content-Type: application/json' -d "{\"name\":\"face\",
  \"port\":$FACE,\"app\":\"face-verify\",\"mqueues_per_accel\":2,\"backends\":[
  {\"name\":\"db\",\"address\":\"127.0.0.1:$MC1\",\"proto\":\"memcached\"}]}" ||
  fail "API down"
assert_eq "$API_STATUS" 201 "service face created"
wait_log "$FRONTEND_LOG" "serving service face" 10 1 "$FRONTEND_PID"
sleep 1
out=$IT_DIR/face-load.out
"$LYNX_BIN_DIR/lynx-face-load" --target "127.0.0.1:$FACE" --udp --closed-loop 2 \
  --seconds 2 --identities 200 --seed 3 --impostor-percent 50 >"$out" 2>&1 ||
  { cat "$out"; it_check_failed "face-verify answers (lynx-face-load exit status)"; }
log "$(tail -1 "$out")"
grep -q ' wrong=0 ' "$out" || it_check_failed "face-verify: wrong answers"
grep -qE ' answered=[1-9]' "$out" || it_check_failed "face-verify: nothing answered"
assert_eq "$(grep -cF ': starting in ' "$FRONTEND_LOG")" 1 "frontend starts (no restart)"
it_done
