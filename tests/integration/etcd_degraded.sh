#!/usr/bin/env bash
# etcd_degraded: the store fails or slows down and the data plane does not
# notice (docs/etcd.md, "When etcd stalls or is slow"). One coordinator on
# a one-member etcd, every option at its default but --etcd; an agent, a
# frontend, a sockperf-echo service, sockperf under-load at 2000/s.
#
# ED_PHASE=stall: etcd stopped (SIGSTOP) for 5 s while API changes are
#   tried again and again: each is answered (503 while etcd is stopped)
#   within 2 s, every one is taken once etcd is back, the agent never
#   fences itself, and the frontend answers every request it received.
# ED_PHASE=slow: etcd behind a proxy that delays every chunk by 200 ms
#   each way (each call still well within --etcd-timeout-ms): the
#   coordinator keeps leading, takes 10 API changes made during the run,
#   and the frontend answers every request it received.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

PHASE=${ED_PHASE:-stall}
it_init "etcd_degraded.$PHASE"
it_require_coord
it_require etcd etcdctl sockperf python3
pick_ports COORD_PORT API_PORT METRICS_PORT UDP_PORT PROXY_PORT
PFX=/it-$IT_NODE/

STOPPED=()
trap 'rc=$?; ((${#STOPPED[@]})) && kill -CONT "${STOPPED[@]}" 2>/dev/null; (exit $rc); it_cleanup' EXIT

start_etcd
STORE=$ETCD_URL
if [[ $PHASE == slow ]]; then
  python3 "$IT_LIB_DIR/delay_proxy.py" "$PROXY_PORT" "${ETCD_URL#http://}" 200 \
    >"$IT_DIR/proxy.log" 2>&1 </dev/null &
  track "$!" "delay_proxy"
  wait_log "$IT_DIR/proxy.log" listening 10 1 "$!"
  STORE=http://127.0.0.1:$PROXY_PORT
fi
start_coordinator --etcd "$STORE" --etcd-prefix "$PFX"
wait_role "$API_PORT" leader 10000 || fail "the coordinator does not lead"
node_ids N1
start_node_agent "$N1"
start_coord_frontend
serve_service echo "\"port\":$UDP_PORT,\"app\":\"sockperf-echo\""
pingpong warm 1

# create NAME: POST a service of its own port, once; sets API_STATUS and
# TOOK_MS
create() {
  local port t0
  pick_ports port
  t0=$(now_ms)
  api POST /v1/services -d "{\"name\":\"$1\",\"port\":$port,\"app\":\"echo\"}"
  TOOK_MS=$(($(now_ms) - t0))
}

out=$IT_DIR/underload.out
if [[ $PHASE == stall ]]; then
  underload_start "$out" 16
  sp=$UNDERLOAD_PID
  sleep 3
  kill -STOP "$ETCD_PID"
  STOPPED+=("$ETCD_PID")
  t_stop=$(now_ms)
  log "etcd stopped"
  refused=0 slowest=0
  for name in w1 w2 w3; do
    for (( ; ; )); do
      if (($(now_ms) - t_stop >= 5000)) && ((${#STOPPED[@]})); then
        kill -CONT "$ETCD_PID"
        STOPPED=()
        log "etcd continued after $(($(now_ms) - t_stop)) ms"
      fi
      create "$name"
      assert_le "$TOOK_MS" "$(ts_ms 2000)" "ms the answer to POST $name took (HTTP $API_STATUS)" >/dev/null
      ((TOOK_MS > slowest)) && slowest=$TOOK_MS
      [[ $API_STATUS == 201 ]] && break
      [[ $API_STATUS == 503 ]] || it_check_failed "POST $name: HTTP $API_STATUS (want 201, or 503 while etcd stalls): $(cat "$API_BODY")"
      refused=$((refused + 1))
      (($(now_ms) - t_stop < 20000)) || fail "POST $name is still refused 20 s after etcd stopped: $(cat "$API_BODY")"
      sleep 0.2
    done
    log "service $name created $(($(now_ms) - t_stop)) ms after the stop"
  done
  assert_gt "$refused" 0 "changes refused (503) while etcd was stopped"
  log "the slowest answer took $slowest ms"
  wait "$sp"
else
  underload_start "$out" 20
  sp=$UNDERLOAD_PID
  sleep 2
  for i in $(seq 1 10); do
    create "s$i"
    assert_eq "$API_STATUS" 201 "POST s$i through the slow etcd (took $TOOK_MS ms)"
    sleep 0.5
  done
  wait "$sp"
  if grep -qF "no longer the leader" "$COORD_LOG"; then
    it_check_failed "the coordinator lost its lead on a slow etcd: $(grep -F 'no longer the leader' "$COORD_LOG" | head -2)"
  fi
fi
check_sockperf_served "$out"
assert_never_fenced "$AGENT_LOG" "while etcd was $([[ $PHASE == stall ]] && echo stopped || echo slow)"
api GET /v1/services
assert_eq "$API_STATUS" 200 "GET /v1/services"
for name in $([[ $PHASE == stall ]] && echo w1 w2 w3 || seq -f 's%g' 1 10); do
  [[ $(jq -r --arg n "$name" '[.items[] | select(.name == $n)] | length' "$API_BODY") == 1 ]] ||
    it_check_failed "service $name is not listed"
done
it_done
