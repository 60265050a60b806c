#!/usr/bin/env bash
# make_run_ha: the README's `make run-ha` (deploy/run-ha.sh): 3 etcd
# members, 3 coordinators, an agent and a frontend on loopback.
#
#  1. The banner names the leader's API and the service, which answers at
#     the address the banner names.
#  2. Under sockperf under-load (1000/s, every message answered), the
#     leading coordinator and an etcd member (one that is not etcd's raft
#     leader) killed (-9): every request is answered; another coordinator
#     leads and takes a change (lynxctl pointed at any surviving
#     coordinator).
#  3. Ctrl-C stops everything: no daemon or etcd member left.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init make_run_ha
it_require_coord
it_require python3 setsid etcd etcdctl sockperf
RUN_HA=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../deploy" && pwd)/run-ha.sh
BUILD_DIR=$(dirname "$LYNX_BIN_DIR")
node_ids NODE
pick_ports UDP_PORT UDP_PORT2 METRICS_PORT
# a base port with the 107 above it free (run-ha.sh's layout)
used=" $(used_ports | tr '\n' ' ') ${IT_PORTS[*]} "
for ((try = 0; try < 50; try++)); do
  HA=$((21000 + (RANDOM % 200) * 50))
  ok=1
  for off in 0 10 20 80 81 82 101 102 103 104 105 106; do
    [[ $used == *" $((HA + off)) "* ]] && ok=0
  done
  ((ok)) && break
done
((ok)) || skip "no free block of ports for run-ha"
log "run-ha ports from $HA"

OUT=$IT_DIR/run-ha.out
LYNX_UDP_PORT=$UDP_PORT LYNX_HA_PORT=$HA LYNX_METRICS_ADDR=127.0.0.1:$METRICS_PORT \
LYNX_NODE_ID=$NODE run_in_session "$OUT" "$RUN_HA" "$BUILD_DIR"
wait_log "$OUT" "Press Ctrl-C to stop" 60 1 "$RUN_PID"
LOGDIR=$(sed -n 's|^ *logs *\(/tmp/lynx-run-ha\.[A-Za-z0-9]*\)/.*|\1|p' "$OUT")
# this run's processes, by the ports and directory only they use
daemons() {
  pgrep -f -- "(lynx-coordinator .*--etcd http://127.0.0.1:$((HA + 101)),|lynx-(agent|frontend) --coordinator 127.0.0.1:$HA,|etcd --name e[123] --data-dir $LOGDIR/)" || true
}

# ---- 1. the banner ---------------------------------------------------------------
log "== 1. make run-ha: the banner, the service"
leader=$(sed -n "s|.*the leader's API: http://\([0-9.:]*\)).*|\1|p" "$OUT")
[[ $leader == 127.0.0.1:* ]] || fail "no leader in the banner: $(head -5 "$OUT")"
assert_str "$(curl -sf "http://$leader/readyz" | jq -r .role)" leader "the role of the coordinator the banner names"
"$LYNX_BIN_DIR/lynx-udp-probe" --host 127.0.0.1 --port "$UDP_PORT" --timeout-ms 10000 \
  >"$IT_DIR/probe.out" 2>&1 || fail "no answer on UDP $UDP_PORT: $(cat "$IT_DIR/probe.out")"
assert_eq "$(daemons | wc -l)" 8 "processes running (3 etcd, 3 coordinators, agent, frontend)"
# the frontend's metrics (the banner names them): its own account of what
# it received and answered judges the run, not sockperf's last replies
METRICS_PORT=$(sed -n 's|.*metrics *http://127.0.0.1:\([0-9]*\)/metrics.*|\1|p' "$OUT")
is_uint "$METRICS_PORT" || fail "no metrics address in the banner: $(head -20 "$OUT")"

# ---- 2. the leader and an etcd member killed under load ----------------------------------
log "== 2. the leading coordinator and an etcd member killed under load"
sp=$IT_DIR/underload.out
sockperf_base
sockperf under-load -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 8 --mps 1000 \
  --reply-every 1 --buffer-size 4194304 >"$sp" 2>&1 &
spid=$!
sleep 2
kill -KILL "$(pgrep -f -- "lynx-coordinator .*--http $leader")"
# an etcd member that is not etcd's own raft leader: losing that one too
# would add etcd's re-election (and its extension of every lease) to the
# failover, two failures at once
victim=""
for i in 1 2 3; do
  st=$(ETCDCTL_API=3 etcdctl --endpoints "http://127.0.0.1:$((HA + 99 + 2 * i))" \
    --command-timeout=2s endpoint status -w json 2>/dev/null) || continue
  if [[ $(jq -r '.[0].Status.leader != .[0].Status.header.member_id' <<<"$st") == true ]]; then
    victim=$i
    break
  fi
done
[[ -n $victim ]] || fail "no etcd member that is not the raft leader"
kill -KILL "$(pgrep -f -- "etcd --name e$victim --data-dir $LOGDIR/")"
log "killed the leading coordinator ($leader) and etcd member $victim"
wait "$spid"
check_sockperf_served "$sp"
assert_eq "$SP_DROP" 0 "answers sockperf counted dropped"
new=""
end=$(($(now_ms) + 10000))
until [[ -n $new ]]; do
  for a in $((HA + 80)) $((HA + 81)) $((HA + 82)); do
    [[ 127.0.0.1:$a == "$leader" ]] && continue
    [[ $(curl -sf "http://127.0.0.1:$a/readyz" | jq -r .role 2>/dev/null) == leader ]] && new=127.0.0.1:$a
  done
  (($(now_ms) < end)) || fail "no coordinator leads after the leader died"
  sleep 0.1
done
log "ok: $new leads now"
for a in $((HA + 80)) $((HA + 81)) $((HA + 82)); do
  [[ 127.0.0.1:$a == "$leader" ]] || other=127.0.0.1:$a
done
"$LYNX_BIN_DIR/lynxctl" --api "http://$other" service create --name echo2 \
  --port "$UDP_PORT2" --app sockperf-echo >"$IT_DIR/ctl.out" 2>&1 ||
  it_check_failed "lynxctl through $other after the failover: $(cat "$IT_DIR/ctl.out")"
log "ok: a change taken through $other"

# ---- 3. Ctrl-C ---------------------------------------------------------------------
log "== 3. Ctrl-C"
kill -INT -- "-$RUN_PID"
wait_exit "$RUN_PID" 30 || fail "make run-ha did not stop within 30 s of Ctrl-C"
assert_eq "$WAIT_RC" 0 "make run-ha's exit status after Ctrl-C"
assert_eq "$(daemons | wc -l)" 0 "processes left after Ctrl-C"
[[ -z $(node_shm "$NODE") ]] || it_check_failed "regions left: $(node_shm "$NODE")"
[[ -n $LOGDIR && $LOGDIR == /tmp/lynx-run-ha.* ]] && rm -rf "$LOGDIR"
it_done
