#!/usr/bin/env bash
# cuda_nogpu: on a host without a usable GPU, `lynx-agent --cuda-accels all`
# (and an explicit ordinal) exits non-zero at once with a message that names
# CUDA and the GPU, before it listens or registers anywhere; and the strict
# GPU command (tests/gpu/prove.sh, make gpu-prove) fails, not skips, saying
# there is no GPU, with its verdict lines and results file. Skipped (77)
# where a GPU is usable: tests/gpu/gpu_serve.sh covers that host.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init cuda_nogpu
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  skip "this host has a GPU (nvidia-smi -L lists one): the GPU tests run instead"
fi
pick_ports AGENT_PORT

for spec in all 0; do
  out=$IT_DIR/agent-$spec.out
  t0=$(now_ms)
  timeout -k 2 "$(ts_s 10)" "$LYNX_BIN_DIR/lynx-agent" --cuda-accels "$spec" --app sockperf-echo \
    --listen "127.0.0.1:$AGENT_PORT" --node-id "$IT_NODE" >"$out" 2>&1 </dev/null
  rc=$?
  took=$(($(now_ms) - t0))
  log "--cuda-accels $spec: exit $rc after ${took} ms: $(head -c 300 "$out")"
  ((rc != 0 && rc != 124)) || fail "--cuda-accels $spec: exit status $rc, want a prompt non-zero exit"
  grep -q 'CUDA' "$out" || fail "--cuda-accels $spec: the message does not name CUDA: $(cat "$out")"
  grep -q 'GPU' "$out" || fail "--cuda-accels $spec: the message does not name the GPU: $(cat "$out")"
  assert_lt "$took" "$(ts_ms 10000)" "ms to refuse --cuda-accels $spec (at once, not after a wait)"
  ! grep -q 'serving descriptors' "$out" || fail "--cuda-accels $spec: the agent started serving"
done
# a malformed list is refused as such (only when the backend is built in:
# otherwise the missing backend is the reason)
out=$IT_DIR/agent-bad.out
"$LYNX_BIN_DIR/lynx-agent" --cuda-accels 0,x --node-id "$IT_NODE" >"$out" 2>&1 </dev/null &&
  fail "--cuda-accels 0,x was accepted"
log "--cuda-accels 0,x: $(head -c 300 "$out")"
# GPU memory behind the shm transport cannot be: refused as a usage error
# (exit 2) naming the way out, before any GPU is looked for; host memory
# mapped into the GPU is what shm gets by default (--region-mem auto)
out=$IT_DIR/agent-shm-device.out
"$LYNX_BIN_DIR/lynx-agent" --cuda-accels all --transport shm --region-mem device \
  --node-id "$IT_NODE" >"$out" 2>&1 </dev/null
rc=$?
log "--transport shm --region-mem device: exit $rc: $(head -c 300 "$out")"
if grep -q 'built without the CUDA backend' "$out"; then
  log "(built without CUDA: the backend's absence is the reason)"
else
  assert_eq "$rc" 2 "exit status of --transport shm --region-mem device"
  grep -q -- '--region-mem host' "$out" || fail "the refusal does not name --region-mem host: $(cat "$out")"
fi
# the strict command: exit 1 (a failure, never 77), the gpu verdict says
# why, and the same lines are in its results file
out=$IT_DIR/prove.out
PROVE_RESULTS=$IT_DIR/results timeout -k 2 "$(ts_s 60)" \
  bash "$IT_LIB_DIR/../gpu/prove.sh" "$LYNX_BIN_DIR" >"$out" 2>&1 </dev/null
rc=$?
log "tests/gpu/prove.sh: exit $rc: $(grep VERDICT "$out" | tr '\n' ' ')"
assert_eq "$rc" 1 "exit status of tests/gpu/prove.sh without a GPU"
grep -q '^VERDICT gpu: FAIL no usable GPU' "$out" || fail "prove.sh does not say there is no GPU: $(cat "$out")"
grep -q '^VERDICT all: FAIL' "$out" || fail "prove.sh has no overall verdict: $(cat "$out")"
results=$(ls "$IT_DIR"/results/gpu-prove-*.txt 2>/dev/null | head -1)
[[ -n $results ]] || fail "prove.sh wrote no results file in PROVE_RESULTS"
grep -q '^VERDICT gpu: FAIL' "$results" || fail "its results file lacks the verdict: $(cat "$results")"
it_done
