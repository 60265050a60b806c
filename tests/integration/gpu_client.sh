#!/usr/bin/env bash
# gpu_client: client mqueues on a GPU (docs/client-mqueues.md, "On a GPU"):
# mc-get and face-verify as persistent kernels calling a real memcached, on
# a host with an NVIDIA GPU and a lynx-agent built with CUDA (skipped with
# 77 and the reason otherwise). IT_TRANSPORT (tcp, shm) and IT_GPU_MEM
# (--region-mem: auto, host, device) pick the path, as for gpu_serve.
#
# Two agents under one coordinator: node G serves GPU 0 (--cuda-accels 0,
# no CPU accelerator, label kind=gpu), node C one CPU accelerator (kind=cpu).
# Every service exists twice, placed on each by its selector, over the same
# memcached, and the GPU's answers are compared with the CPU's:
#
#  1. mc-get with 4 server mqueues: the kernel runs 4 blocks, each with its
#     own client mqueue of "db" (the agent's log, the region's 4 + 4
#     mqueues); stored and missing keys, an invalid key, a 1,500-byte value
#     and 48 keys each sent from its own socket (so they spread over the
#     mqueues, and every block calls memcached): each GPU answer equals the
#     CPU's byte for byte, and every server mqueue of the GPU served some.
#  2. memcached stopped (SIGSTOP: connected, silent): ERROR after the call
#     timeout (>= 500 ms) from both; resumed (SIGCONT): the late replies are
#     skipped by their tags and the answers are right again.
#  3. memcached killed: ERROR at once (the frontend's BACKEND_DOWN) from
#     both; restarted: both serve again.
#  4. face-verify: the database filled by lynx-face-load, then a closed loop
#     of 8 against each service with --tol-e6 0: every answer must equal
#     lynx-face-load's own face_verify exactly, so the GPU's (LBP built by
#     the block) equal the CPU's bit for bit.
#  5. SIGTERM to the GPU agent while its blocks wait in calls to a stopped
#     memcached: the agent stops the kernel and exits 0 within 5 s.
export IT_TRANSPORT=${IT_TRANSPORT:-tcp} # lib.sh's default is shm
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init gpu_client
it_require memcached curl jq timeout
probe=$("$LYNX_BIN_DIR/lynx-agent" --cuda-accels 0 --list-accels 2>&1 </dev/null)
case $probe in
*"built without the CUDA backend"*) skip "lynx-agent was built without CUDA (make LYNX_CUDA=ON on a host with the toolkit)" ;;
*"no usable CUDA GPU"* | *"no CUDA GPU"* | *"does not exist"*) skip "no usable GPU here: $probe" ;;
esac
grep -q $'^0\tcuda\t' <<<"$probe" || fail "lynx-agent --list-accels: $probe"
log "GPU: $(grep $'^0\tcuda\t' <<<"$probe")"
it_require_coord
pick_ports COORD_PORT API_PORT METRICS_PORT MC KV_G KV_C FACE_G FACE_C DATA_G DATA_C
MEM=${IT_GPU_MEM:-auto}
GPU_OPTS=(--cuda-accels 0 --cpu-accels 0 --region-mem "$MEM" --labels kind=gpu)
CPU_OPTS=(--cpu-accels 1 --labels kind=cpu)
if [[ $IT_TRANSPORT != shm ]]; then
  GPU_OPTS+=(--data-listen "127.0.0.1:$DATA_G")
  CPU_OPTS+=(--data-listen "127.0.0.1:$DATA_C")
fi
log "path: transport $IT_TRANSPORT, --region-mem $MEM"

MCD_PID=''
# start_memcached: memcached on 127.0.0.1:$MC (tracked for cleanup)
start_memcached() {
  memcached -p "$MC" -U 0 -l 127.0.0.1 -u root -t 1 >>"$IT_DIR/memcached.log" 2>&1 &
  MCD_PID=$!
  track "$MCD_PID" memcached
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$MC") 2>/dev/null && return 0
    sleep 0.05
  done
  fail "memcached on port $MC did not start"
}
# mc_set KEY VALUE
mc_set() {
  local r
  exec 3<>"/dev/tcp/127.0.0.1/$MC" || fail "cannot reach memcached :$MC"
  printf 'set %s 0 0 %d\r\n%s\r\n' "$1" "${#2}" "$2" >&3
  IFS= read -r -t 2 r <&3 || true
  exec 3<&-
  [[ $r == STORED* ]] || fail "memcached did not store $1: '$r'"
}
store_keys() {
  local i
  mc_set k1 hello
  mc_set big "$(printf 'v%.0s' $(seq 1500))"
  for i in $(seq 32); do mc_set "r$i" "value-$i-$((i * 7919))"; done
}
# kv PORT KEY: lynx-kv-get's line for KEY from the service on PORT
kv() {
  "$LYNX_BIN_DIR/lynx-kv-get" --target "127.0.0.1:$1" --timeout-ms 3000 "$2" ||
    fail "lynx-kv-get failed"
}
ms_int() { sed -E 's/.*ms=([0-9]+).*/\1/' <<<"$1"; }
# both KEY: asks the GPU service and the CPU service for KEY; their answers
# (reply and length, not the time) must be equal. Sets ANSWER (the GPU's,
# without the time), G_MS and C_MS (whole milliseconds).
both() {
  local g c
  g=$(kv "$KV_G" "$1")
  c=$(kv "$KV_C" "$1")
  G_MS=$(ms_int "$g") C_MS=$(ms_int "$c")
  g=${g%$'\t'ms=*} c=${c%$'\t'ms=*}
  ANSWER=$g
  [[ $g == *$'\t'reply=* ]] || it_check_failed "key '$1': no answer from the GPU: '$g'"
  [[ $g == "$c" ]] || it_check_failed "key '$1': the GPU answered '${g:0:120}', the CPU '${c:0:120}'"
}
# expect KEY REPLY WHAT: both answer KEY with REPLY
expect() {
  both "$1"
  [[ $ANSWER == "$1"$'\t'"reply=$2"$'\t'* ]] || it_check_failed "$3: got '${ANSWER:0:120}', want reply=$2"
}
# until_served TIMEOUT_S WHAT: until both answer 16 stored keys in a row
# right, each from its own socket: every block's back-end connection is up
# (the frontend reconnects each with its own backoff, up to 5 s)
until_served() {
  local end=$(($(now_ms) + $1 * 1000)) run=0 i=0 g='' c='' want
  while ((run < 16 && $(now_ms) < end)); do
    i=$((i % 32 + 1))
    want="r$i"$'\t'"reply=value-$i-$((i * 7919))"$'\t'
    g=$(kv "$KV_G" "r$i") c=$(kv "$KV_C" "r$i")
    if [[ $g == "$want"* && $c == "$want"* ]]; then
      run=$((run + 1))
    else
      run=0
      sleep 0.2
    fi
  done
  ((run >= 16)) || it_check_failed "$2: last answers '$g' (GPU), '$c' (CPU)"
  ((run >= 16)) && log "ok: $2"
}
# wait_spread: until the coordinator's counts (frontend reports) show every
# server mqueue of the GPU's mc-get dispatched to; sets SERVED
wait_spread() {
  local end=$(($(now_ms) + 5000))
  while :; do
    SERVED=$(api_json /v1/mqueues '[.items[] | select(.service == "kvg" and .index < 4 and .dispatched > 0)] | length')
    [[ $SERVED == 4 ]] || (($(now_ms) >= end)) || { sleep 0.2; continue; }
    return 0
  done
}
# service NAME PORT APP SELECTOR
service() {
  api POST /v1/services -H 'Content-Type: application/json' -d "{\"name\":\"$1\",
    \"port\":$2,\"app\":\"$3\",\"mqueues_per_accel\":4,
    \"placement\":{\"selector\":{\"kind\":\"$4\"}},\"backends\":[
    {\"name\":\"db\",\"address\":\"127.0.0.1:$MC\",\"proto\":\"memcached\"}]}" ||
    fail "API down"
  [[ $API_STATUS == 201 ]] || fail "POST /v1/services $1: HTTP $API_STATUS: $(cat "$API_BODY")"
}
# wait_ready NAME TIMEOUT_S
wait_ready() {
  local end=$(($(now_ms) + $2 * 1000)) st=''
  while (($(now_ms) < end)); do
    st=$(api_json /v1/services ".items[] | select(.name == \"$1\") | .state + \": \" + .reason")
    [[ $st == "ready: " ]] && return 0
    sleep 0.2
  done
  fail "service $1 not ready within $2 s: $st"
}

start_memcached
store_keys
start_coordinator --lease-ms 3000
node_ids NG NC
start_node_agent "$NG" --transport "$IT_TRANSPORT" "${GPU_OPTS[@]}"
GPU_AGENT_PID=$AGENT_PID GPU_AGENT_LOG=$AGENT_LOG
start_node_agent "$NC" --transport "$IT_TRANSPORT" "${CPU_OPTS[@]}"
start_coord_frontend
service kvg "$KV_G" mc-get gpu
service kvc "$KV_C" mc-get cpu
service faceg "$FACE_G" face-verify gpu
service facec "$FACE_C" face-verify cpu
for s in kvg kvc faceg facec; do wait_ready "$s" 20; done

# ---- 1. mc-get: the GPU's answers are the CPU's ------------------------------------
log "== 1. mc-get on GPU 0 and on a CPU accelerator"
assert_log "$GPU_AGENT_LOG" "each block with its own client mqueue" "the kernel's blocks got client mqueues of their own"
grep -F 'persistent kernel of' "$GPU_AGENT_LOG" | while IFS= read -r l; do log "agent: ${l:0:200}"; done
assert_eq "$(api_json /v1/mqueues '[.items[] | select(.service == "kvg")] | length')" 8 \
  "mqueues of the GPU's mc-get instance (4 server mqueues, 4 blocks: a client mqueue each)"
assert_eq "$(api_json /v1/mqueues '[.items[] | select(.service == "kvc")] | length')" 5 \
  "mqueues of the CPU's mc-get instance (4 + 1)"
expect k1 hello "a stored key"
expect nokey "" "a missing key: empty"
expect "bad key" ERROR "an invalid key: ERROR"
both big
[[ $ANSWER == *$'\t'len=1500 ]] || it_check_failed "a 1,500-byte value: ${ANSWER:0:80}"
for i in $(seq 48); do both "r$i"; done # 1..32 stored, 33..48 missing
wait_spread
assert_eq "$SERVED" 4 "server mqueues of the GPU's mc-get that served requests (each block called memcached)"

# ---- 2. a silent back end: the call timeout -----------------------------------------
log "== 2. memcached stopped (SIGSTOP): ERROR after the call timeout"
kill -STOP "$MCD_PID"
expect k1 ERROR "memcached silent: ERROR"
assert_ge "$G_MS" 500 "ms until the GPU's ERROR (the call timeout)"
assert_ge "$C_MS" 500 "ms until the CPU's ERROR (the call timeout)"
assert_lt "$G_MS" 2000 "ms until the GPU's ERROR"
kill -CONT "$MCD_PID"
until_served 10 "served again once memcached resumed (late replies skipped)"
for i in 1 2 40; do both "r$i"; done
expect k1 hello "a stored key after the timeouts"

# ---- 3. the back end killed ---------------------------------------------------------
log "== 3. memcached killed: ERROR at once, then served again"
kill -9 "$MCD_PID"
wait_exit "$MCD_PID" 5 || fail "memcached did not die"
expect k1 ERROR "memcached killed: ERROR"
assert_lt "$G_MS" 200 "ms until the GPU's ERROR with the back end down"
assert_lt "$C_MS" 200 "ms until the CPU's ERROR with the back end down"
start_memcached
store_keys
until_served 20 "served again after memcached returned"
for i in 5 6 45; do both "r$i"; done

# ---- 4. face-verify ------------------------------------------------------------------
log "== 4. face-verify on GPU 0 and on a CPU accelerator"
"$LYNX_BIN_DIR/lynx-face-load" --fill "127.0.0.1:$MC" --identities 200 --seed 5 \
  >"$IT_DIR/face-fill.out" 2>&1 || { cat "$IT_DIR/face-fill.out"; fail "face fill"; }
for side in G C; do
  port=FACE_$side
  out=$IT_DIR/face-$side.out
  "$LYNX_BIN_DIR/lynx-face-load" --target "127.0.0.1:${!port}" --udp --closed-loop 8 \
    --seconds 3 --identities 200 --seed 5 --impostor-percent 50 --tol-e6 0 >"$out" 2>&1 ||
    { cat "$out"; it_check_failed "face-verify on $side: lynx-face-load exit status"; }
  log "$side: $(tail -1 "$out")"
  grep -q ' wrong=0 ' "$out" || it_check_failed "face-verify on $side: wrong answers"
  grep -q ' timeouts=0 ' "$out" || it_check_failed "face-verify on $side: unanswered requests"
  grep -qE ' answered=[1-9]' "$out" || it_check_failed "face-verify on $side: nothing answered"
  grep -qE ' matches=[1-9]' "$out" || it_check_failed "face-verify on $side: no match at all"
done

# ---- 5. SIGTERM while calls wait ------------------------------------------------------
log "== 5. SIGTERM to the GPU agent while its blocks wait for a stopped memcached"
kill -STOP "$MCD_PID"
pids=()
for i in 1 2 3 4; do
  "$LYNX_BIN_DIR/lynx-kv-get" --target "127.0.0.1:$KV_G" --timeout-ms 2000 "r$i" \
    >"$IT_DIR/term-$i.out" 2>&1 &
  pids+=("$!")
  track "$!" "kv-get-$i"
done
sleep 0.1
t0=$(now_ms)
kill -TERM "$GPU_AGENT_PID"
wait_exit "$GPU_AGENT_PID" 5 || fail "the GPU agent did not exit within 5 s of SIGTERM with calls waiting"
assert_eq "$WAIT_RC" 0 "the GPU agent's exit status (kernel stopped)"
log "ok: the GPU agent exited $(($(now_ms) - t0)) ms after SIGTERM"
grep -q 'did not stop' "$GPU_AGENT_LOG" && fail "the kernel did not stop: $(grep 'did not stop' "$GPU_AGENT_LOG")"
kill -CONT "$MCD_PID"
for p in "${pids[@]}"; do wait_exit "$p" 5 || true; done
it_done
