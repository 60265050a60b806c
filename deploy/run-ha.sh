#!/usr/bin/env bash
# `make run-ha`: `make run` with a control plane that survives the loss of
# any one of its hosts (docs/etcd.md): a 3-member etcd cluster on loopback,
# three coordinators on it (one leads, elected on an etcd lease), one agent
# with two CPU-emulated accelerators and one frontend that know all three
# coordinators (--coordinator A,B,C), and the demo service `echo`
# (sockperf-echo on UDP 127.0.0.1:7000). Everything keeps its data in a
# temp dir. Runs in the foreground; Ctrl-C stops everything in order.
# Needs etcd (Debian's etcd-server, installed by deploy/install-deps.sh).
# Override with LYNX_UDP_PORT, LYNX_BIND, LYNX_METRICS_ADDR, LYNX_APP,
# LYNX_NODE_ID and LYNX_HA_PORT (default 7700): coordinators' control on
# PORT, PORT+10, PORT+20, their APIs on PORT+80..82, etcd's clients on
# PORT+101, +103, +105 and peers on PORT+102, +104, +106.
set -euo pipefail
BUILD=${1:-build}
BIN="$BUILD/bin"
UDP=${LYNX_UDP_PORT:-7000}
BIND=${LYNX_BIND:-127.0.0.1}
METRICS=${LYNX_METRICS_ADDR:-127.0.0.1:7791} # the frontend's (deploy/monitoring/)
APP=${LYNX_APP:-sockperf-echo}
NODE=${LYNX_NODE_ID:-local}
P=${LYNX_HA_PORT:-7700}
LOGDIR=$(mktemp -d /tmp/lynx-run-ha.XXXXXX)
command -v etcd >/dev/null || { echo "make run-ha needs etcd: deploy/install-deps.sh installs it (etcd-server)" >&2; exit 1; }

source "$(dirname "${BASH_SOURCE[0]}")/lib-run.sh" # start, wait_for, fail, stop, watch

# ---- etcd: three members ------------------------------------------------------
cluster="" endpoints=""
for i in 1 2 3; do
  cluster+="${cluster:+,}e$i=http://127.0.0.1:$((P + 100 + 2 * i))"
  endpoints+="${endpoints:+,}http://127.0.0.1:$((P + 99 + 2 * i))"
done
for i in 1 2 3; do
  c=http://127.0.0.1:$((P + 99 + 2 * i)) p=http://127.0.0.1:$((P + 100 + 2 * i))
  start "etcd-$i" etcd --name "e$i" --data-dir "$LOGDIR/etcd-$i" \
    --listen-client-urls "$c" --advertise-client-urls "$c" \
    --listen-peer-urls "$p" --initial-advertise-peer-urls "$p" \
    --initial-cluster "$cluster" --initial-cluster-state new \
    --initial-cluster-token "lynx-run-ha-$$"
done
for i in 1 2 3; do wait_for "$LOGDIR/etcd-$i.log" "ready to serve client requests" "etcd member $i"; done

# ---- three coordinators ---------------------------------------------------------
coords="" apis=()
for i in 0 1 2; do
  coords+="${coords:+,}127.0.0.1:$((P + 10 * i))"
  apis+=("127.0.0.1:$((P + 80 + i))")
done
for i in 0 1 2; do
  # agents' lease 8 s: half a second more than the 7.5 s derived from the
  # 2 s election lease, for a coordinator and an etcd member lost together
  # (docs/etcd.md, "Timing")
  start "coordinator-$i" "$BIN/lynx-coordinator" --listen "127.0.0.1:$((P + 10 * i))" \
    --http "${apis[i]}" --etcd "$endpoints" --etcd-lease-s 2 --lease-ms 8000
done
for i in 0 1 2; do wait_for "$LOGDIR/coordinator-$i.log" "serving control" "coordinator $i"; done

start agent "$BIN/lynx-agent" --coordinator "$coords" --cpu-accels 2 \
  --node-id "$NODE" --transport shm
agent=${pids[-1]}
start frontend "$BIN/lynx-frontend" --coordinator "$coords" --bind "$BIND" \
  --metrics "$METRICS"
frontend=${pids[-1]}
wait_for "$LOGDIR/agent.log" "registered with coordinator" agent
# any coordinator takes it: a follower redirects lynxctl to the leader
"$BIN/lynxctl" --api "http://${apis[1]}" service create --name echo --port "$UDP" \
  --app "$APP" --placement all >/dev/null || fail "cannot create the service"
wait_for "$LOGDIR/frontend.log" "in dispatch" frontend
leader=""
for a in "${apis[@]}"; do
  if curl -sf "http://$a/readyz" | grep -q '"role": *"leader"'; then leader=$a; break; fi
done

cat <<MSG
Lynx is running with a highly available control plane: a 3-member etcd
cluster, 3 coordinators (the leader's API: http://${leader:-?}), 1 agent
(2 CPU accelerators), 1 frontend, service echo ($APP) on UDP port $UDP.
  UDP service   $BIND:$UDP
  APIs          $(printf 'http://%s ' "${apis[@]}")(any of them: a follower redirects changes)
  etcd          $endpoints
  metrics       http://$METRICS/metrics
  logs          $LOGDIR/{etcd-N,coordinator-N,agent,frontend}.log

Try it from another terminal:
  sockperf under-load -i $([[ $BIND == 0.0.0.0 ]] && echo 127.0.0.1 || echo "$BIND") -p $UDP -m 64 -t 30 --mps 1000 --reply-every 1
  kill the leader: kill -9 \$(pgrep -f 'lynx-coordinator.*--http ${leader:-?}')
  curl -s http://${apis[0]}/readyz; curl -s http://${apis[1]}/readyz   # who leads now
  ETCDCTL_API=3 etcdctl --endpoints $endpoints get --prefix /lynx/ --keys-only

Coordinators and etcd members may die: the others carry on (one etcd
member and one coordinator at a time keep the quorum and a leader). If the
agent or the frontend dies, it is named here and everything stops.
Press Ctrl-C to stop.
MSG
watch "$agent" "$frontend"
