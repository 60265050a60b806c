#!/usr/bin/env bash
# control_failover: the control plane fails the ways real ones do, with
# every option at its default, and the data plane does not stop
# (docs/etcd.md, "Failover without loss"). Two coordinators on one etcd
# given nothing but --etcd (and their addresses), an agent and a frontend
# given both, a sockperf-echo service, sockperf under-load at 2000/s.
#
# CF_PHASE=kill: the leading coordinator killed (-9) and started again,
#   then the other (leading by then) killed: each time the other leads and
#   takes an API change within the election lease (3 s) + 1 s, and the
#   frontend answers every request it received, none dropped. Then the
#   agent killed (-9): its node leaves dispatch (suspect) within 3.5 s, and
#   is declared down only at its lease (8.5 s).
# CF_PHASE=pause: the leading coordinator stopped (SIGSTOP) for three
#   election leases (9 s) and continued. The agent and the frontend leave
#   it for the other within the election lease + 2 s of the stop, nothing
#   is lost, and the old leader, continued, renews nothing: a second agent
#   that knows only the old leader (drained: it serves nothing) counts no
#   lease renewal from it after the pause (lynx_agent_lease_renewals_total):
#   continued, it answered nothing before etcd said it no longer led.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

PHASE=${CF_PHASE:-kill}
it_init "control_failover.$PHASE"
it_require_coord
it_require etcd etcdctl sockperf
pick_ports CA CA_API CB CB_API METRICS_PORT UDP_PORT AGENT2_METRICS
PFX=/it-$IT_NODE/
TTL=3 # --etcd-lease-s, by default

# a stopped coordinator is continued before the cleanup signals it
STOPPED=()
trap 'rc=$?; ((${#STOPPED[@]})) && kill -CONT "${STOPPED[@]}" 2>/dev/null; (exit $rc); it_cleanup' EXIT

start_etcd
# start_coord X CTL API: coordinator X on etcd, defaults; sets PID_X, LOG_X
start_coord() { start_coord_as "$1" "$2" "$3" --etcd "$ETCD_URL" --etcd-prefix "$PFX"; }
# change_within API_PORT NAME T0 BOUND_MS: creates service NAME (a port of
# its own) through API_PORT, retrying until 201; the first 201 must come
# within BOUND_MS of T0
change_within() {
  local api=$1 name=$2 t0=$3 bound=$4 port end
  pick_ports port
  end=$((t0 + bound + $(ts_ms 5000)))
  API_PORT=$api
  until api POST /v1/services -d "{\"name\":\"$name\",\"port\":$port,\"app\":\"echo\"}" &&
    [[ $API_STATUS == 201 ]]; do
    (($(now_ms) < end)) || { it_check_failed "no change taken through :$api: HTTP $API_STATUS $(cat "$API_BODY")"; return 1; }
    sleep 0.05
  done
  assert_le $(($(now_ms) - t0)) "$bound" "ms from the fault to a change taken ($name)"
}

start_coord A "$CA" "$CA_API"
wait_role "$CA_API" leader 10000 || fail "coordinator A does not lead alone"
start_coord B "$CB" "$CB_API"
wait_role "$CB_API" follower 5000 || fail "coordinator B is not a follower"
assert_log "$LOG_A" '"lease-ms":8500' "the agents' lease the defaults derive (2 heartbeat periods + election lease + 3.5 s)"

node_ids N1 N2
COORD_PORT=$CA
start_node_agent "$N1" --coordinator "127.0.0.1:$CA,127.0.0.1:$CB"
assert_log "$AGENT_LOG" "heartbeat lease 3000 ms, fence lease 8500 ms" "the leases the agent was given"
API_PORT=$CA_API
start_coord_frontend --coordinator "127.0.0.1:$CA,127.0.0.1:$CB"
serve_service echo "\"port\":$UDP_PORT,\"app\":\"sockperf-echo\""
if [[ $PHASE == pause ]]; then
  # an agent that knows only A; drained, it serves nothing
  n1_pid=$AGENT_PID n1_log=$AGENT_LOG
  start_node_agent "$N2" --cpu-accels 1 --metrics "127.0.0.1:$AGENT2_METRICS"
  AGENT_PID=$n1_pid AGENT_LOG=$n1_log
  api POST "/v1/nodes/$N2/drain"
  assert_eq "$API_STATUS" 200 "POST /v1/nodes/$N2/drain"
  wait_node_state "$N2" drained 10000 || fail "$N2 is not drained: $NODE_STATE"
fi
pingpong warm 1

out=$IT_DIR/underload.out
if [[ $PHASE == kill ]]; then
  underload_start "$out" 22
  sp=$UNDERLOAD_PID
  sleep 3
  # kill_leader X Y: X leads, is killed (-9); Y leads and takes a change
  # within the election lease + 1 s, and the agent registers with it
  kill_leader() {
    local pid_var=PID_$1 ctl_var=C$2 api_var=C$2_API t_kill n
    n=$(grep -cF "registered with coordinator 127.0.0.1:${!ctl_var}" "$AGENT_LOG")
    t_kill=$(now_ms)
    kill -KILL "${!pid_var}"
    wait "${!pid_var}" 2>/dev/null
    untrack "${!pid_var}"
    wait_role "${!api_var}" leader $((TTL * 1000 + 3000)) || fail "$2 does not lead after $1 died"
    log "$2 leads $(($(now_ms) - t_kill)) ms after $1 was killed"
    change_within "${!api_var}" "after_$1" "$t_kill" $((TTL * 1000 + $(ts_ms 1000)))
    wait_log "$AGENT_LOG" "registered with coordinator 127.0.0.1:${!ctl_var}" 10 \
      $((n + 1)) "$AGENT_PID"
  }
  kill_leader A B
  start_coord A "$CA" "$CA_API" # a follower now
  wait_role "$CA_API" follower 5000 || fail "A restarted is not a follower"
  sleep 2
  kill_leader B A
  wait "$sp"
  METRICS_FROM='' check_sockperf_served "$out"
  API_PORT=$CA_API
  wait_node_state "$N1" ready 5000 || it_check_failed "$N1 is not ready on A: $NODE_STATE"
  assert_never_fenced "$AGENT_LOG" "during the failovers"
  # a dead agent still leaves dispatch within the heartbeat lease (3 s),
  # whatever lease the failover needs (8.5 s): suspect, then down
  t_kill=$(now_ms)
  kill9 "$AGENT_PID"
  end=$((t_kill + $(ts_ms 5000)))
  until [[ $(api_json /v1/nodes "[.items[] | select(.id == \"$N1\") | .suspect] | .[0]") == true ]]; do
    (($(now_ms) < end)) || { it_check_failed "$N1 is not suspect 5 s after its agent was killed"; break; }
    sleep 0.05
  done
  suspect_ms=$(($(now_ms) - t_kill))
  assert_le "$suspect_ms" "$(ts_ms 3500)" "ms from the agent's kill to its node out of dispatch (suspect)"
  assert_str "$(node_state "$N1")" ready "its state while suspect (down only at the lease)"
  wait_node_state "$N1" down 8500 || it_check_failed "$N1 is not down at its lease: $NODE_STATE"
  assert_ge $(($(now_ms) - t_kill)) 7500 "ms from the agent's kill to its node down (the 8.5 s lease, its heartbeat up to 1 s old)"
  it_done
fi

# ---- pause ------------------------------------------------------------------
renewals_by_a() {
  METRICS_PORT=$AGENT2_METRICS metric lynx_agent_lease_renewals_total \
    "coordinator=\"127.0.0.1:$CA\""
}
r0=$(renewals_by_a) || fail "cannot read $N2's renewals by A"
assert_gt "$r0" 0 "$N2's lease renewals by A before the pause"
underload_start "$out" 20
sp=$UNDERLOAD_PID
sleep 3
t_stop=$(now_ms)
kill -STOP "$PID_A"
STOPPED+=("$PID_A")
wait_role "$CB_API" leader $((TTL * 1000 + 3000)) || fail "B does not lead while A is stopped"
log "B leads $(($(now_ms) - t_stop)) ms after A was stopped"
change_within "$CB_API" while_a_stopped "$t_stop" $((TTL * 1000 + $(ts_ms 1000)))
# the agent and the frontend found B while A is stopped
# (by the election lease and ~3 s: docs/etcd.md, "Failover without
# loss"; the fence, a second less than the 8.5 s lease, holds 6.5 s at
# least)
wait_log "$AGENT_LOG" "registered with coordinator 127.0.0.1:$CB" $((TTL + 4)) 1 "$AGENT_PID"
assert_le $(($(now_ms) - t_stop)) $((TTL * 1000 + $(ts_ms 3000))) "ms from the stop to the agent registered with B"
wait_log "$LOG_B" "connected from" 3 1 "$PID_B"
assert_le $(($(now_ms) - t_stop)) $((TTL * 1000 + $(ts_ms 3000))) "ms from the stop to the frontend connected to B"
end=$((t_stop + 3 * TTL * 1000))
while (($(now_ms) < end)); do sleep 0.1; done
r_mid=$(renewals_by_a) || fail "cannot read $N2's renewals by A"
log "A continued after $(($(now_ms) - t_stop)) ms; $N2's renewals by A: $r0 before, $r_mid during the pause"
kill -CONT "$PID_A"
STOPPED=()
wait_role "$CA_API" follower 5000 || fail "A, continued, does not step down"
wait_log "$LOG_A" "no longer the leader" 5 1 "$PID_A"
sleep 1 # what A read from its sockets after the pause has been answered
r_end=$(renewals_by_a) || fail "cannot read $N2's renewals by A"
assert_eq "$r_end" "$r_mid" "$N2's lease renewals by A after its pause (A renews nothing once deposed)"
wait "$sp"
METRICS_FROM='' check_sockperf_served "$out"
assert_never_fenced "$AGENT_LOG" "during the pause"
it_done
