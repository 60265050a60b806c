#!/usr/bin/env bash
# prove.sh - one strict command that proves the GPU path on a GPU host
# (make gpu-prove; docs/gpu.md, "One command on a GPU host").
#
#   tests/gpu/prove.sh [BIN_DIR]        BIN_DIR: build/bin, or .gpu/bin
#
# It checks, in this order, each under its own timeout and all of it
# within PROVE_BUDGET_S (300 s), printing one verdict line per check
# ("VERDICT name: PASS|FAIL what"):
#   gpu         the GPU the agent finds (lynx-agent --list-accels), with
#               the driver and runtime versions (nvidia-smi, the probe)
#   probe       the facts the code relies on (bin/lynx-gpu-probe: timer
#               step, mapped-read round trip, fence costs, which calls
#               block while a persistent kernel spins, residency)
#   gpu_serve   over tcp with host-mapped mqueues, over shm host-mapped,
#               over tcp in device memory
#   gpu_lenet   LeNet on the GPU, every answer against the reference
#   gpu_client  client mqueues on the GPU (host-mapped, then device memory)
#   gpu_fault   a user's GPU module (examples/vector-sum-gpu) loaded through
#               the driver API and served, every answer checked; a module
#               whose kernel traps: instances failed, exit 75, served again
# A test that skips (exit 77) is a FAIL naming what it found missing: this
# command has no skips. Without a usable GPU the gpu check fails, saying
# so, and nothing else runs. Exit 0 only when every check passed.
#
# What it prints also goes to bench/results/gpu-prove-STAMP.txt (or the
# directory PROVE_RESULTS names: the tests' own temporary one). The
# Fashion-MNIST test set comes from LYNX_FASHION_MNIST (a directory with
# t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz; tests/gpu/pack.sh
# carries it to .gpu/data/fashion-mnist), else the Debian package's.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=$(cd "${1:-$ROOT/build/bin}" 2>/dev/null && pwd) || {
  echo "prove: no binaries directory ${1:-$ROOT/build/bin} (build first)" >&2
  exit 2
}
BUDGET=${PROVE_BUDGET_S:-300}
if [[ -z ${LYNX_FASHION_MNIST:-} && -r $ROOT/.gpu/data/fashion-mnist/t10k-images-idx3-ubyte.gz ]]; then
  export LYNX_FASHION_MNIST=$ROOT/.gpu/data/fashion-mnist
fi
OUT_DIR=${PROVE_RESULTS:-$ROOT/bench/results}
mkdir -p "$OUT_DIR" || exit 2
OUT=$OUT_DIR/gpu-prove-$(date -u +%Y%m%dT%H%M%SZ).txt
LOGS=$(mktemp -d /tmp/lynx-prove.XXXXXX)
T0=$(date +%s)
declare -a VERDICTS=()
FAILED=0

say() { echo "$*" | tee -a "$OUT"; }
verdict() { # name PASS|FAIL what
  local line="VERDICT $1: $2 $3"
  VERDICTS+=("$line")
  [[ $2 == PASS ]] || FAILED=1
  say "$line"
}
left() { echo $((BUDGET - ($(date +%s) - T0))); }

say "# tests/gpu/prove.sh $(date -u +%FT%TZ) on $(uname -n), $(nproc) cores; git $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'); binaries $BIN"

# ---- gpu: what the agent finds, and the versions --------------------------
if command -v nvidia-smi >/dev/null 2>&1; then
  smi=$(timeout 15 nvidia-smi --query-gpu=name,driver_version,pci.bus_id,memory.total --format=csv,noheader 2>&1)
  say "nvidia-smi: ${smi:-nothing}"
else
  say "nvidia-smi: not installed"
fi
list=$(timeout 20 "$BIN/lynx-agent" --cuda-accels all --list-accels 2>&1 </dev/null)
rc=$?
say "lynx-agent --cuda-accels all --list-accels (exit $rc):"
say "$(sed 's/^/  /' <<<"$list")"
if ((rc != 0)) || ! grep -q $'^[0-9]*\tcuda\t' <<<"$list"; then
  verdict gpu FAIL "no usable GPU: $(tr '\n' ' ' <<<"$list" | head -c 400)"
  say "# nothing else runs without a GPU"
  say "VERDICT all: FAIL (1 check failed, 0 run after it; $(($(date +%s) - T0)) s); results in ${OUT#"$ROOT"/}"
  rm -rf "$LOGS"
  exit 1
fi
verdict gpu PASS "$(grep -c $'\tcuda\t' <<<"$list") GPU(s): $(grep -m1 $'\tcuda\t' <<<"$list" | cut -f3- | tr '\t' ' ')"

# ---- the probe ------------------------------------------------------------
# step NAME CAP_S CMD...: runs CMD within min(CAP_S, what is left of the
# budget), its output in $LOGS/NAME.log; sets RC (124: out of time)
step() {
  local name=$1 cap=$2 t
  shift 2
  t=$(left)
  ((t > cap)) && t=$cap
  if ((t <= 0)); then
    RC=124
    echo "not run: the ${BUDGET} s budget was spent" >"$LOGS/$name.log"
    return
  fi
  timeout -k 5 "$t" "$@" >"$LOGS/$name.log" 2>&1 </dev/null
  RC=$?
}

if [[ -x $BIN/lynx-gpu-probe ]]; then
  step probe 90 "$BIN/lynx-gpu-probe"
  grep '^CHECK' "$LOGS/probe.log" | sed 's/^/  /' | tee -a "$OUT"
  if ((RC == 0)); then
    verdict probe PASS "$(grep -c '^CHECK' "$LOGS/probe.log") checks measured"
  else
    verdict probe FAIL "exit $RC: $(grep -m1 'FAILED\|not run' "$LOGS/probe.log" || tail -1 "$LOGS/probe.log")"
  fi
else
  verdict probe FAIL "no $BIN/lynx-gpu-probe (a build with CUDA makes it)"
fi

# ---- the GPU integration tests, strict -------------------------------------
# it NAME SCRIPT CAP_S [VAR=VALUE...]
it() {
  local name=$1 script=$2 cap=$3
  shift 3
  step "$name" "$cap" env LYNX_BIN_DIR="$BIN" "$@" bash "$ROOT/tests/integration/$script.sh" "$BIN"
  case $RC in
  0) verdict "$name" PASS "($(grep -c ': ok' "$LOGS/$name.log") checks)" ;;
  77) verdict "$name" FAIL "skipped, which this command does not allow: $(grep -m1 'SKIP' "$LOGS/$name.log")" ;;
  124) verdict "$name" FAIL "did not finish within its time ($(tail -1 "$LOGS/$name.log"))" ;;
  *) verdict "$name" FAIL "exit $RC: $(grep -m1 'FAIL' "$LOGS/$name.log" || tail -1 "$LOGS/$name.log")" ;;
  esac
  if ((RC != 0)); then
    say "  --- $name: the last lines of its log"
    tail -25 "$LOGS/$name.log" | sed 's/^/  | /' | tee -a "$OUT"
  fi
}
it gpu_serve.shm_host gpu_serve 60 IT_TRANSPORT=shm IT_GPU_MEM=host
it gpu_serve gpu_serve 60 IT_TRANSPORT=tcp
it gpu_serve.tcp_device gpu_serve 60 IT_TRANSPORT=tcp IT_GPU_MEM=device
it gpu_lenet gpu_lenet 45
it gpu_client gpu_client 45
it gpu_client.tcp_device gpu_client 45 IT_TRANSPORT=tcp IT_GPU_MEM=device
# users' GPU applications: the example's module, a kernel that traps
it gpu_fault gpu_fault 60

n_fail=$(printf '%s\n' "${VERDICTS[@]}" | grep -c ': FAIL')
say "VERDICT all: $( ((FAILED)) && echo FAIL || echo PASS) (${#VERDICTS[@]} checks, $n_fail failed; $(($(date +%s) - T0)) s); results in ${OUT#"$ROOT"/}"
rm -rf "$LOGS"
exit "$FAILED"
