#!/usr/bin/env bash
# gpu_serve: GPU accelerators end to end, on a host with an NVIDIA GPU and a
# lynx-agent built with CUDA (skipped with 77 and the reason otherwise).
# IT_TRANSPORT (shm, tcp) and IT_GPU_MEM (--region-mem: auto, host, device)
# pick the path; ctest runs tcp/auto (host-mapped), shm/host and tcp/device.
#
#  1. Static mode: lynx-agent --cuda-accels 0 runs sockperf-echo as a
#     persistent kernel; sockperf ping-pong and under-load are answered with
#     nothing dropped, duplicated or out of order; 3,000 random datagrams
#     (lynx-udp-fuzz: sizes up to 64 KiB, sockperf-like headers) get every
#     expected reply byte for byte; the agent logged the GPU (name, PCI bus
#     id, ordering mode), where its mqueues live and the kernel launch, and
#     its --metrics count a GPU-stamped service time for every request.
#  2. work_us emulation on the GPU (%globaltimer): with --work-us 200 the
#     median round trip grows by at least 200 us (sockperf --full-rtt:
#     without it sockperf reports half the round trip).
#  3. Coordinator mode, sockperf-fault on the GPU (--stall-ms 500): a
#     "LYNX-HANG 4000" request holds the kernel's block; the accelerator is
#     reported stalled and leaves dispatch, then returns when the block
#     consumes again, with the same instance.
#  4. SIGTERM to the agent while sockperf under-load runs: it stops the
#     kernel and exits 0 within 5 s.
export IT_TRANSPORT=${IT_TRANSPORT:-tcp} # lib.sh's default is shm
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init gpu_serve
it_require sockperf curl timeout
probe=$("$LYNX_BIN_DIR/lynx-agent" --cuda-accels 0 --list-accels 2>&1 </dev/null)
case $probe in
*"built without the CUDA backend"*) skip "lynx-agent was built without CUDA (make LYNX_CUDA=ON on a host with the toolkit)" ;;
*"no usable CUDA GPU"* | *"no CUDA GPU"* | *"does not exist"*) skip "no usable GPU here: $probe" ;;
esac
grep -q $'^0\tcuda\t' <<<"$probe" || fail "lynx-agent --list-accels: $probe"
log "GPU: $(grep $'^0\tcuda\t' <<<"$probe")"
# p50 OUT: sockperf's median (us, integer part): the round trip where the
# run had --full-rtt, else half of it
p50() { sed 's/\x1b\[[0-9;]*m//g' "$1" | awk '/percentile 50.000/ {print int($NF)}'; }
pick_ports AGENT_PORT UDP_PORT METRICS_PORT DATA_PORT AMETRICS_PORT
MEM=${IT_GPU_MEM:-auto}
# the agent's GPU options for this variant
GPU_OPTS=(--cuda-accels 0 --cpu-accels 0 --transport "$IT_TRANSPORT" --region-mem "$MEM")
[[ $IT_TRANSPORT == shm ]] || GPU_OPTS+=(--data-listen "127.0.0.1:$DATA_PORT")
log "path: transport $IT_TRANSPORT, --region-mem $MEM"

# ---- 1. static mode ---------------------------------------------------------------
log "== 1. sockperf-echo as a persistent kernel on GPU 0"
start_agent "${GPU_OPTS[@]}" --app sockperf-echo --metrics "127.0.0.1:$AMETRICS_PORT"
grep -q 'accel 0: GPU 0 ' "$AGENT_LOG" || fail "the agent did not describe GPU 0"
grep -q 'persistent kernel of' "$AGENT_LOG" || fail "no kernel launch logged"
case $MEM in
device) grep -q 'mqueues in GPU memory' "$AGENT_LOG" || fail "the agent did not say its mqueues are in GPU memory" ;;
*) grep -q 'mqueues in host memory mapped' "$AGENT_LOG" || fail "the agent did not say its mqueues are host-mapped" ;;
esac
start_frontend
out=$IT_DIR/pingpong.out
run_sockperf "$out" ping-pong -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 2 --full-rtt
check_sockperf "$out"
P50_0=$(p50 "$out")
timeout -k 3 "$(ts_s 20)" sockperf under-load -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 3 \
  --mps 5000 --reply-every 1 >"$IT_DIR/load.out" 2>&1 </dev/null ||
  { cat "$IT_DIR/load.out"; fail "sockperf under-load failed"; }
check_sockperf "$IT_DIR/load.out"
[[ -x $LYNX_UDP_FUZZ ]] || fail "$LYNX_UDP_FUZZ is missing: build first (make)"
timeout -k 2 "$(ts_s 60)" "$LYNX_UDP_FUZZ" --port "$UDP_PORT" --count 3000 --seed 13 \
  --cap 2032 >"$IT_DIR/fuzz.out" 2>&1 </dev/null
rc=$?
fuzz_summary "$IT_DIR/fuzz.out"
log "random datagrams: $(grep -m1 '^udp_fuzz: sent=' "$IT_DIR/fuzz.out")"
assert_eq "$rc" 0 "lynx-udp-fuzz exit status (every reply byte-exact, none unexpected or duplicated)"
assert_gt "$FZ_expected_replies" 0 "pong requests among the random datagrams"
assert_eq "$FZ_received_replies" "$FZ_expected_replies" "replies to random datagrams"
# GPU-stamped latency: a service time for every request the kernel took
sleep 0.5 # the agent samples every 250 ms
curl -sf --max-time 5 "http://127.0.0.1:$AMETRICS_PORT/metrics" >"$IT_DIR/agent-metrics.txt" ||
  fail "cannot read the agent's --metrics"
n=$(sed -n 's/^lynx_agent_accel_service_seconds_count{accel="0",kind="cuda"} //p' "$IT_DIR/agent-metrics.txt")
disp=$(metric lynx_frontend_dispatched_total) || fail "no lynx_frontend_dispatched_total"
log "GPU-stamped service times: $n, requests dispatched to the GPU: $disp"
assert_eq "$n" "$disp" "service times stamped by the kernel == requests dispatched"
# how the agent reached the mqueues: host-mapped with plain loads and
# stores, no copy; GPU memory over tcp with copies, writes never waited for
am() { sed -n "s/^lynx_agent_accel_$1{accel=\"0\",kind=\"cuda\"} //p" "$IT_DIR/agent-metrics.txt"; }
log "agent copies: writes $(am region_writes_total) reads $(am region_reads_total) copies $(am copies_total) syncs $(am copy_syncs_total) staging waits $(am staging_waits_total)"
if [[ $MEM == device ]]; then
  assert_gt "$(am region_writes_total)" "$disp" "writes into GPU memory (at least one per request)"
  assert_gt "$(am copies_total)" 0 "copies into GPU memory"
  assert_lt "$(am copy_syncs_total)" "$(am region_reads_total)" "stream synchronisations (one per batch of reads, none per write)"
else
  assert_eq "$(am copies_total)" 0 "copies made by the agent to reach host-mapped mqueues"
fi
stop_daemons

# ---- 2. work emulation ------------------------------------------------------------
log "== 2. --work-us 200 on the GPU"
start_agent "${GPU_OPTS[@]}" --app sockperf-echo --work-us 200
start_frontend
out=$IT_DIR/pingpong-work.out
run_sockperf "$out" ping-pong -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 2 --full-rtt
check_sockperf "$out"
P50_W=$(p50 "$out")
log "round trip p50 without work ${P50_0} us, with 200 us of work ${P50_W} us"
assert_ge "$P50_W" $((P50_0 + 200)) "round-trip p50 with --work-us 200 (us)"
stop_daemons

# ---- 3. a hung block in coordinator mode ------------------------------------------
log "== 3. sockperf-fault: a held block is reported and comes back"
pick_ports COORD_PORT API_PORT
it_require_coord
node_ids N1
start_coordinator --lease-ms 1500
start_node_agent "$N1" "${GPU_OPTS[@]}" --stall-ms 500
start_coord_frontend
api POST /v1/services -d "{\"name\":\"gf\",\"port\":$UDP_PORT,\"app\":\"sockperf-fault\",\"placement\":\"all\"}"
[[ $API_STATUS == 201 ]] || fail "POST /v1/services: HTTP $API_STATUS: $(cat "$API_BODY")"
wait_log "$FRONTEND_LOG" "serving service gf" 10 1 "$FRONTEND_PID"
run_sockperf "$IT_DIR/gf.out" ping-pong -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 1
check_sockperf "$IT_DIR/gf.out"
inst0=$(api_json /v1/mqueues '[.items[].instance] | unique | .[]')
# the GPU's resident-block budget reached the coordinator, the running
# kernel's blocks counted against it (docs/gpu.md)
res=$(ctl accelerators --json | jq -r '.items[0].blocks.resident')
held=$(ctl accelerators --json | jq -r '.items[0].blocks.held')
log "GPU resident blocks: $res, held by the running kernel: $held"
assert_gt "$res" 0 "resident blocks the agent registered for its GPU"
assert_gt "$held" 0 "blocks the running kernel holds, as the heartbeat reports"
printf 'LYNX-HANG 4000' >"/dev/udp/127.0.0.1/$UDP_PORT"
t0=$(now_ms)
until [[ $(ctl accelerators --json | jq -r '.items[0].health.dispatchable') == false ]]; do
  (($(now_ms) - t0 < 3500)) || fail "GPU accelerator not reported stalled within 3.5 s"
  sleep 0.05
done
log "ok: stalled after $(($(now_ms) - t0)) ms"
until [[ $(ctl accelerators --json | jq -r '.items[0].health.dispatchable') == true ]]; do
  (($(now_ms) - t0 < 8000)) || fail "GPU accelerator not dispatchable again within 8 s"
  sleep 0.05
done
assert_ge $(($(now_ms) - t0)) 4000 "ms until dispatchable again (not before the hang ends)"
assert_eq "$(api_json /v1/mqueues '[.items[].instance] | unique | .[]')" "$inst0" "instance (not restarted)"
run_sockperf "$IT_DIR/gf2.out" ping-pong -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 1
check_sockperf "$IT_DIR/gf2.out"

# ---- 4. SIGTERM under load -----------------------------------------------------------
log "== 4. SIGTERM to the agent under load"
timeout -k 3 "$(ts_s 20)" sockperf under-load -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 4 \
  --mps 5000 --reply-every 1 >"$IT_DIR/load-term.out" 2>&1 </dev/null &
track "$!" sockperf-term
sleep 1
t0=$(now_ms)
kill -TERM "$AGENT_PID"
wait_exit "$AGENT_PID" 5 || fail "agent did not exit within 5 s of SIGTERM under load"
assert_eq "$WAIT_RC" 0 "agent exit status on SIGTERM under load (kernel stopped)"
log "ok: agent exited $(($(now_ms) - t0)) ms after SIGTERM under load"
grep -q 'did not stop' "$AGENT_LOG" && fail "the kernel did not stop: $(grep 'did not stop' "$AGENT_LOG")"
stop "$FRONTEND_PID" 10
it_done
