#!/usr/bin/env bash
# many_services: MANY_N (500) services on one frontend and one agent
# (issue 38), created through the API, served, deleted: what was taken
# comes back.
#
#  1. A coordinator (--services-max above MANY_N), one agent (2 CPU
#     accelerators over shm), one frontend; their threads and memory
#     before any service.
#  2. MANY_N sockperf-echo services created through the API (one keep-alive
#     connection), every one ready.
#  3. sockperf ping-pong clients on 4 of them at once (the first, the last,
#     two between): every request answered, none dropped, duplicated or
#     out of order.
#  4. Every service deleted: the frontend's and the agent's threads back to
#     what they were, their memory within 32 MB of it, and the frontend
#     and agent still serve a new service.
# The threads and memory at MANY_N services are logged, not asserted: they
# are what issue 38 changes (bench/services.sh measures them).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init many_services
it_require_coord
it_require python3 sockperf jq
N=${MANY_N:-500}
pick_ports COORD_PORT API_PORT METRICS_PORT
mapfile -t PORT_VARS < <(for i in $(seq 0 "$N"); do echo "SVC_P$i"; done)
mapfile -t PORTS < <(
  pick_ports "${PORT_VARS[@]}" >/dev/null
  for v in "${PORT_VARS[@]}"; do echo "${!v}"; done
)
((${#PORTS[@]} == N + 1)) || fail "picked ${#PORTS[@]} ports, want $((N + 1))"

# threads_of PID...: their threads together; rss_mb PID...: their VmRSS
threads_of() { local s=0 p; for p in "$@"; do s=$((s + $(awk '$1 == "Threads:" { print $2 }' "/proc/$p/status"))); done; echo "$s"; }
rss_mb() { local s=0 p; for p in "$@"; do s=$((s + $(awk '$1 == "VmRSS:" { print $2 }' "/proc/$p/status"))); done; echo $((s / 1024)); }
agent_procs() { echo "$AGENT_PID" "$(pgrep -P "$AGENT_PID" | tr '\n' ' ')"; }
figures() { # WHEN: logs the daemons' threads and memory; sets FE_T FE_M AG_T AG_M
  local -a ag
  read -r -a ag <<<"$(agent_procs)"
  FE_T=$(threads_of "$FRONTEND_PID") FE_M=$(rss_mb "$FRONTEND_PID")
  AG_T=$(threads_of "${ag[@]}") AG_M=$(rss_mb "${ag[@]}")
  log "$1: frontend $FE_T threads, $FE_M MB; agent $AG_T threads, $AG_M MB"
}

# ---- 1. the daemons, before any service ----------------------------------------
start_coordinator --services-max $((N + 10))
node_ids N1
start_node_agent "$N1"
start_coord_frontend
sleep 1
figures "no service"
FE_T0=$FE_T FE_M0=$FE_M AG_T0=$AG_T AG_M0=$AG_M

# ---- 2. MANY_N services -------------------------------------------------------------
# many OP FIRST_PORT...: POST (create) or DELETE every service s<i> through
# one keep-alive connection; prints how many the API refused
cat >"$IT_DIR/many.py" <<'PY'
import http.client, json, sys
op, api = sys.argv[1], sys.argv[2]
ports = [int(p) for p in sys.argv[3:]]
host, port = api.split(":")
c = http.client.HTTPConnection(host, int(port), timeout=30)
bad = 0
for i, p in enumerate(ports):
    if op == "create":
        body = json.dumps({"name": "s%d" % i, "port": p, "app": "sockperf-echo"})
        c.request("POST", "/v1/services", body, {"Content-Type": "application/json"})
        want = 201
    else:
        c.request("DELETE", "/v1/services/s%d" % i)
        want = 200
    r = c.getresponse()
    text = r.read()
    if r.status != want:
        bad += 1
        print("%s s%d: HTTP %d %s" % (op, i, r.status, text[:200]), file=sys.stderr)
print(bad)
PY
t0=$(now_ms)
bad=$(python3 "$IT_DIR/many.py" create "127.0.0.1:$API_PORT" "${PORTS[@]:0:N}")
assert_eq "$bad" 0 "services the API refused to create"
end=$(($(now_ms) + $(ts_s 300) * 1000))
until [[ $(api_json /v1/services '[.items[] | select(.state == "ready")] | length') == "$N" ]]; do
  (($(now_ms) < end)) || fail "$(api_json /v1/services '[.items[] | select(.state == "ready")] | length') of $N services ready after 300 s"
  sleep 1
done
log "ok: $N services ready $(($(now_ms) - t0)) ms after the first creation"
# ready is the coordinator's word (in the dispatch table); the frontend
# opens each port as it applies the tables, a little later on a busy host
wait_log "$FRONTEND_LOG" "serving service s" 60 "$N" "$FRONTEND_PID"
log "ok: the frontend serves all $N $(($(now_ms) - t0)) ms after the first creation"
figures "$N services"

# ---- 3. four of them served at once ---------------------------------------------------
declare -a sp=()
for k in 0 $((N / 3)) $((2 * N / 3)) $((N - 1)); do
  timeout -k 3 "$(ts_s 30)" sockperf ping-pong -i 127.0.0.1 -p "${PORTS[$k]}" -m 64 -t 2 \
    >"$IT_DIR/pp-$k.out" 2>&1 </dev/null &
  sp+=("$!:$k")
done
for e in "${sp[@]}"; do
  wait "${e%%:*}" || it_check_failed "sockperf on service s${e#*:} exited $?"
  check_sockperf "$IT_DIR/pp-${e#*:}.out"
done

# ---- 4. every service deleted: what was taken comes back -------------------------------
bad=$(python3 "$IT_DIR/many.py" delete "127.0.0.1:$API_PORT" "${PORTS[@]:0:N}")
assert_eq "$bad" 0 "services the API refused to delete"
end=$(($(now_ms) + $(ts_s 60) * 1000))
while :; do
  figures "after the deletions"
  ((FE_T == FE_T0 && AG_T == AG_T0)) && break
  (($(now_ms) < end)) || break
  sleep 1
done
assert_eq "$FE_T" "$FE_T0" "the frontend's threads after every service was deleted"
assert_eq "$AG_T" "$AG_T0" "the agent's threads after every service was deleted"
assert_le "$FE_M" $((FE_M0 + 32)) "the frontend's MB after every service was deleted (before: $FE_M0)"
assert_le "$AG_M" $((AG_M0 + 32)) "the agent's MB after every service was deleted (before: $AG_M0)"
serve_service again "\"port\":${PORTS[$N]},\"app\":\"sockperf-echo\""
UDP_PORT=${PORTS[$N]}
wait_svc again '.state == "ready"' 10
pingpong again 1
stop_daemons
it_done
