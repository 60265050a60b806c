#!/usr/bin/env bash
# lynxctl_top: `lynxctl top` against a coordinator and lynx-simnodes (3
# nodes x 4 accelerators; --rate 100: accelerator k takes 100 x (1 + k % 7)
# requests/s; accelerator 0 of the first node stalled, of the second
# failed). Text frames (-b -n 3 -d 1): three, each with every accelerator
# once; rows sorted by RATE descending (ties by id); "-" on the first
# frame; on the others the top row an accelerator of the highest k % 7 at
# its rate +-30% and the header's total at the sum +-30% (on the last,
# every accelerator at its own rate +-30%); each
# accelerator's p99s those the simulator sends; the stalled and failed
# ones' HEALTH; the header's counts. -s id sorts by id; without -b and
# without a terminal it writes text frames too; bad -s and -d are usage
# errors (2); a closed port is exit 3 with the message. On a terminal
# (script(1)): q quits at once, and an unreachable coordinator is said on
# the screen while it keeps trying. Then 520 more nodes: /v1/nodes is read
# in pages of 500, and every accelerator is listed once, in id order.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init lynxctl_top
it_require_coord
it_require awk timeout script # script(1): util-linux (bsdutils)
[[ -x $LYNX_BIN_DIR/lynx-simnodes ]] ||
  fail "$LYNX_BIN_DIR/lynx-simnodes is missing: build first (make)"
pick_ports COORD_PORT API_PORT DEAD_PORT
IT_SOFT=1

RATE=100 NODES=3 ACCELS=4
P=${IT_NODE}s # the simulated nodes' ids: P00000 .. P00002
# heartbeats every 200 ms: several between two frames, so that the
# second frame has rates whatever the heartbeats' phase (one that saw no
# heartbeat since the first would show the first's rates: none)
start_coordinator --lease-ms 600
spawn_daemon lynx-simnodes simnodes "" --coordinator "127.0.0.1:$COORD_PORT" \
  --nodes $NODES --accels $ACCELS --prefix "$P" --labels "" --rate $RATE \
  --stalled 1 --failed 1
SIM_PID=$SPAWN_PID SIM_LOG=$SPAWN_LOG
wait_log "$SIM_LOG" "simnodes: registered" 10 1 "$SIM_PID"
# their health reached the coordinator (the first heartbeats)
end=$(($(now_ms) + 5000))
until [[ $(api_json /v1/accelerators \
  '[.items[] | select(.health.dispatchable | not)] | length') == 2 ]]; do
  (($(now_ms) < end)) || fail "the stalled and failed accelerators are not out of dispatch after 5 s"
  sleep 0.1
done

ctl_top() { "$LYNX_BIN_DIR/lynxctl" --api "$(api_url)" top "$@"; }

# k of an id P0000N/A
k_of() {
  local n=${1#"$P"}
  n=${n%/*}
  echo $((10#$n * ACCELS + ${1##*/}))
}
# what the simulator sends for accelerator k (tests/tools/lynx_simnodes.c)
healthy() { (($1 != 0 && $1 != ACCELS)); } # accelerator 0 of nodes 0 and 1
want_rate() { healthy "$1" && echo $((RATE * (1 + $1 % 7))) || echo 0; }
want_health() {
  case $1 in
  0) echo "stalled 1 mq" ;; # and the stall's length
  "$ACCELS") echo "failed: simulated failure" ;;
  *) echo ok ;;
  esac
}
want_qp99() { healthy "$1" && echo "$((5 + $1 % 11)).0us" || echo -; }
want_sp99() { healthy "$1" && echo "$((20 + $1 % 50)).0us" || echo -; }

ids=()
for ((n = 0; n < NODES; n++)); do
  for ((a = 0; a < ACCELS; a++)); do ids+=("$(printf '%s%05d/%d' "$P" $n $a)"); done
done
want_ids=$(printf '%s\n' "${ids[@]}" | sort)
best=-1 # the highest k % 7 of a healthy accelerator
for id in "${ids[@]}"; do
  k=$(k_of "$id")
  healthy "$k" && ((k % 7 > best)) && best=$((k % 7))
done
want_total=0
for id in "${ids[@]}"; do want_total=$((want_total + $(want_rate "$(k_of "$id")"))); done

# frames FILE DIR: splits text frames into DIR/frame.N (N from 1), each
# frame's rows into DIR/rows.N: "ID<TAB>STATE<TAB>RATE<TAB>OUTSTANDING<TAB>
# QUEUE-P99<TAB>SERVICE-P99<TAB>HEALTH", cut at the column names' positions.
# Prints the number of frames.
frames() {
  mkdir -p "$2"
  awk -v dir="$2" '
    BEGIN { RS = ""; FS = "\n" }
    {
      f = dir "/frame." NR; r = dir "/rows." NR
      printf "" > r
      for (i = 1; i <= NF; i++) {
        print $i > f
        if ($i ~ /^ID /) {
          hdr = $i
          n = split("ID STATE KIND MODEL RATE OUTSTANDING QUEUE-P99 SERVICE-P99 HEALTH", names, " ")
          for (c = 1; c <= n; c++) at[c] = index(hdr, names[c])
          continue
        }
        if (!hdr) continue
        line = ""
        for (c = 1; c <= n; c++) {
          if (c == 3 || c == 4) continue # KIND, MODEL
          cell = c < n ? substr($i, at[c], at[c + 1] - at[c]) : substr($i, at[c])
          sub(/^ +/, "", cell); sub(/ +$/, "", cell)
          line = line (line == "" ? "" : "\t") cell
        }
        print line > r
      }
      close(f); close(r); hdr = ""
    }
    END { print NR }' "$1"
}
# rate TEXT: requests/s as an integer ("1.2k" 1200; "-" stays)
num() {
  awk -v s="$1" 'BEGIN {
    if (s == "-") { print "-"; exit }
    m = 1
    if (s ~ /k$/) m = 1000
    if (s ~ /M$/) m = 1000000
    sub(/[kM]$/, "", s)
    printf "%d\n", s * m + 0.5 }'
}
# within ACTUAL WANT PERCENT
within() { (($1 * 100 >= $2 * (100 - $3) && $1 * 100 <= $2 * (100 + $3))); }

log "== lynxctl top -b -n 3 -d 1"
t0=$(now_ms)
timeout -k 2 "$(ts_s 30)" "$LYNX_BIN_DIR/lynxctl" --api "$(api_url)" top -b -n 3 -d 1 \
  >"$IT_DIR/top.txt" 2>"$IT_DIR/top.err"
rc=$?
took=$(($(now_ms) - t0))
cat "$IT_DIR/top.txt"
assert_eq "$rc" 0 "lynxctl top -b -n 3 -d 1 exit status"
assert_ge "$took" 2000 "ms three frames a second apart took"
[[ -s $IT_DIR/top.err ]] && it_check_failed "lynxctl top wrote on stderr: $(head -c 300 "$IT_DIR/top.err")"
grep -q $'\e' "$IT_DIR/top.txt" && it_check_failed "text frames hold an escape character"
nf=$(frames "$IT_DIR/top.txt" "$IT_DIR/f")
assert_eq "$nf" 3 "frames written"
for ((i = 1; i <= nf; i++)); do
  F=$IT_DIR/f/frame.$i R=$IT_DIR/f/rows.$i
  got_ids=$(cut -f1 "$R" | sort)
  [[ $got_ids == "$want_ids" ]] ||
    it_check_failed "frame $i: accelerators $(echo $got_ids), want $(echo $want_ids)"
  assert_log "$F" "nodes: $NODES total, $NODES ready, 0 draining, 0 drained, 0 down" "frame $i: nodes by state"
  assert_log "$F" "accelerators: $((NODES * ACCELS)) total, $((NODES * ACCELS - 2)) dispatchable, 1 stalled, 1 lost or failed" \
    "frame $i: accelerators by health"
  assert_log "$F" "frontends: 0 connected, 0 active" "frame $i: frontends"
  assert_log "$F" "sort: rate" "frame $i: sorted by rate"
  while IFS=$'\t' read -r id st rate out qp sp health; do
    k=$(k_of "$id")
    [[ $st == ready ]] || it_check_failed "frame $i: $id STATE '$st', want ready"
    [[ $out == 0 ]] || it_check_failed "frame $i: $id OUTSTANDING '$out', want 0 (no mqueue)"
    [[ $qp == "$(want_qp99 "$k")" && $sp == "$(want_sp99 "$k")" ]] ||
      it_check_failed "frame $i: $id p99s '$qp' '$sp', want '$(want_qp99 "$k")' '$(want_sp99 "$k")'"
    [[ $health == "$(want_health "$k")"* ]] ||
      it_check_failed "frame $i: $id HEALTH '$health', want '$(want_health "$k")'"
    if ((i == 1)); then
      [[ $rate == - ]] || it_check_failed "frame 1: $id RATE '$rate', want - (no frame before)"
    elif ! healthy "$k"; then
      [[ $rate == 0.0 ]] || it_check_failed "frame $i: $id RATE '$rate', want 0.0 (it takes nothing)"
    fi
  done <"$R"
  ((i == 1)) && { assert_log "$F" "requests/s: -" "frame 1: no total rate yet"; continue; }
  # sorted: RATE non-increasing; equal zeros by id
  prev='' prev_id=''
  while IFS=$'\t' read -r id st rate _; do
    r=$(num "$rate")
    if [[ $r == - ]]; then
      it_check_failed "frame $i: $id RATE '-' on a frame after the first"
    elif [[ -n $prev ]] && ((r > prev)); then
      it_check_failed "frame $i: $id RATE $rate above the row before it ($prev_id, $prev/s): not sorted"
    elif [[ -n $prev ]] && ((r == 0 && prev == 0)) && [[ ! $prev_id < $id ]]; then
      it_check_failed "frame $i: $prev_id before $id at 0/s: ties not by id"
    fi
    prev=$r prev_id=$id
  done <"$R"
  IFS=$'\t' read -r id st rate _ <"$R"
  k=$(k_of "$id")
  assert_eq $((k % 7)) "$best" "frame $i: k % 7 of the top row ($id)"
  r=$(num "$rate")
  within "$r" "$(want_rate "$k")" 30 &&
    log "ok: frame $i: top row $id at $rate/s (want $(want_rate "$k") +-30%)" ||
    it_check_failed "frame $i: top row $id at $rate/s, want $(want_rate "$k") +-30%"
  if ((i == nf)); then # every accelerator at its own rate
    bad=0
    while IFS=$'\t' read -r id st rate _; do
      k=$(k_of "$id")
      healthy "$k" || continue
      within "$(num "$rate")" "$(want_rate "$k")" 30 ||
        { it_check_failed "frame $i: $id at $rate/s, want $(want_rate "$k") +-30%"; bad=1; }
    done <"$R"
    ((bad)) || log "ok: frame $i: every healthy accelerator at its rate +-30%"
  fi
  total=$(num "$(sed -n 's/.*requests\/s: \([^ ]*\).*/\1/p' "$F")")
  within "$total" "$want_total" 30 &&
    log "ok: frame $i: total $total/s (want $want_total +-30%)" ||
    it_check_failed "frame $i: header's total '$total'/s, want $want_total +-30%"
done

log "== -s id; no -b and no terminal: text frames"
ctl_top -n 1 -s id >"$IT_DIR/id.txt" 2>&1
assert_eq "$?" 0 "lynxctl top -n 1 -s id exit status (stdout a file)"
frames "$IT_DIR/id.txt" "$IT_DIR/id" >/dev/null
assert_log "$IT_DIR/id/frame.1" "sort: id" "-s id named in the header"
got=$(cut -f1 "$IT_DIR/id/rows.1")
[[ $got == "$(printf '%s\n' "${ids[@]}")" ]] &&
  log "ok: -s id: rows in id order" ||
  it_check_failed "-s id: rows $(echo $got), want $(echo "${ids[@]}")"

log "== usage errors and a closed port"
ctl_top -b -n 1 -s cpu >"$IT_DIR/u.txt" 2>&1
assert_eq "$?" 2 "top -s cpu exit status"
assert_log "$IT_DIR/u.txt" "top -s: expected rate, outstanding, p99 or id, got 'cpu'" "top -s cpu message"
ctl_top -b -n 1 -d 0 >"$IT_DIR/u.txt" 2>&1
assert_eq "$?" 2 "top -d 0 exit status"
assert_log "$IT_DIR/u.txt" "top -d: expected seconds" "top -d 0 message"
timeout -k 2 "$(ts_s 20)" "$LYNX_BIN_DIR/lynxctl" --api "127.0.0.1:$DEAD_PORT" top -b -n 3 \
  >"$IT_DIR/dead.out" 2>"$IT_DIR/dead.err"
assert_eq "$?" 3 "top -b against a closed port: exit status (3: unreachable, as every lynxctl command)"
assert_log "$IT_DIR/dead.err" "lynxctl: cannot reach the coordinator at http://127.0.0.1:$DEAD_PORT" \
  "top -b against a closed port: the message"
[[ -s $IT_DIR/dead.out ]] && it_check_failed "top -b against a closed port wrote a frame: $(head -c 200 "$IT_DIR/dead.out")"

log "== on a terminal"
# q quits at once: -d 30 would hold the next frame for 30 s
t0=$(now_ms)
(sleep 2; printf q) | TERM=xterm timeout -k 2 "$(ts_s 20)" script -qfec \
  "stty rows 24 cols 132; '$LYNX_BIN_DIR/lynxctl' --api '$(api_url)' top -d 30" \
  /dev/null >"$IT_DIR/screen.raw" 2>&1
rc=$?
took=$(($(now_ms) - t0))
assert_eq "$rc" 0 "top on a terminal, q pressed: exit status"
assert_lt "$took" "$(ts_ms 10000)" "ms until top on a terminal quit on q"
assert_log "$IT_DIR/screen.raw" "q quit  r rate" "the screen's key line"
assert_log "$IT_DIR/screen.raw" "accelerators: $((NODES * ACCELS)) total" "the screen's header"
# no coordinator: said on the screen, tried again, no exit
TERM=xterm timeout -k 2 "$(ts_s 20)" script -qfec \
  "stty rows 24 cols 132; '$LYNX_BIN_DIR/lynxctl' --api 127.0.0.1:$DEAD_PORT top -n 3 -d 0.2" \
  /dev/null >"$IT_DIR/screen-dead.raw" 2>&1 </dev/null
assert_eq "$?" 0 "top on a terminal without a coordinator, -n 3: exit status"
assert_log "$IT_DIR/screen-dead.raw" "cannot reach the coordinator at http://127.0.0.1:$DEAD_PORT" \
  "the screen says the coordinator cannot be reached"
assert_log "$IT_DIR/screen-dead.raw" "trying again every 0.2 s" "the screen says it keeps trying"

log "== more nodes than a page (500): every accelerator once"
MANY=520
spawn_daemon lynx-simnodes simnodes "" --coordinator "127.0.0.1:$COORD_PORT" \
  --nodes $MANY --accels 1 --prefix "${IT_NODE}m" --labels ""
MANY_PID=$SPAWN_PID
wait_log "$SPAWN_LOG" "simnodes: registered" 30 1 "$MANY_PID"
timeout -k 2 "$(ts_s 30)" "$LYNX_BIN_DIR/lynxctl" --api "$(api_url)" top -b -n 1 -s id \
  >"$IT_DIR/many.txt" 2>&1
assert_eq "$?" 0 "top -b -n 1 -s id over $((NODES + MANY)) nodes: exit status"
frames "$IT_DIR/many.txt" "$IT_DIR/many" >/dev/null
all=$NODES*$ACCELS+$MANY
assert_log "$IT_DIR/many/frame.1" "nodes: $((NODES + MANY)) total" "$((NODES + MANY)) nodes counted"
assert_log "$IT_DIR/many/frame.1" "accelerators: $((all)) total" "$((all)) accelerators counted"
assert_eq "$(cut -f1 "$IT_DIR/many/rows.1" | sort -u | wc -l)" $((all)) "distinct rows"
# id order: node ids as text, then the index as a number
cut -f1 "$IT_DIR/many/rows.1" >"$IT_DIR/many/ids"
LC_ALL=C sort -t/ -k1,1 -k2,2n "$IT_DIR/many/ids" | cmp -s - "$IT_DIR/many/ids" &&
  log "ok: rows in id order" || it_check_failed "rows over several pages not in id order"

stop "$MANY_PID" 10
assert_eq "$WAIT_RC" 0 "lynx-simnodes ($MANY nodes) exit status"
stop "$SIM_PID" 10
assert_eq "$WAIT_RC" 0 "lynx-simnodes exit status"
it_done
