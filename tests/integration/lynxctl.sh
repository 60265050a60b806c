#!/usr/bin/env bash
# lynxctl: the operator's command line as a new operator uses it (issue 32):
# a coordinator, an agent (one CPU accelerator, zone=a) and a frontend.
#
#  1. service create takes every field of the API's body: --backend
#     NAME=HOST:PORT[/PROTO] (repeatable, the proto len32 by default),
#     --proto tcp --framing fixed:N, --slots, --slot-size, --msg-max,
#     --work-us, --mqueues, --replicas, --selector alone (every accelerator
#     of the matching nodes); the API has them as given. Wrong forms are
#     usage errors (2), an address the API refuses is exit 1 naming it.
#  2. services: FRAMING and BACKENDS columns.
#  3. service show NAME: the fields, the back ends, where the ready
#     instances run (node, accelerator, mqueues, frontend, as /v1/mqueues
#     has them); an unmatched service says why and that none is ready;
#     --json is the API's object; an unknown service is exit 1.
#  4. --api A,B: the first dead (nothing listens), the second serves: reads,
#     a change, $LYNX_API and top work; both dead: exit 3 naming both with
#     what each said; a coordinator that answers 503 no_leader is passed
#     over, and when nothing else answers its 503 is exit 1 with both.
#  5. http:// against an HTTPS API and https:// against a plain one: exit 3
#     with a hint to the other scheme (a test CA by deploy/make-test-ca.sh;
#     skipped, 77, when certtool is missing).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init lynxctl
it_require_coord
it_require python3
pick_ports COORD_PORT API_PORT METRICS_PORT KV_PORT TK_PORT PEND_PORT MC_PORT \
  UP_PORT DEAD DEAD2 FAKE TLS_CTL TLS_API
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
LIVE=$(api_url)
CTL=$LYNX_BIN_DIR/lynxctl

# expect_rc WANT WHAT CMD...: CMD's exit status is WANT; its stdout in OUT,
# its stderr in ERR (files)
OUT=$IT_DIR/ctl.out ERR=$IT_DIR/ctl.err
expect_rc() {
  local want=$1 what=$2
  shift 2
  "$@" >"$OUT" 2>"$ERR"
  local rc=$?
  if ((rc != want)); then
    it_check_failed "$what: exit $rc, want $want; stdout: $(head -c 600 "$OUT"); stderr: $(head -c 600 "$ERR")"
    return 1
  fi
  log "ok: $what: exit $rc"
}
# has FILE TEXT WHAT: FILE holds the fixed string TEXT
has() { assert_log "$1" "$2" "$3"; }
# has_re FILE REGEX WHAT: a line of FILE matches the extended REGEX
has_re() {
  grep -qE -- "$2" "$1" || { it_check_failed "$3: no line matching '$2' in: $(cat "$1")"; return 1; }
  log "ok: $3"
}
# column FILE ROWKEY HEADER: the cell of the table in FILE (lynxctl's; its
# header the first line with a cell HEADER) in column HEADER of the row
# whose first cell is ROWKEY (cells before any with blanks: a whitespace
# split)
column() {
  awk -v key="$2" -v col="$3" '
    !c { for (i = 1; i <= NF; i++) if ($i == col) c = i; next }
    $1 == key { print $c; exit }' "$1"
}

start_coordinator --lease-ms 3000
node_ids N1
start_node_agent "$N1" --cpu-accels 1 --labels zone=a
start_coord_frontend
FE=$(api_json /v1/frontends '.items[0].id')
[[ -n $FE && $FE != null ]] || fail "no frontend listed"

# ---- 1. service create -------------------------------------------------------
log "== 1. service create with --backend and the other fields"
expect_rc 0 "create kv (udp mc-get, back end db, selector alone)" \
  ctl service create --name kv --port "$KV_PORT" --app mc-get --mqueues 2 \
  --backend "db=127.0.0.1:$MC_PORT/memcached" --selector zone=a
has "$OUT" "service kv created" "create says so"
cp "$OUT" "$IT_DIR/create-kv.out"
assert_str "$(column "$IT_DIR/create-kv.out" kv BACKENDS)" db "the created row's BACKENDS"
expect_rc 0 "create tk (tcp fixed:16, two back ends, every sizing option)" \
  ctl service create --name tk --port "$TK_PORT" --app echo --proto tcp \
  --framing fixed:16 --slots 64 --slot-size 4096 --msg-max 8192 --work-us 5 \
  --mqueues 3 --replicas 1 --backend "up=127.0.0.1:$UP_PORT" \
  --backend="mc=127.0.0.1:$MC_PORT/memcached"
api_json /v1/services/kv . >"$IT_DIR/kv.json" || fail "GET /v1/services/kv"
api_json /v1/services/tk . >"$IT_DIR/tk.json" || fail "GET /v1/services/tk"
assert_str "$(jq -c .backends "$IT_DIR/kv.json")" \
  "[{\"name\":\"db\",\"address\":\"127.0.0.1:$MC_PORT\",\"proto\":\"memcached\"}]" "kv's backends"
assert_str "$(jq -c .placement "$IT_DIR/kv.json")" '{"selector":{"zone":"a"}}' \
  "kv's placement (a selector alone)"
assert_str "$(jq -r '[.proto, .mqueues_per_accel] | join(" ")' "$IT_DIR/kv.json")" "udp 2" \
  "kv's proto and mqueues"
assert_str "$(jq -c .backends "$IT_DIR/tk.json")" \
  "[{\"name\":\"up\",\"address\":\"127.0.0.1:$UP_PORT\",\"proto\":\"len32\"},{\"name\":\"mc\",\"address\":\"127.0.0.1:$MC_PORT\",\"proto\":\"memcached\"}]" \
  "tk's backends (len32 by default, --backend= form, in order)"
assert_str "$(jq -r '[.proto, (.framing | tojson), .slots, .slot_size, .msg_max, .work_us, .mqueues_per_accel, (.placement | tojson)] | join(" ")' "$IT_DIR/tk.json")" \
  'tcp {"fixed":16} 64 4096 8192 5 3 {"replicas":1,"selector":{}}' \
  "tk's proto, framing, slots, slot_size, msg_max, work_us, mqueues, placement"
expect_rc 0 "create pend (a selector no node matches)" \
  ctl service create --name pend --port "$PEND_PORT" --app echo --placement all --selector zone=b
assert_str "$(api_json /v1/services/pend '.placement | tojson')" '{"selector":{"zone":"b"}}' \
  "--placement all --selector: the selector is sent"

expect_rc 2 "--backend without a value" ctl service create --name x --port 1 --app echo --backend
has "$ERR" "--backend needs a value" "it says so"
expect_rc 2 "--backend without NAME=" ctl service create --name x --port 1 --app echo --backend 127.0.0.1:1
has "$ERR" "expected NAME=HOST:PORT[/PROTO]" "it says the form"
expect_rc 2 "--framing on a udp service" ctl service create --name x --port 1 --app echo --framing len32
has "$ERR" "--framing goes with --proto tcp" "it says so"
expect_rc 2 "--proto sctp" ctl service create --name x --port 1 --app echo --proto sctp
expect_rc 2 "-f with --backend" ctl service create -f /dev/null --backend db=127.0.0.1:1
expect_rc 1 "a back end the API refuses" ctl service create --name x --port 1 --app echo \
  --backend db=not-an-address
has "$ERR" "backends[0].address" "the API's refusal names the field"
api GET /v1/services/x
assert_eq "$API_STATUS" 404 "no service x was made"

# ---- 2. the services table ---------------------------------------------------------
log "== 2. lynxctl services: FRAMING and BACKENDS"
expect_rc 0 "services" ctl services
cp "$OUT" "$IT_DIR/services.out"
head -1 "$IT_DIR/services.out" | grep -qE '^NAME +PROTO +FRAMING +PORT +APP .* BACKENDS +PLACEMENT ' ||
  it_check_failed "the services header: $(head -1 "$IT_DIR/services.out")"
assert_str "$(column "$IT_DIR/services.out" kv FRAMING)" - "kv's FRAMING (udp: none)"
assert_str "$(column "$IT_DIR/services.out" kv BACKENDS)" db "kv's BACKENDS"
assert_str "$(column "$IT_DIR/services.out" tk FRAMING)" fixed:16 "tk's FRAMING"
assert_str "$(column "$IT_DIR/services.out" tk BACKENDS)" up,mc "tk's BACKENDS"
assert_str "$(column "$IT_DIR/services.out" pend BACKENDS)" - "pend's BACKENDS (none)"
assert_str "$(column "$IT_DIR/services.out" tk PORT)" "$TK_PORT" "tk's PORT (columns in step)"

# ---- 3. service show ----------------------------------------------------------------
log "== 3. service show"
end=$(($(now_ms) + 10000))
until [[ $(api_json /v1/services/kv .state) == ready &&
  $(api_json /v1/mqueues '[.items[] | select(.service == "kv" and .frontend != "")] | length') -gt 0 ]]; do
  (($(now_ms) < end)) || fail "kv not ready with a producing frontend within 10 s: $(cat "$API_BODY")"
  sleep 0.1
done
expect_rc 0 "service show kv" ctl service show kv
cp "$OUT" "$IT_DIR/show-kv.out"
has_re "$OUT" '^name: +kv$' "show: name"
has_re "$OUT" '^state: +ready$' "show: state"
has_re "$OUT" '^reason: +-$' "show: no reason when ready"
has_re "$OUT" '^proto: +udp$' "show: proto"
has_re "$OUT" '^framing: +-$' "show: framing (none for udp)"
has_re "$OUT" "^port: +$KV_PORT\$" "show: port"
has_re "$OUT" '^app: +mc-get$' "show: app"
has_re "$OUT" '^slot-size: +2048 bytes$' "show: slot size (the default)"
has_re "$OUT" '^slots: +256 per ring$' "show: slots"
has_re "$OUT" '^msg-max: +65507 bytes$' "show: msg-max (udp's)"
has_re "$OUT" '^mqueues: +2 per accelerator$' "show: mqueues"
has_re "$OUT" '^work-us: +0$' "show: work-us"
has_re "$OUT" '^placement: +all where zone=a$' "show: placement"
has_re "$OUT" '^instances: +1 ready of 1 wanted, 0 failed start\(s\)$' "show: instances"
has_re "$OUT" '^backends: +1$' "show: back ends counted"
has_re "$OUT" '^BACKEND +ADDRESS +PROTO$' "show: the back-end table"
has_re "$OUT" "^db +127\\.0\\.0\\.1:$MC_PORT +memcached\$" "show: back end db"
has_re "$OUT" '^INSTANCE +NODE +ACCEL +MQUEUES +TRANSPORT +FRONTEND +DISPATCH ' "show: the instance table"
want_mq=$(api_json /v1/mqueues '[.items[] | select(.service == "kv")] | length')
want_inst=$(api_json /v1/mqueues '[.items[] | select(.service == "kv")][0].instance')
assert_gt "$want_mq" 2 "kv's mqueues in /v1/mqueues (2 server + 1 client)"
row=$(awk -v n="$N1" '$2 == n' "$IT_DIR/show-kv.out")
read -r r_inst r_node r_accel r_mq r_tr r_fe r_disp _ <<<"$row"
assert_str "${r_inst:-}/${r_node:-}/${r_accel:-}" "$want_inst/$N1/0" "show: where the instance runs"
assert_str "${r_mq:-}" "$want_mq" "show: its mqueues, as /v1/mqueues lists them"
assert_str "${r_tr:-}" "$IT_TRANSPORT" "show: its transport"
assert_str "${r_fe:-}" "$FE" "show: the frontend producing into it"
assert_str "${r_disp:-}" yes "show: in the dispatch table"

expect_rc 0 "service show tk" ctl service show tk
has_re "$OUT" '^proto: +tcp$' "show tk: proto"
has_re "$OUT" '^framing: +fixed:16$' "show tk: framing"
has_re "$OUT" '^placement: +replicas=1$' "show tk: placement"
has_re "$OUT" '^backends: +2$' "show tk: two back ends"
has_re "$OUT" "^up +127\\.0\\.0\\.1:$UP_PORT +len32\$" "show tk: back end up, len32"
has_re "$OUT" "^mc +127\\.0\\.0\\.1:$MC_PORT +memcached\$" "show tk: back end mc"

expect_rc 0 "service show pend" ctl service show pend
has_re "$OUT" '^state: +pending$' "show pend: pending"
has_re "$OUT" '^reason: +no ready node matches' "show pend: why"
has_re "$OUT" '^backends: +none$' "show pend: no back end"
has_re "$OUT" '^no instance is ready$' "show pend: no instance"

expect_rc 0 "--json service show kv" ctl --json service show kv
api GET /v1/services/kv
assert_str "$(jq -S -c . "$OUT")" "$(jq -S -c . "$API_BODY")" "--json service show: the API's object"
expect_rc 1 "service show of an unknown service" ctl service show nosuch
has "$ERR" "service 'nosuch' not found (HTTP 404, not_found)" "it says so"
expect_rc 2 "service show without a name" ctl service show
has "$ERR" "'show NAME'" "the usage error names the form"

# ---- 4. several addresses ------------------------------------------------------------
log "== 4. --api DEAD,LIVE"
expect_rc 0 "nodes with --api DEAD,LIVE" "$CTL" --api "http://127.0.0.1:$DEAD,$LIVE" nodes
has_re "$OUT" "^$N1 +ready " "the node, from the second address"
expect_rc 0 "services with \$LYNX_API=DEAD,LIVE" env LYNX_API="127.0.0.1:$DEAD, $LIVE" "$CTL" services
has_re "$OUT" '^kv ' "the services, from the second address"
expect_rc 0 "a change with --api DEAD,LIVE" "$CTL" --api "127.0.0.1:$DEAD,$LIVE" service delete pend
api GET /v1/services/pend
assert_eq "$API_STATUS" 404 "pend deleted through the second address"
expect_rc 0 "top -b -n 1 with --api DEAD,LIVE" "$CTL" --api "127.0.0.1:$DEAD,$LIVE" top -b -n 1
has "$OUT" "lynxctl top: $LIVE  registry version" "top's header names the address that answers"
has_re "$OUT" "^$N1/0 +ready " "top lists the accelerator"

expect_rc 3 "nodes with both addresses dead" "$CTL" --api "127.0.0.1:$DEAD,127.0.0.1:$DEAD2" nodes
has "$ERR" "cannot reach the coordinator at any of http://127.0.0.1:$DEAD, http://127.0.0.1:$DEAD2:" \
  "the error names both"
has_re "$ERR" "^  http://127\\.0\\.0\\.1:$DEAD: .*port $DEAD" "what the first said"
has_re "$ERR" "^  http://127\\.0\\.0\\.1:$DEAD2: .*port $DEAD2" "what the second said"
expect_rc 3 "top -b with both addresses dead" "$CTL" --api "127.0.0.1:$DEAD,127.0.0.1:$DEAD2" top -b -n 1
has "$ERR" "http://127.0.0.1:$DEAD2: " "top's error names the second too"
expect_rc 2 "--api with an empty address" "$CTL" --api "127.0.0.1:$DEAD,,$LIVE" nodes
has "$ERR" "an empty address" "it says so"
expect_rc 2 "\$LYNX_API with an empty address" env LYNX_API="$LIVE," "$CTL" nodes
has "$ERR" "\$LYNX_API: an empty address" "it names \$LYNX_API"

# a coordinator that knows of no leader (a follower cut off from etcd
# answers so: docs/etcd.md), played by a few lines of Python
python3 -c '
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def reply(self):
        b = b"{\"error\":{\"code\":\"no_leader\",\"message\":\"no coordinator leads (etcd has no quorum); retry\"}}\n"
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    do_GET = do_POST = do_DELETE = reply
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()' "$FAKE" \
  >"$IT_DIR/fake.log" 2>&1 </dev/null &
FAKE_PID=$!
track "$FAKE_PID" fake-no-leader
end=$(($(now_ms) + 5000))
until curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$FAKE/"; do
  (($(now_ms) < end)) || fail "the no_leader stand-in does not answer: $(cat "$IT_DIR/fake.log")"
  sleep 0.05
done
expect_rc 0 "nodes with --api NO_LEADER,LIVE" "$CTL" --api "127.0.0.1:$FAKE,$LIVE" nodes
has_re "$OUT" "^$N1 +ready " "the node, from the coordinator that answers"
expect_rc 1 "nodes with --api NO_LEADER,DEAD" "$CTL" --api "127.0.0.1:$FAKE,127.0.0.1:$DEAD" nodes
has "$ERR" "lynxctl: no coordinator leads (etcd has no quorum); retry (HTTP 503, no_leader)" \
  "the 503's message first"
has_re "$ERR" "^  http://127\\.0\\.0\\.1:$FAKE: no coordinator leads .*no_leader" "what the first said"
has_re "$ERR" "^  http://127\\.0\\.0\\.1:$DEAD: .*port $DEAD" "what the second said"
expect_rc 1 "one address answering 503: as it is" "$CTL" --api "127.0.0.1:$FAKE" nodes
has "$ERR" "(HTTP 503, no_leader)" "its message"
stop "$FAKE_PID" 5

# ---- 5. http:// vs https:// --------------------------------------------------------
log "== 5. the wrong scheme"
expect_rc 3 "https:// against the plain API" "$CTL" --api "https://127.0.0.1:$API_PORT" nodes
has "$ERR" "the coordinator may serve plain HTTP: try --api http://127.0.0.1:$API_PORT" \
  "the hint to http://"
command -v certtool >/dev/null 2>&1 ||
  skip "certtool is not installed (Debian: gnutls-bin; deploy/install-deps.sh): the https API part not run"
CA=$IT_DIR/ca
"$SRC/deploy/make-test-ca.sh" "$CA" 2>"$IT_DIR/ca.out" ||
  fail "make-test-ca.sh failed: $(cat "$IT_DIR/ca.out")"
spawn_daemon lynx-coordinator coord-tls "(tls)" --listen "127.0.0.1:$TLS_CTL" \
  --http "127.0.0.1:$TLS_API" --state-dir "$IT_DIR/state-tls" \
  --tls-cert "$CA/coordinator.pem" --tls-key "$CA/coordinator-key.pem"
TLS_PID=$SPAWN_PID
wait_log "$SPAWN_LOG" "serving control on" 10 1 "$TLS_PID"
end=$(($(now_ms) + 5000))
until curl -sf --max-time 2 --cacert "$CA/ca.pem" "https://localhost:$TLS_API/readyz" >/dev/null; do
  (($(now_ms) < end)) || fail "the https coordinator is not ready within 5 s"
  sleep 0.05
done
expect_rc 0 "https:// with --cacert" "$CTL" --api "https://localhost:$TLS_API" --cacert "$CA/ca.pem" services
expect_rc 3 "http:// against the https API" "$CTL" --api "http://127.0.0.1:$TLS_API" nodes
has "$ERR" "cannot reach the coordinator at http://127.0.0.1:$TLS_API: Empty reply from server" \
  "curl's words"
has "$ERR" "the coordinator may serve HTTPS: try --api https://127.0.0.1:$TLS_API with --cacert" \
  "the hint to https://"
expect_rc 3 "http:// (https API) and a dead address" "$CTL" \
  --api "127.0.0.1:$TLS_API,127.0.0.1:$DEAD" nodes
has_re "$ERR" "^  http://127\\.0\\.0\\.1:$TLS_API: Empty reply" "the https address's line"
has "$ERR" "    (no answer to plain HTTP: the coordinator may serve HTTPS: try --api https://127.0.0.1:$TLS_API" \
  "its hint under it"
expect_rc 0 "DEAD,https:// with --cacert" "$CTL" --cacert "$CA/ca.pem" \
  --api "127.0.0.1:$DEAD,https://localhost:$TLS_API" nodes
stop "$TLS_PID" 10
assert_eq "$WAIT_RC" 0 "the https coordinator's exit status on SIGTERM"

stop_daemons
stop "$COORD_PID" 10
assert_eq "$WAIT_RC" 0 "coordinator exit status on SIGTERM"
it_done
