#!/usr/bin/env bash
# gpu_fault: a GPU application from a CUDA module, end to end, and a fault
# in its kernel (docs/writing-apps.md, "GPU applications" and "Faults").
#
# On a host with a GPU it runs lynx-agent itself; elsewhere
# lynx-agent-fakegpu: the real agent over the fake CUDA runtime of the unit
# tests (tests/fakegpu/fakegpu.c), whose GPU's persistent kernel is a
# thread serving the region with the real ring code and whose module
# kernels answer as vector-sum's handler (its host twin) and fault on
# LYNX-TRAP. The modules are the real fatbins the build made from
# examples/vector-sum-gpu and tests/plugins/gpu_trap.cu (which echoes, and
# traps on LYNX-TRAP), loaded through the driver API.
#
#  1. The agent loads both modules and refuses one built for another GPU
#     ABI, with the reason; the node lists vector-sum on its GPU only.
#  2. Services of both through the API, placed on the GPU: every answer of
#     vsum checked against the sums the test computes.
#  3. A request that makes trap's kernel fault (a sticky error, which
#     poisons the GPU's CUDA context for both kernels): the instances are
#     reported failed with the CUDA error, shown as the services' reason;
#     the agent says it restarts, and exits with status 75 for its
#     supervisor.
#  4. The supervisor's restart (the same command again): the services are
#     placed on the fresh process's GPU and vsum answers right again.
#  5. Static mode: --app of the module under another file name (its own
#     name wins, said in the log), beside a CPU accelerator, which gets no
#     instance of it; every answer checked.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init gpu_fault
it_require_coord
it_require python3 jq
pick_ports COORD_PORT API_PORT METRICS_PORT P_VSUM P_TRAP AGENT_PORT UDP_PORT
IT_SOFT=1

BUILD=$(cd "$LYNX_BIN_DIR/.." && pwd)
PLUGINS=$BUILD/plugins
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  AGENT=lynx-agent
  log "a GPU: the real agent and runtime ($(nvidia-smi -L | head -1))"
else
  AGENT=lynx-agent-fakegpu
  [[ -x $LYNX_BIN_DIR/$AGENT ]] ||
    skip "no GPU and no lynx-agent-fakegpu: this build has no CUDA toolkit (its GPU backend is not built)"
  export LYNX_FAKE_GPUS=1
fi
for m in vector-sum gpu-bad-abi gpu-trap; do
  [[ -f $PLUGINS/$m.fatbin ]] || fail "$PLUGINS/$m.fatbin is missing: build first (make)"
done

# vsum N: N vectors of random length to the service, each answer checked
# (count and sum, little endian; "ERROR" for a request that is no vector);
# prints "asked N right N"
cat >"$IT_DIR/vsum.py" <<'PY'
import random, socket, struct, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2.0)
rng = random.Random(n)
asked = right = 0
for i in range(n):
    if i % 10 == 9:
        req, want = b"abc", b"ERROR"  # not a whole number of elements
    else:
        v = [rng.randrange(1 << 32) for _ in range(rng.randrange(1, 200))]
        req = struct.pack("<%dI" % len(v), *v)
        want = struct.pack("<IIQ", len(v), 0, sum(v) % (1 << 64))
    for attempt in range(3):  # UDP: a datagram may be lost, never wrong
        s.sendto(req, ("127.0.0.1", port))
        try:
            got = s.recv(65536)
            break
        except socket.timeout:
            got = None
    asked += 1
    if got == want:
        right += 1
    else:
        print("request %d: answer %r, want %r" % (i, got, want), file=sys.stderr)
print("asked %d right %d" % (asked, right))
PY

start_agent_n1() {
  spawn_daemon "$AGENT" "agent-$N1" "($N1)" --coordinator "127.0.0.1:$COORD_PORT" \
    --node-id "$N1" --transport shm --cuda-accels 0 --cpu-accels 1 \
    --app-load "vector-sum=$PLUGINS/vector-sum.fatbin,$PLUGINS/gpu-bad-abi.fatbin,$PLUGINS/gpu-trap.fatbin"
  AGENT_PID=$SPAWN_PID AGENT_LOG=$SPAWN_LOG
  wait_log "$AGENT_LOG" "registered with coordinator" 10 1 "$AGENT_PID"
}

# ---- 1. the module loaded, the bad one refused ---------------------------------
log "== 1. the agent loads vector-sum's module for its GPU"
start_coordinator
node_ids N1
start_agent_n1
assert_log "$AGENT_LOG" "GPU application 'vector-sum' loaded from $PLUGINS/vector-sum.fatbin (sm_" \
  "the agent's log says it loaded the module for its GPU"
[[ $(api_json "/v1/nodes/$N1" '[.accelerators[] | {kind, v: ([.apps[]] | index("vector-sum") != null)}] | map(.kind + "=" + (.v | tostring)) | join(",")') == "cuda=true,cpu=false" ]] ||
  it_check_failed "vector-sum is not listed on the GPU alone: $(api_json "/v1/nodes/$N1" '[.accelerators[] | {kind, apps}]')"
[[ $(api_json "/v1/nodes/$N1" '.refused_apps[] | select(.name == "gpu-bad-abi") | .reason') == *"built for GPU ABI version 99; this agent's is 1"* ]] ||
  it_check_failed "gpu-bad-abi is not refused for its ABI: $(api_json "/v1/nodes/$N1" .refused_apps)"
log "ok: the node lists vector-sum on its GPU, gpu-bad-abi refused for its ABI"

# ---- 2. a service of it, every answer checked -----------------------------------
log "== 2. a vector-sum service, placed on the GPU"
start_coord_frontend
serve_service vsum "\"port\":$P_VSUM,\"app\":\"vector-sum\",\"app_config\":{\"note\":\"per service\"}"
serve_service trap "\"port\":$P_TRAP,\"app\":\"gpu-trap\""
wait_svc vsum '.state == "ready"' 10
wait_svc trap '.state == "ready"' 10
out=$(python3 "$IT_DIR/vsum.py" "$P_VSUM" 60)
assert_str "$out" "asked 60 right 60" "vsum: every answer, from the GPU module's kernel"
# served by the GPU (accel 0), the accelerator that took the requests
wait_requests_grow 5 "$N1/0=59" || it_check_failed "the GPU did not count vsum's requests: $(accel_requests)"

# ---- 3. a fault in the kernel ----------------------------------------------------
log "== 3. a request that makes trap's kernel fault"
python3 -c 'import socket,sys; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"LYNX-TRAP", ("127.0.0.1", int(sys.argv[1])))' "$P_TRAP"
wait_log "$AGENT_LOG" "2 instances failed with it; CUDA recovers such a context only in a fresh process" 5 1
assert_log "$AGENT_LOG" ": cudaError" "the agent's log names the CUDA error"
wait_exit "$AGENT_PID" 15 || fail "the agent did not exit after its GPU's context was poisoned"
assert_eq "$WAIT_RC" 75 "the agent's exit status (for its supervisor to restart it)"
# the poisoned context ended both kernels: their stops found them dead, not hung
! grep -q "did not stop within" "$AGENT_LOG" ||
  it_check_failed "the agent took a dead kernel for a hung one: $(grep "did not stop within" "$AGENT_LOG")"
for s in vsum trap; do
  wait_svc "$s" '(.reason | test("instance on '"$N1"'/0 failed: accel 0 .*failed: .*cudaError"))' 5
  log "ok: $s: $(svc "$s" '.state + ": " + .reason')"
done

# ---- 4. the supervisor's restart ---------------------------------------------------
log "== 4. restarted as its supervisor would: a fresh process, a fresh context"
start_agent_n1
wait_svc vsum '.state == "ready"' 15
# until the frontend dispatches to the new instance (its table follows)
end=$(($(now_ms) + $(ts_s 10) * 1000))
until [[ $(python3 "$IT_DIR/vsum.py" "$P_VSUM" 1 2>/dev/null) == "asked 1 right 1" ]]; do
  (($(now_ms) < end)) || fail "vsum answers nothing right 10 s after its instance was placed again"
  sleep 0.2
done
out=$(python3 "$IT_DIR/vsum.py" "$P_VSUM" 40)
assert_str "$out" "asked 40 right 40" "vsum after the restart: every answer"
stop "$AGENT_PID" 10
assert_eq "$WAIT_RC" 0 "the agent's exit status on SIGTERM"
stop "$FRONTEND_PID" 10

# ---- 5. static mode --------------------------------------------------------------
log "== 5. static mode: --app of a module named otherwise than its file, beside a CPU"
cp "$PLUGINS/vector-sum.fatbin" "$IT_DIR/vsum.fatbin"
spawn_daemon "$AGENT" agent "" --listen "127.0.0.1:$AGENT_PORT" --node-id "$IT_NODE" \
  --transport shm --cuda-accels 0 --cpu-accels 1 --mqueues 4 --app vsum \
  --app-load "$IT_DIR/vsum.fatbin"
AGENT_PID=$SPAWN_PID AGENT_LOG=$SPAWN_LOG
wait_log "$AGENT_LOG" "serving descriptors on" 10 1 "$AGENT_PID"
assert_log "$AGENT_LOG" "--app vsum: the module $IT_DIR/vsum.fatbin names its application 'vector-sum'" \
  "the agent says which application --app's module is"
assert_log "$AGENT_LOG" "does not run 'vector-sum': no instance there" \
  "the CPU accelerator gets no instance of the GPU application"
start_frontend
out=$(python3 "$IT_DIR/vsum.py" "$UDP_PORT" 30)
assert_str "$out" "asked 30 right 30" "static mode: every answer, from the GPU alone"
stop_daemons
it_done
