#!/usr/bin/env bash
# gpu_lenet: LeNet-5 on a GPU, on a host with an NVIDIA GPU and a lynx-agent
# built with CUDA (skipped with 77 and the reason otherwise; docs/lenet.md).
#
#  1. Lynx: lynx-agent --cuda-accels 0 --app lenet (the persistent kernel,
#     host-mapped mqueues over shm), the frontend; lynx-lenet-load sends
#     2,000 Fashion-MNIST test images over 8 flows with 32 outstanding and
#     40 malformed datagrams: every class equals the training script's
#     reference, the logits of the reference's 500 images are bit-equal
#     (the GPU and the CPU run lenet.h's per-element code in one order),
#     accuracy equals the reference's on the same images, the malformed
#     ones are dropped by the kernel and counted, nothing else lost; the
#     agent's metrics count a GPU-stamped service time for every request.
#  2. SIGTERM to the agent under load: the kernel stops, exit 0.
#  3. The same load against lynx-gpu-baseline --app lenet (the host-centric
#     server, the same device code): the same answers.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init gpu_lenet
it_require curl timeout
probe=$("$LYNX_BIN_DIR/lynx-agent" --cuda-accels 0 --list-accels 2>&1 </dev/null)
case $probe in
*"built without the CUDA backend"*) skip "lynx-agent was built without CUDA (make LYNX_CUDA=ON on a host with the toolkit)" ;;
*"no usable CUDA GPU"* | *"no CUDA GPU"* | *"does not exist"*) skip "no usable GPU here: $probe" ;;
esac
grep -q $'^0\tcuda\t' <<<"$probe" || fail "lynx-agent --list-accels: $probe"
DATA=${LYNX_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
[[ -r $DATA/t10k-images-idx3-ubyte.gz ]] ||
  skip "no Fashion-MNIST test set in $DATA (install dataset-fashion-mnist: deploy/install-deps.sh)"
ROOT=$(cd "$IT_LIB_DIR/../.." && pwd)
MODEL=$ROOT/models/lenet-fashion.bin
REF=$ROOT/models/lenet-fashion.ref
for b in lynx-lenet-load lynx-gpu-baseline; do
  [[ -x $LYNX_BIN_DIR/$b ]] || fail "$b is missing: build first"
done
pick_ports AGENT_PORT UDP_PORT METRICS_PORT AMETRICS_PORT
MALFORMED=40

load() { lenet_load "$@"; }
# judge WHAT: the answers of a 2,000-image run
judge() {
  assert_eq "$L_answered" 2000 "$1: requests answered"
  assert_eq "$L_lost" 0 "$1: requests lost"
  assert_eq "$L_disagree" 0 "$1: classes that differ from the reference"
  assert_eq "$L_unexpected" 0 "$1: answers to malformed requests (or duplicates)"
  assert_eq "$L_bad_answers" 0 "$1: answers that do not decode"
  assert_eq "$L_logits_checked" 500 "$1: answers whose logits were compared bit for bit"
  assert_eq "$L_logit_mismatch" 0 "$1: logits that differ from the reference"
  assert_eq "$L_correct" "$L_ref_correct" "$1: correct classes (the reference's offline count)"
}

# ---- 1. Lynx ------------------------------------------------------------------------
log "== 1. lenet as a persistent kernel on GPU 0"
start_agent --cuda-accels 0 --cpu-accels 0 --app lenet --lenet-model "$MODEL" \
  --mqueues 16 --metrics "127.0.0.1:$AMETRICS_PORT"
grep -q 'persistent kernel of' "$AGENT_LOG" || fail "no kernel launch logged"
start_frontend
load "$IT_DIR/lynx.out" --count 2000 --window 32 --flows 8 --malformed "$MALFORMED"
judge lynx
scrape_stable "$IT_DIR/metrics.txt"
export METRICS_FROM=$IT_DIR/metrics.txt
assert_eq "$(metric lynx_frontend_dropped_total 'reason="app_dropped"')" "$MALFORMED" \
  "malformed requests dropped by the kernel"
assert_eq "$(metric lynx_frontend_dropped_total)" "$MALFORMED" "drops of any reason"
disp=$(metric lynx_frontend_dispatched_total)
unset METRICS_FROM
sleep 0.5 # the agent samples its accelerators every 250 ms
n=$(curl -sf --max-time 5 "http://127.0.0.1:$AMETRICS_PORT/metrics" |
  sed -n 's/^lynx_agent_accel_service_seconds_count{accel="0",kind="cuda"} //p')
assert_eq "$n" "$disp" "service times stamped by the kernel == requests dispatched"

# ---- 2. SIGTERM under load (the agent of part 1) ---------------------------------------
log "== 2. SIGTERM to the agent under load"
timeout -k 5 "$(ts_s 30)" "$LYNX_BIN_DIR/lynx-lenet-load" --target "127.0.0.1:$UDP_PORT" \
  --data "$DATA" --ref "$REF" --seconds 4 --window 32 --flows 8 \
  >"$IT_DIR/term.out" 2>&1 </dev/null &
track "$!" lenet-load-term
sleep 1
kill -TERM "$AGENT_PID"
wait_exit "$AGENT_PID" 5 || fail "agent did not exit within 5 s of SIGTERM under load"
assert_eq "$WAIT_RC" 0 "agent exit status on SIGTERM under load (kernel stopped)"
grep -q 'did not stop' "$AGENT_LOG" && fail "the kernel did not stop: $(grep 'did not stop' "$AGENT_LOG")"
stop_daemons

# ---- 3. the host-centric baseline ---------------------------------------------------------
log "== 3. lynx-gpu-baseline --app lenet"
"$LYNX_BIN_DIR/lynx-gpu-baseline" --udp "127.0.0.1:$UDP_PORT" --device 0 --app lenet \
  --lenet-model "$MODEL" --streams 4 >"$IT_DIR/baseline.log" 2>&1 </dev/null &
BPID=$!
track "$BPID" gpu-baseline
wait_log "$IT_DIR/baseline.log" "serving UDP" 10 1 "$BPID"
load "$IT_DIR/baseline.out" --count 2000 --window 32 --flows 8 --malformed "$MALFORMED"
judge baseline
stop "$BPID" 10
assert_eq "$WAIT_RC" 0 "baseline exit status on SIGTERM"
it_done
