#!/usr/bin/env bash
# udp_fuzz: 10000 reproducible random datagrams (0..65507 bytes, about half
# of them fitting a 2048-byte slot, the rest through the rings' large-message
# areas, most with a sockperf-like header, part of those pong requests)
# through lynx-frontend to sockperf-echo, paced so that no ring or socket
# buffer overflows. lynx-udp-fuzz checks every reply byte for byte; this
# script checks that the frontend's counters account for every datagram:
#
#   received_total            == sent
#   dropped{oversize}         == datagrams longer than the cap (none by
#                                default; FUZZ_MSG_MAX=2032: longer than a
#                                slot)
#   responded_total           == expected replies == replies received
#   dropped{ring_full}        == 0 (paced)
#   dropped{flow_full}        == 0 (paced)
#   dispatched_total          == received - oversize - ring_full - flow_full
#   dropped{app_dropped}      == dispatched - responded
#   every other drop reason   == 0
#
# Then (with large messages) one flow of 8 KiB, 60 KiB and 60,000-byte
# pong requests: every reply byte for byte and in send order. And sockperf
# still gets every answer afterwards. All checks run even
# when one fails (soft assertions), so one run shows every broken invariant.
#
# LYNX_FUZZ_SEED and LYNX_FUZZ_COUNT override the seed (1) and count (10000).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init udp_fuzz
it_require sockperf curl timeout
[[ -x $LYNX_UDP_FUZZ ]] || fail "$LYNX_UDP_FUZZ is missing: build first (make)"
pick_ports AGENT_PORT UDP_PORT METRICS_PORT
# The accelerators take messages up to --msg-max: by default (1 MiB) any
# datagram, through the rings' large-message areas (docs/mqueue.md);
# FUZZ_MSG_MAX=2032 (a 2048-byte slot's payload) runs the same mix with no
# large area, where every longer datagram must be dropped as oversize.
MSG_MAX=${FUZZ_MSG_MAX:-1048576}
CAP=$((MSG_MAX < 65507 ? MSG_MAX : 65507)) SLOT=2032

start_agent --msg-max "$MSG_MAX"
start_frontend

out=$IT_DIR/fuzz.out
seed=${LYNX_FUZZ_SEED:-1} count=${LYNX_FUZZ_COUNT:-10000}
log "lynx-udp-fuzz --port $UDP_PORT --count $count --seed $seed --cap $CAP" \
  "--slot $SLOT"
timeout -k 2 "$(ts_s 90)" "$LYNX_UDP_FUZZ" --port "$UDP_PORT" --count "$count" \
  --seed "$seed" --cap "$CAP" --slot "$SLOT" >"$out" 2>&1 </dev/null
rc=$?
cat "$out"
fuzz_summary "$out"

snap=$IT_DIR/metrics-after-fuzz.txt
scrape_stable "$snap"
export METRICS_FROM=$snap
for k in received dispatched responded; do
  v=$(metric "lynx_frontend_${k}_total") || fail "no lynx_frontend_${k}_total"
  printf -v "M_$k" '%s' "$v"
done
for reason in oversize ring_full flow_full no_mqueue tag_full shutdown \
  stale_tag tx_oversize tx_bad_seq bad_index app_dropped expired lost \
  in_doubt write_error send_error; do
  v=$(metric lynx_frontend_dropped_total "reason=\"$reason\"") ||
    fail "no lynx_frontend_dropped_total{reason=\"$reason\"}"
  printf -v "D_$reason" '%s' "$v"
done
unset METRICS_FROM
log "frontend: received $M_received dispatched $M_dispatched responded $M_responded;" \
  "dropped: oversize $D_oversize ring_full $D_ring_full flow_full $D_flow_full" \
  "app_dropped $D_app_dropped" \
  "no_mqueue $D_no_mqueue tag_full $D_tag_full expired $D_expired lost $D_lost"

IT_SOFT=1
assert_eq "$rc" 0 "lynx-udp-fuzz exit status (every reply byte-exact, none unexpected or duplicated)"
assert_eq "$FZ_sent" "$count" "datagrams sent by lynx-udp-fuzz"
if ((CAP < 65507)); then
  assert_gt "$FZ_oversize" 0 "oversize datagrams in the mix"
else
  assert_eq "$FZ_oversize" 0 "no datagram over the cap"
  assert_gt "$FZ_large" 0 "datagrams longer than a slot in the mix"
fi
assert_gt "$FZ_expected_replies" 0 "pong requests in the mix"
assert_eq "$M_received" "$FZ_sent" "received_total == sent (incl. $FZ_empty empty datagrams)"
assert_eq "$D_oversize" "$FZ_oversize" "dropped{oversize} == datagrams > $CAP bytes"
assert_eq "$FZ_received_replies" "$FZ_expected_replies" "replies received by lynx-udp-fuzz == expected"
assert_eq "$M_responded" "$FZ_expected_replies" "responded_total == expected replies"
assert_eq "$M_responded" "$FZ_received_replies" "responded_total == replies received"
assert_eq "$D_ring_full" 0 "dropped{ring_full} (the tool paces itself)"
assert_eq "$D_flow_full" 0 "dropped{flow_full} (the tool paces itself)"
assert_eq "$M_dispatched" $((M_received - D_oversize - D_ring_full - D_flow_full)) \
  "dispatched_total == received - oversize - ring_full - flow_full"
assert_eq "$D_app_dropped" $((M_dispatched - M_responded)) \
  "dropped{app_dropped} == dispatched - responded"
for reason in stale_tag tx_oversize lost in_doubt write_error no_mqueue \
  tag_full shutdown tx_bad_seq bad_index expired send_error; do
  v=D_$reason
  assert_eq "${!v}" 0 "dropped{reason=\"$reason\"}"
done
IT_SOFT=0

# Large answers keep their flow's order: one client (one flow), 8 KiB and
# 60 KiB pong requests (and a 60,000-byte one through 2 KiB slots) in
# turn, every reply byte for byte and in send order, none dropped.
if ((CAP >= 61440)); then
  out=$IT_DIR/ordered.out
  timeout -k 2 "$(ts_s 60)" "$LYNX_UDP_FUZZ" --port "$UDP_PORT" --count 2000 --seed 3 \
    --cap "$CAP" --slot "$SLOT" --sizes 8192,61440,60000,64 --ordered \
    >"$out" 2>&1 </dev/null
  rc=$?
  cat "$out"
  fuzz_summary "$out"
  IT_SOFT=1
  assert_eq "$rc" 0 "ordered large answers: exit status (byte-exact, in order)"
  assert_eq "$FZ_out_of_order" 0 "replies out of send order"
  assert_eq "$FZ_received_replies" 2000 "replies to 2,000 large pong requests"
  v=$(metric lynx_frontend_dropped_total 'reason="oversize"')
  assert_eq "$v" "$D_oversize" "no datagram under the cap dropped as oversize"
  IT_SOFT=0
fi

# the frontend is none the worse for it
out=$IT_DIR/pingpong-after-fuzz.out
run_sockperf "$out" ping-pong -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 2
IT_SOFT=1
check_sockperf "$out"
IT_SOFT=0

stop_daemons
it_done
