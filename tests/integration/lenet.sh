#!/usr/bin/env bash
# lenet: LeNet-5 inference as a Lynx service (docs/lenet.md), on CPU
# accelerators, driven by lynx-lenet-load with Fashion-MNIST test images.
#
#  1. weights that do not load: an agent asked to run lenet with a
#     truncated weights file, or a missing one, does not start the
#     instance and says why (static mode: it exits 1 with the reason).
#  2. an agent with 2 CPU accelerators running lenet (the committed
#     weights), a frontend. 600 test images 4 at a time over 3 client
#     sockets, then 200 more
#     ping-pong (the last of the test set): every request answered, every
#     class equal to the training script's reference class of its image,
#     the logits of the reference images bit-equal, the accuracy equal to
#     the reference's (offline) accuracy on the same images.
#  3. malformed requests (1, 783, 801 and 1024 bytes) sent before the
#     images get no answer: the application drops them and the frontend
#     counts each (reason app_dropped), the instances' totals say the
#     same; nothing else is dropped.
#  4. lynx-lenet-classify: test image 0 is an ankle boot, as the reference
#     and its label say; so is the same image given as a PGM file and as
#     raw bytes; a file of the wrong size is refused (exit 2).
# Skipped (77) without the dataset-fashion-mnist package.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init lenet
it_require curl timeout python3
DATA=/usr/share/datasets/fashion-mnist
[[ -r $DATA/t10k-images-idx3-ubyte.gz && -r $DATA/t10k-labels-idx1-ubyte.gz ]] ||
  skip "no Fashion-MNIST test set in $DATA (install dataset-fashion-mnist: deploy/install-deps.sh)"
ROOT=$(cd "$IT_LIB_DIR/../.." && pwd)
MODEL=$ROOT/models/lenet-fashion.bin
REF=$ROOT/models/lenet-fashion.ref
[[ -r $MODEL && -r $REF ]] || fail "the committed $MODEL or $REF is missing"
[[ -x $LYNX_BIN_DIR/lynx-lenet-load ]] || fail "lynx-lenet-load is missing: build first"
pick_ports AGENT_PORT UDP_PORT METRICS_PORT

# ---- 1. weights that do not load --------------------------------------------------
head -c 5000 "$MODEL" >"$IT_DIR/truncated.bin"
# bad_model FILE REASON: the agent exits 1 and its log gives REASON for FILE
bad_model() {
  NOWAIT=1 start_agent --app lenet --lenet-model "$1"
  wait_exit "$AGENT_PID" 10 || fail "agent with weights $1 did not exit"
  assert_eq "$WAIT_RC" 1 "agent exit status with weights $1"
  assert_log "$AGENT_LOG" "lenet: cannot load its weights: $2" \
    "the agent says why lenet cannot start"
  [[ -z $(agent_shm "$AGENT_PID") ]] || fail "agent $AGENT_PID left a region"
}
bad_model "$IT_DIR/truncated.bin" "$IT_DIR/truncated.bin: truncated: 5000 bytes"
bad_model "$IT_DIR/missing.bin" \
  "cannot open $IT_DIR/missing.bin: No such file or directory"

# ---- 2. the service ---------------------------------------------------------------------
start_agent --app lenet --lenet-model "$MODEL" --mqueues 2 --slots 256
assert_log "$AGENT_LOG" "lenet: weights $MODEL loaded" "weights loaded once"
assert_eq "$(grep -c 'lenet: weights .* loaded' "$AGENT_LOG")" 1 \
  "weights loaded once for both accelerators"
start_frontend

# load OUT ARGS...: runs lynx-lenet-load; sets L_<key> from its summary
load() { lenet_load "$@"; }

MALFORMED=40
load "$IT_DIR/window.out" --count 600 --window 4 --flows 3 --malformed "$MALFORMED"
assert_eq "$L_sent" 600 "requests sent"
assert_eq "$L_answered" 600 "requests answered"
assert_eq "$L_disagree" 0 "classes that differ from the reference"
assert_eq "$L_unexpected" 0 "answers to malformed requests (or duplicates)"
assert_eq "$L_bad_answers" 0 "answers that do not decode"
assert_eq "$L_logits_checked" 500 "answers whose logits were compared bit for bit"
assert_eq "$L_logit_mismatch" 0 "logits that differ from the reference"
assert_eq "$L_correct" "$L_ref_correct" "correct classes (the reference's offline count)"
assert_gt "$L_correct" 480 "correct classes of 600 (about 90%)"

load "$IT_DIR/pingpong.out" --count 200 --window 1 --first 9800
assert_eq "$L_answered" 200 "ping-pong requests answered"
assert_eq "$L_disagree" 0 "ping-pong classes that differ from the reference"
assert_eq "$L_correct" "$L_ref_correct" "ping-pong correct classes (offline count)"

# ---- 3. the counters ---------------------------------------------------------------------
scrape_stable "$IT_DIR/metrics.txt"
export METRICS_FROM=$IT_DIR/metrics.txt
assert_eq "$(metric lynx_frontend_responded_total)" 800 "responses sent by the frontend"
assert_eq "$(metric lynx_frontend_dropped_total 'reason="app_dropped"')" "$MALFORMED" \
  "malformed requests dropped by the application"
total=$(metric lynx_frontend_dropped_total) || fail "no dropped_total"
assert_eq "$total" "$MALFORMED" "drops of any reason"
unset METRICS_FROM

# ---- 4. one image, as an operator asks ---------------------------------------------------
CLASSIFY=$LYNX_BIN_DIR/lynx-lenet-classify
"$CLASSIFY" --target "127.0.0.1:$UDP_PORT" --index 0 >"$IT_DIR/one.out" 2>&1 ||
  it_check_failed "lynx-lenet-classify --index 0: $(cat "$IT_DIR/one.out")"
assert_log "$IT_DIR/one.out" "class 9 (ankle boot), label 9 (ankle boot)" \
  "test image 0 classified as the reference and its label say"
# the same image as a 28x28 PGM of one's own, and as 784 raw bytes
python3 - "$DATA/t10k-images-idx3-ubyte.gz" "$IT_DIR/img" <<'PY'
import gzip, sys
px = gzip.open(sys.argv[1]).read()[16:16 + 784]
open(sys.argv[2] + ".pgm", "wb").write(b"P5 28 28 255\n" + px)
open(sys.argv[2] + ".raw", "wb").write(px)
PY
for f in img.pgm img.raw; do
  "$CLASSIFY" --target "127.0.0.1:$UDP_PORT" --image "$IT_DIR/$f" >"$IT_DIR/one-$f.out" 2>&1 ||
    it_check_failed "lynx-lenet-classify --image $f: $(cat "$IT_DIR/one-$f.out")"
  assert_log "$IT_DIR/one-$f.out" "class 9 (ankle boot)," "the image from $f classified"
done
head -c 100 "$IT_DIR/img.raw" >"$IT_DIR/short.raw"
"$CLASSIFY" --target "127.0.0.1:$UDP_PORT" --image "$IT_DIR/short.raw" >"$IT_DIR/short.out" 2>&1
assert_eq "$?" 2 "lynx-lenet-classify with a 100-byte image: exit status"
assert_log "$IT_DIR/short.out" "want 784 raw pixels or a 28x28 binary PGM" \
  "a file of the wrong size is refused with the reason"

stop_daemons
# the accelerators' own count, from the instances' totals as they stop
dropped=$(grep -o '[0-9]* dropped by the app' "$AGENT_LOG" | awk '{s += $1} END {print s + 0}')
assert_eq "$dropped" "$MALFORMED" "requests the instances say they dropped"
it_done
