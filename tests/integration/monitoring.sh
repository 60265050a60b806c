#!/usr/bin/env bash
# monitoring: deploy/monitoring/ (deploy/monitoring/README.md, docs/operations.md).
#
#  1. The files: `promtool check rules` and `check config` on the alert rules
#     and the example prometheus.yml, `promtool test rules` on the rules'
#     unit tests; check.py: every alert has expr, for, severity, summary,
#     description and a runbook_url whose anchor is a heading of
#     docs/operations.md; the dashboard's structure, and every one of its
#     queries (variables substituted) parsed by promtool as PromQL.
#     Skipped (77) as a whole without promtool (Debian's prometheus
#     package) or python3-yaml: no part of the checks is left out.
#  2. A live coordinator, agent (2 CPU accelerators, --metrics) and
#     frontend with two sockperf-echo services, each under sockperf
#     ping-pong, and a TCP echo service under lynx-tcp-load: `promtool
#     check metrics` on the three scrapes; check.py
#     exposition (every family's samples in one group, each after its
#     TYPE; promtool does not check this); every lynx_ metric the dashboard
#     and the rules use is in a scrape; lynx_frontend_request_duration_seconds
#     per service and lynx_agent_accel_{queue,service}_seconds per
#     accelerator are cumulative with +Inf = _count, the frontend's _count =
#     lynx_frontend_responded_total per service; the accelerators ran
#     (service _count) every request the frontend dispatched.
#  3. Each check refuses a broken copy: PromQL that does not parse (rules,
#     dashboard), a rule without a runbook_url or with a runbook anchor the
#     docs lack, a threshold the unit tests catch, a dashboard variable that
#     is not defined, a misspelled metric, a histogram that is not
#     cumulative or whose _count is off, a family split in two, a second
#     TYPE line (promtool check metrics).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init monitoring
it_require python3 sockperf curl timeout
it_require_coord
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
MON=$SRC/deploy/monitoring
PROM=$MON/prometheus
DASH=$MON/grafana/lynx.json
RULES=$PROM/lynx-alerts.yml
OPS=$SRC/docs/operations.md
CHECK=(python3 "$MON/check.py")
# both are installed by deploy/install-deps.sh test: without either, the
# test skips as a whole rather than check part of the files
PROMTOOL=promtool
it_require promtool
python3 -c 'import yaml' 2>/dev/null ||
  skip "python3-yaml is not installed (deploy/install-deps.sh test)"
IT_SOFT=1

# ok WHAT CMD...: CMD must pass; its last line is logged.
ok() {
  local what=$1 out
  shift
  if ! out=$("$@" 2>&1); then
    echo "$out" >&2
    it_check_failed "$what"
    return 1
  fi
  log "ok: $what: $(grep -v '^\s*$' <<<"$out" | tail -1 | sed 's/^ *//')"
}
# refused WHAT PATTERN CMD...: CMD must fail, saying PATTERN (an extended
# regex): the check can fail, for the reason meant.
refused() {
  local what=$1 pat=$2 out
  shift 2
  if out=$("$@" 2>&1); then
    echo "$out" >&2
    it_check_failed "$what: the check passed it"
    return 1
  fi
  if ! grep -qE -- "$pat" <<<"$out"; then
    echo "$out" >&2
    it_check_failed "$what: refused, but not for '$pat'"
    return 1
  fi
  log "ok: refused $what: $(grep -m1 -E -- "$pat" <<<"$out" | sed 's/^ *//' | cut -c1-200)"
}
# sedcopy SRC DST SED_EXPR: DST is SRC edited, and differs from it.
sedcopy() {
  sed -e "$3" "$1" >"$2"
  cmp -s "$1" "$2" && fail "sedcopy: '$3' changed nothing in $(basename "$1")"
  return 0
}

# ---- 1. the files ------------------------------------------------------------

ok "promtool check rules lynx-alerts.yml" "$PROMTOOL" check rules "$RULES"
ok "promtool check config prometheus.yml" "$PROMTOOL" check config "$PROM/prometheus.yml"
ok "promtool test rules lynx-alerts.test.yml" "$PROMTOOL" test rules "$PROM/lynx-alerts.test.yml"
ok "the alerts' structure and runbooks" "${CHECK[@]}" rules "$RULES" "$OPS"
ok "the dashboard's structure" "${CHECK[@]}" dashboard "$DASH" "$IT_DIR/dashboard-queries.yml"
ok "the dashboard's queries parse as PromQL" "$PROMTOOL" check rules "$IT_DIR/dashboard-queries.yml"

# ---- 3a. broken copies of the files --------------------------------------------

B=$IT_DIR/broken
mkdir -p "$B"
sedcopy "$RULES" "$B/syntax.yml" 's/expr: lynx_coordinator_no_leader == 1/expr: lynx_coordinator_no_leader == == 1/'
refused "a rule whose PromQL does not parse" 'parse error|unexpected'  "$PROMTOOL" check rules "$B/syntax.yml"
# a copy of the rules beside their unit tests, with a threshold that
# lets a stalled accelerator through
mkdir -p "$B/threshold"
cp "$PROM/lynx-alerts.test.yml" "$B/threshold/"
sedcopy "$RULES" "$B/threshold/lynx-alerts.yml" 's/(lynx_accel_stalled_mqueues > 0)/(lynx_accel_stalled_mqueues > 5)/'
refused "a rule the unit tests catch (stalled threshold 5)" 'alertname: LynxAcceleratorStalled' \
  "$PROMTOOL" test rules "$B/threshold/lynx-alerts.test.yml"
sedcopy "$DASH" "$B/dash-syntax.json" 's/"sum by (state) (lynx_node_state/"sum by (state) ((lynx_node_state/'
ok "check.py dashboard (its copy with a PromQL error)" "${CHECK[@]}" dashboard "$B/dash-syntax.json" "$B/dash-syntax.yml"
refused "a dashboard query that does not parse" 'parse error|unclosed|unexpected'  "$PROMTOOL" check rules "$B/dash-syntax.yml"
awk '/^ +runbook_url:/ && !done { done = 1; next } { print }' "$RULES" >"$B/norunbook.yml"
refused "an alert without a runbook_url" 'no annotations.runbook_url' "${CHECK[@]}" rules "$B/norunbook.yml" "$OPS"
sedcopy "$RULES" "$B/anchor.yml" 's/#lynxnodedown$/#lynxnodedwon/'
refused "a runbook anchor docs/operations.md lacks" 'has no heading with anchor #lynxnodedwon' "${CHECK[@]}" rules "$B/anchor.yml" "$OPS"
sedcopy "$DASH" "$B/dash-var.json" '0,/node=~\\"\$node\\"/s//node=~\\"$nodes\\"/'
refused "a dashboard query with a variable not defined" 'variable \$nodes is not defined' \
  "${CHECK[@]}" dashboard "$B/dash-var.json" "$B/dash-var.yml"

# ---- 2. a live cluster ---------------------------------------------------------

pick_ports COORD_PORT API_PORT METRICS_PORT AGENT_METRICS_PORT UDP_PORT UDP_PORT2 TCP_PORT
start_coordinator
start_node_agent "$IT_NODE" --metrics "127.0.0.1:$AGENT_METRICS_PORT"
start_coord_frontend
serve_service echo "\"port\":$UDP_PORT,\"app\":\"sockperf-echo\""
serve_service echo2 "\"port\":$UDP_PORT2,\"app\":\"sockperf-echo\""
run_sockperf "$IT_DIR/pingpong-echo.out" ping-pong -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 3
check_sockperf "$IT_DIR/pingpong-echo.out"
run_sockperf "$IT_DIR/pingpong-echo2.out" ping-pong -i 127.0.0.1 -p "$UDP_PORT2" -m 64 -t 1
check_sockperf "$IT_DIR/pingpong-echo2.out"
serve_service tcpecho "\"port\":$TCP_PORT,\"app\":\"echo\",\"proto\":\"tcp\""
log "lynx-tcp-load on service tcpecho"
timeout -k 3 "$(ts_s 60)" "$LYNX_BIN_DIR/lynx-tcp-load" --target "127.0.0.1:$TCP_PORT" --conns 4 \
  --messages 200 --window 4 --size-max 512 --seed 3 >"$IT_DIR/tcp-load.out" 2>&1 ||
  { cat "$IT_DIR/tcp-load.out"; fail "lynx-tcp-load on service tcpecho failed"; }
log "$(tail -1 "$IT_DIR/tcp-load.out")"

FE=$IT_DIR/scrape-frontend.txt AG=$IT_DIR/scrape-agent.txt CO=$IT_DIR/scrape-coordinator.txt
scrape_stable "$FE" 5 "http://127.0.0.1:$METRICS_PORT/metrics"
scrape_stable "$AG" 5 "http://127.0.0.1:$AGENT_METRICS_PORT/metrics"
curl -sf --max-time 5 "$(api_url)/metrics" >"$CO" || fail "cannot scrape the coordinator"

for s in "$CO" "$AG" "$FE"; do
  ok "promtool check metrics $(basename "$s")" "$PROMTOOL" check metrics <"$s"
  ok "exposition of $(basename "$s")" "${CHECK[@]}" exposition "$s"
done
SERVED=("$DASH" "$RULES")
ok "the metrics the dashboard and the rules use are exported" \
  "${CHECK[@]}" names "$CO" "$AG" "$FE" -- "${SERVED[@]}"
ok "lynx_frontend_request_duration_seconds" \
  "${CHECK[@]}" histogram "$FE" lynx_frontend_request_duration_seconds lynx_frontend_responded_total
ok "lynx_agent_accel_service_seconds" "${CHECK[@]}" histogram "$AG" lynx_agent_accel_service_seconds
ok "lynx_agent_accel_queue_seconds" "${CHECK[@]}" histogram "$AG" lynx_agent_accel_queue_seconds
for svc in echo echo2 tcpecho; do
  v=$(METRICS_FROM=$FE metric lynx_frontend_request_duration_seconds_count "service=\"$svc\"") || v=none
  assert_gt "$v" 0 "service $svc: answers timed (lynx_frontend_request_duration_seconds_count)"
done
dispatched=$(METRICS_FROM=$FE metric lynx_frontend_dispatched_total) || dispatched=none
ran=$(METRICS_FROM=$AG metric lynx_agent_accel_service_seconds_count) || ran=none
assert_eq "$ran" "$dispatched" "requests the accelerators ran (agent) against those the frontend dispatched"

# ---- 3b. broken copies of the scrapes ------------------------------------------

sedcopy "$DASH" "$B/dash-name.json" 's/lynx_accel_stalled_mqueues/lynx_accel_stalled_mqueue/'
refused "a dashboard with a misspelled metric" 'lynx_accel_stalled_mqueue is in no scrape' \
  "${CHECK[@]}" names "$CO" "$AG" "$FE" -- "$B/dash-name.json"
# the last finite bucket of service echo emptied: not cumulative
awk '/^lynx_frontend_request_duration_seconds_bucket\{service="echo",/ { last = NR }
     { line[NR] = $0 }
     END { sub(/ [0-9]+$/, " 0", line[last - 1]); for (i = 1; i <= NR; i++) print line[i] }' \
  "$FE" >"$B/cumulative.txt"
refused "a histogram that is not cumulative" 'not cumulative' \
  "${CHECK[@]}" histogram "$B/cumulative.txt" lynx_frontend_request_duration_seconds
# service echo's _count one more than its +Inf bucket (and its responses)
awk '/^lynx_frontend_request_duration_seconds_count\{service="echo"\}/ { $2 = $2 + 1 } { print }' \
  "$FE" >"$B/count.txt"
refused "a histogram whose _count is not its +Inf bucket" '\+Inf bucket [0-9]+ != _count' \
  "${CHECK[@]}" histogram "$B/count.txt" lynx_frontend_request_duration_seconds lynx_frontend_responded_total
# the first received sample moved to the end: its family in two groups
awk '/^lynx_frontend_received_total\{/ && !moved { moved = $0; next } { print } END { print moved }' \
  "$FE" >"$B/split.txt"
refused "a family split in two groups" 'after its family.s group ended' "${CHECK[@]}" exposition "$B/split.txt"
{ cat "$FE"; echo "# TYPE lynx_frontend_received_total counter"; } >"$B/type2.txt"
refused "a second TYPE line (promtool check metrics)" 'second TYPE line' "$PROMTOOL" check metrics <"$B/type2.txt"

stop "$FRONTEND_PID" 10
stop "$AGENT_PID" 10
stop "$COORD_PID" 10
it_done
