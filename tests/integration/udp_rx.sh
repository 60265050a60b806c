#!/usr/bin/env bash
# udp_rx: both UDP receive paths of lynx-frontend (--rx uring: io_uring's
# multishot recvmsg; --rx socket: libuv's recvmmsg) serve the same traffic
# with the same accounting (docs/design.md, "Receive path"). For each path,
# a frontend with 2 workers (2 rings, or 2 sockets read by recvmmsg):
#
#  1. its log says which path it took, and /metrics says it of both
#     workers: lynx_frontend_rx_path{path="<rx>"} 2, the other path 0;
#  2. sockperf ping-pong at 14, 64, 1400, 2032 (the largest a 2048-byte
#     slot takes) and 65000 bytes (through the rings' large-message areas):
#     every answer, none dropped, duplicated or out of order;
#  3. sockperf under-load, 5000 msg/s for 3 s: the frontend answers every
#     request it received and drops none (2048-slot rings absorb the
#     scheduling stalls of a loaded 2-core machine);
#  4. lynx-udp-fuzz, 3000 datagrams of 0 to 65,507 bytes (empty ones
#     included; the agent takes messages up to its default --msg-max, so
#     none is oversize): every reply byte-exact, so no datagram was
#     truncated on either path; received == sent, oversize == 0, responded
#     == expected replies == replies received;
#  5. receive system calls: the uring path arms its ring at most once per
#     empty datagram and per exhaustion of its buffers, far fewer calls than
#     datagrams; the socket path makes at least one recvmmsg per 20;
#  6. SIGTERM: exit status 0 (the ring's receive cancelled; under ASan,
#     nothing leaked).
#
# Where io_uring cannot receive (the frontend's --rx uring refuses to start
# and says why), the socket path is still checked and the test then exits
# 77 with that reason.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init udp_rx
it_require sockperf curl timeout
[[ -x $LYNX_UDP_FUZZ ]] || fail "$LYNX_UDP_FUZZ is missing: build first (make)"
pick_ports AGENT_PORT UDP_PORT METRICS_PORT
CAP=65507 SLOT=2032 # UDP's largest payload; a 2048-byte slot's
NO_URING=''

# counts PREFIX: one stable scrape's counters of the service into
# PREFIX<name> (rcv resp disp over app drops calls nobufs)
counts() {
  local f=$IT_DIR/metrics.$1.txt k v
  local -A m=([rcv]=lynx_frontend_received_total
    [resp]=lynx_frontend_responded_total [disp]=lynx_frontend_dispatched_total
    [calls]=lynx_frontend_rx_syscalls_total [nobufs]=lynx_frontend_rx_nobufs_total
    [drops]=lynx_frontend_dropped_total)
  scrape_stable "$f"
  export METRICS_FROM=$f
  for k in "${!m[@]}"; do
    v=$(metric "${m[$k]}") || fail "no ${m[$k]}"
    printf -v "$1$k" '%s' "$v"
  done
  v=$(metric lynx_frontend_dropped_total 'reason="oversize"') || fail "no oversize"
  printf -v "$1over" '%s' "$v"
  v=$(metric lynx_frontend_dropped_total 'reason="app_dropped"') || fail "no app_dropped"
  printf -v "$1app" '%s' "$v"
  unset METRICS_FROM
}

serve() { # serve RX: checks 1-6 on one path
  local rx=$1 other out m rc v calls nobufs rcv
  other=$([[ $rx == uring ]] && echo socket || echo uring)
  start_agent --slots 2048
  NOWAIT=1 start_frontend --rx "$rx" --workers 2
  local end=$(($(now_ms) + 10000))
  until grep -qF "serving UDP" "$FRONTEND_LOG"; do
    if ! is_alive "$FRONTEND_PID"; then
      wait "$FRONTEND_PID"
      rc=$?
      untrack "$FRONTEND_PID"
      [[ $rx == uring && $rc == 1 ]] && grep -qF -- "--rx uring: io_uring cannot receive UDP here" \
        "$FRONTEND_LOG" || { cat "$FRONTEND_LOG"; fail "frontend --rx $rx exited $rc"; }
      NO_URING=$(grep -m1 -F -- "--rx uring:" "$FRONTEND_LOG")
      log "io_uring unavailable: $NO_URING"
      stop "$AGENT_PID" 10
      return 0
    fi
    (($(now_ms) < end)) || fail "frontend --rx $rx: no 'serving UDP' in 10 s"
    sleep 0.05
  done
  log "---- --rx $rx ----"
  # 1. which path
  if [[ $rx == uring ]]; then
    assert_log "$FRONTEND_LOG" "receive path: io_uring" "log: receive path io_uring"
  else
    assert_log "$FRONTEND_LOG" "receive path: socket (recvmmsg), as --rx socket says" \
      "log: receive path socket"
  fi
  assert_log "$FRONTEND_LOG" ", rx $rx" "serving line names rx $rx"
  v=$(metric lynx_frontend_rx_path "path=\"$rx\"") || fail "no rx_path{path=\"$rx\"}"
  assert_eq "$v" 2 "lynx_frontend_rx_path{path=\"$rx\"} (workers)"
  v=$(metric lynx_frontend_rx_path "path=\"$other\"") || fail "no rx_path{path=\"$other\"}"
  assert_eq "$v" 0 "lynx_frontend_rx_path{path=\"$other\"}"
  counts S_ # at the start

  # 2. ping-pong at several sizes
  for m in 14 64 1400 $SLOT 65000; do
    out=$IT_DIR/$rx-pingpong-m$m.out
    run_sockperf "$out" ping-pong -i 127.0.0.1 -p "$UDP_PORT" -m "$m" -t 2
    check_sockperf "$out"
  done

  # 3. under-load
  out=$IT_DIR/$rx-underload.out
  sockperf_base
  run_sockperf "$out" under-load -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 3 \
    --mps 5000 --reply-every 1 --buffer-size 4194304
  check_sockperf_served "$out"

  # 4. every size, empty included, exactly accounted
  counts B_ # before the fuzz
  out=$IT_DIR/$rx-fuzz.out
  timeout -k 2 "$(ts_s 60)" "$LYNX_UDP_FUZZ" --port "$UDP_PORT" --count 3000 \
    --seed 15 --cap "$CAP" --slot "$SLOT" >"$out" 2>&1 </dev/null
  rc=$?
  cat "$out"
  fuzz_summary "$out"
  counts A_ # after it
  assert_eq "$rc" 0 "$rx: lynx-udp-fuzz exit status (every reply byte-exact)"
  assert_gt "$FZ_empty" 0 "$rx: empty datagrams in the mix"
  assert_eq $((A_rcv - B_rcv)) "$FZ_sent" "$rx: received == sent (incl. $FZ_empty empty)"
  assert_eq "$FZ_oversize" 0 "$rx: datagrams longer than the service takes"
  assert_eq $((A_over - B_over)) 0 "$rx: dropped{oversize} (none truncated)"
  assert_eq "$FZ_received_replies" "$FZ_expected_replies" "$rx: replies received == expected"
  assert_eq $((A_resp - B_resp)) "$FZ_expected_replies" "$rx: responded == expected replies"
  assert_eq $((A_drops - B_drops)) $((A_over - B_over + A_app - B_app)) \
    "$rx: no drop but oversize and the application's"

  # 5. system calls per datagram, since the start
  calls=$((A_calls - S_calls))
  nobufs=$((A_nobufs - S_nobufs))
  rcv=$((A_rcv - S_rcv))
  log "$rx: $rcv datagrams, $calls receive system calls, $nobufs out of buffers"
  if [[ $rx == uring ]]; then
    # arming: per empty datagram, per exhaustion, and once per worker
    assert_le "$calls" $((FZ_empty + nobufs + 2)) "$rx: receive system calls (arming only)"
  else
    assert_ge "$calls" $(((rcv + 19) / 20)) "$rx: recvmmsg calls (at most 20 datagrams each)"
  fi
  assert_eq $((A_disp - S_disp)) $((rcv - (A_over - S_over))) \
    "$rx: dispatched == received - oversize"

  # 6. a clean stop
  stop_daemons
}

serve uring
serve socket
[[ -z $NO_URING ]] || skip "the socket path passed; the uring path was not run: $NO_URING"
exit 0
