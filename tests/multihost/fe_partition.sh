#!/usr/bin/env bash
# fe_partition: the active frontend is cut off from the coordinator while a
# standby is promoted; fencing by frontend epoch keeps every mqueue to one
# producer (docs/etcd.md "Fencing"). Hosts are network namespaces on one
# bridge (netns.sh):
#
#   coord  10.77.0.1   lynx-coordinator (--frontend-timeout-ms 1500)
#   h1     10.77.0.11  an agent, 2 CPU accelerators over tcp, --metrics
#   fe1    10.77.0.2   frontend fe1: connects first, so it is active
#   fe2    10.77.0.3   frontend fe2: a standby
#   client 10.77.0.4   sockperf
#
#  1. sockperf through fe1: nothing lost. Each of the agent's regions
#     admitted the epoch fe1 produces into it with (lynx_agent_region_fence;
#     instances given in separate rounds have their own), the newest E1;
#     one producer each.
#  2. fe1's route to the coordinator is blackholed (its data connections to
#     h1 stay up: only the control plane is cut), while a client keeps
#     sending to fe1. The coordinator hears nothing from fe1 for 1.5 s, cuts
#     it off and promotes fe2 with epoch E2 > E1; fe2 connects to h1, and h1
#     cuts fe1's connections (cut counted) and refuses fe1's reconnects with
#     E1 (refused counted). Sampled every 100 ms throughout: the epoch the
#     regions admit only grows (fe1's, then E2); once the takeover is logged,
#     fe1 answers no client any more although clients keep sending to it:
#     nothing is answered by the fenced frontend.
#  3. sockperf through fe2: nothing lost.
#  4. fe1's route comes back: fe1 is a standby now (its epoch is not the
#     newest), the regions keep E2, and fe2 still serves without loss.
#
# usage: fe_partition.sh [BIN_DIR]   (ctest passes build/bin; root)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../integration/lib.sh
source "$HERE/../integration/lib.sh" "$@"
set -e
# shellcheck source-path=SCRIPTDIR source=netns.sh
source "$HERE/netns.sh"

IT_NAME=multihost_fe_partition
mh_begin "$IT_NAME" 160

COORD_PORT=7700
API_PORT=7780
METRICS_PORT=7790
UDP_PORT=9000
FE_TIMEOUT_MS=1500

step() { log "==== $* ($((($(mh_now_ms) - T0) / 1000)) s)"; }

ctl() { mh_exec coord "$BIN/lynxctl" --api "http://127.0.0.1:$API_PORT" --token-file "$TOKEN" "$@"; }
api_get() { mh_exec coord curl -sf --max-time 5 "http://127.0.0.1:$API_PORT$1"; }
scrape_in() { mh_exec "$1" curl -sf --max-time 5 "http://127.0.0.1:$METRICS_PORT/metrics"; }

# agent_metric NAME [LABEL_PART] [sum|max|min]: over h1's samples of NAME.
agent_metric() {
  scrape_in h1 | awk -v n="$1" -v l="${2:-}" -v how="${3:-sum}" '
    $1 ~ /^#/ { next }
    { name = $1; sub(/\{.*/, "", name) }
    name == n && index($1, l) {
      v = $2 + 0; found++
      s += v; if (found == 1 || v > mx) mx = v; if (found == 1 || v < mn) mn = v
    }
    END { if (!found) exit 1
          printf "%.0f\n", how == "max" ? mx : how == "min" ? mn : s }'
}
# fe_metric HOST NAME [LABEL_PART]: sum of a frontend's samples.
fe_metric() {
  scrape_in "$1" | awk -v n="$2" -v l="${3:-}" '
    $1 ~ /^#/ { next }
    { name = $1; sub(/\{.*/, "", name) }
    name == n && index($1, l) { s += $2; found = 1 }
    END { if (!found) exit 1; printf "%.0f\n", s }'
}
# fe_epoch LOG: the last frontend epoch the frontend said it produces with.
fe_epoch() { sed -n 's/.*producing with frontend epoch \([0-9][0-9]*\).*/\1/p' "$1" | tail -n 1; }

# pingpong NAME FE_IP SECONDS: every message answered, none duplicated.
pingpong() { mh_pingpong "$1" client "$2" "$UDP_PORT" "$3"; }

# shellcheck disable=SC2317 # called by netns.sh's cleanup
on_fail() {
  for h in fe1 fe2 h1; do
    scrape_in "$h" 2>/dev/null | grep -v -e '^#' -e ' 0$' >"$MH_DIR/metrics-$h-at-failure.txt"
  done
  api_get /v1/frontends >"$MH_DIR/api-frontends-at-failure.json" 2>/dev/null
}
# shellcheck disable=SC2034 # read by netns.sh's cleanup
MH_ON_FAIL=on_fail

# ---- set-up -------------------------------------------------------------------
step "set-up: 5 hosts on one bridge"
mh_host coord 10.77.0.1
mh_host h1 10.77.0.11
mh_host fe1 10.77.0.2
mh_host fe2 10.77.0.3
mh_host client 10.77.0.4
COORD_IP=$(mh_ip coord)
FE1_IP=$(mh_ip fe1)
FE2_IP=$(mh_ip fe2)
for h in h1 fe1 fe2 client; do mh_wait_reachable "$h" coord; done
mh_wait_reachable client fe1
mh_wait_reachable client fe2
mh_wait_reachable fe1 h1
mh_wait_reachable fe2 h1

# the hosts are not loopback: the coordinator then wants a cluster token
TOKEN=$MH_DIR/token
head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TOKEN"
echo >>"$TOKEN"
chmod 600 "$TOKEN"
mh_spawn coord coordinator "$BIN/lynx-coordinator" --listen "$COORD_IP:$COORD_PORT" \
  --http "127.0.0.1:$API_PORT" --state-dir "$MH_DIR/state" \
  --frontend-timeout-ms "$FE_TIMEOUT_MS" --token-file "$TOKEN"
COORD_PID=$MH_PID COORD_LOG=$MH_LOG
mh_wait_log "$COORD_LOG" "serving control on" 10 1 "$COORD_PID"
mh_wait_until 5 "the coordinator's /readyz" api_get /readyz

mh_spawn h1 agent "$BIN/lynx-agent" --coordinator "$COORD_IP:$COORD_PORT" \
  --node-id "$(mh_node_id h1)" --cpu-accels 2 --transport tcp --token-file "$TOKEN" \
  --metrics "127.0.0.1:$METRICS_PORT"
AGENT_PID=$MH_PID
mh_wait_log "$MH_LOG" "registered with coordinator" 10 1 "$AGENT_PID"

ctl service create --name echo --port "$UDP_PORT" \
  --app sockperf-echo --placement all >"$MH_DIR/service-create.out" 2>&1 ||
  { cat "$MH_DIR/service-create.out"; fail "lynxctl service create failed"; }

start_fe() { # HOST
  mh_spawn "$1" "frontend-$1" "$BIN/lynx-frontend" --coordinator "$COORD_IP:$COORD_PORT" \
    --frontend-id "mh${MH_ID}$1" --bind "$(mh_ip "$1")" \
    --metrics "127.0.0.1:$METRICS_PORT" --token-file "$TOKEN"
}
start_fe fe1
FE1_PID=$MH_PID FE1_LOG=$MH_LOG
mh_wait_log "$FE1_LOG" "serving service echo" 10 1 "$FE1_PID"
start_fe fe2
FE2_PID=$MH_PID FE2_LOG=$MH_LOG
mh_wait_log "$FE2_LOG" "applied (standby)" 10 1 "$FE2_PID"

# ---- 1. fe1 serves --------------------------------------------------------------
step "1. traffic through fe1"
pingpong fe1 "$FE1_IP" 2
E1=$(fe_epoch "$FE1_LOG")
is_uint "$E1" || fail "fe1 logged no frontend epoch"
assert_gt "$E1" 0 "fe1's frontend epoch"
# the epochs fe1 produces with, one per instance (the API's mqueues)
EPOCHS1=$(api_get /v1/mqueues | jq -r --arg f "mh${MH_ID}fe1" \
  '[.items[] | select(.frontend == $f) | .epoch] | unique | map(tostring) | join(" ")')
[[ -n $EPOCHS1 ]] || fail "the API names no mqueue fe1 produces into"
assert_eq "$(agent_metric lynx_agent_region_fence '' min)" "${EPOCHS1%% *}" "h1: the lowest epoch a region admitted (fe1's oldest: $EPOCHS1)"
assert_eq "$(agent_metric lynx_agent_region_fence '' max)" "$E1" "h1: the newest epoch a region admitted (fe1's newest)"
assert_ge "$(agent_metric lynx_agent_region_producers '' min)" 1 "h1: fe1's connections on each region"

# ---- 2. fe1 is cut from the coordinator -----------------------------------------
step "2. fe1's route to the coordinator blackholed; a client keeps sending to fe1"
SAMPLES=$MH_DIR/fences.txt
(
  while :; do
    lo=$(agent_metric lynx_agent_region_fence '' min 2>/dev/null) || lo=''
    hi=$(agent_metric lynx_agent_region_fence '' max 2>/dev/null) || hi=''
    [[ -n $lo && -n $hi ]] && echo "$lo $hi"
    sleep 0.1
  done
) >"$SAMPLES" &
SAMPLER=$!
mh_exec client timeout -k 3 $((30 * MH_TS)) sockperf under-load -i "$FE1_IP" -p "$UDP_PORT" \
  -m 64 -t 20 --mps 500 >"$MH_DIR/sockperf-fe1-cut.out" 2>&1 </dev/null &
CUT_CLIENT=$!
sleep 1
t_cut=$(mh_now_ms)
mh_exec fe1 ip route add blackhole "$COORD_IP/32"
mh_wait_log "$COORD_LOG" "silent for" 10 1 "$COORD_PID"
log "ok: the coordinator cut fe1 off $(($(mh_now_ms) - t_cut)) ms after the blackhole (--frontend-timeout-ms $FE_TIMEOUT_MS)"
mh_wait_log "$FE2_LOG" "serving service echo" 10 1 "$FE2_PID"
E2=$(fe_epoch "$FE2_LOG")
is_uint "$E2" || fail "fe2 logged no frontend epoch"
assert_gt "$E2" "$E1" "fe2's frontend epoch, beyond fe1's"
regions_fenced() { [[ $(agent_metric lynx_agent_region_fence '' min) == "$E2" ]]; }
mh_wait_until 10 "every region of h1 admitting fe2's epoch $E2" regions_fenced
log "ok: h1's regions admit epoch $E2, $(($(mh_now_ms) - t_cut)) ms after the blackhole"
cut_counted() { (($(agent_metric lynx_agent_fenced_connections_total 'why="cut"') >= 1)); }
mh_wait_until 5 "h1 counting fe1's connections cut" cut_counted
refused_counted() { (($(agent_metric lynx_agent_fenced_connections_total 'why="refused"') >= 1)); }
mh_wait_until 10 "h1 refusing fe1's reconnects with epoch $E1" refused_counted
log "ok: h1 cut $(agent_metric lynx_agent_fenced_connections_total 'why="cut"') and refused $(agent_metric lynx_agent_fenced_connections_total 'why="refused"') connections of fe1"
grep -q "fenced" "$FE1_LOG" || fail "fe1 logged nothing about being fenced"
# fe1 keeps taking requests from its client but answers none of them
resp1=$(fe_metric fe1 lynx_frontend_responded_total) || fail "cannot scrape fe1"
rcv1=$(fe_metric fe1 lynx_frontend_received_total)
sleep 2
resp2=$(fe_metric fe1 lynx_frontend_responded_total)
rcv2=$(fe_metric fe1 lynx_frontend_received_total)
assert_gt "$rcv2" "$rcv1" "requests fe1 received while fenced"
assert_eq "$resp2" "$resp1" "answers fe1 sent while fenced"

# ---- 3. fe2 serves --------------------------------------------------------------
step "3. traffic through fe2"
pingpong fe2 "$FE2_IP" 3
lost=$(fe_metric fe2 lynx_frontend_dropped_total 'reason="lost"') || lost=0
assert_eq "$lost" 0 "fe2: requests lost"
wait "$CUT_CLIENT" || true

# ---- 4. fe1 comes back ----------------------------------------------------------
step "4. fe1's route restored: it becomes a standby"
mh_exec fe1 ip route del blackhole "$COORD_IP/32"
mh_wait_log "$FE1_LOG" "applied (standby)" 15 1 "$FE1_PID"
pingpong fe2-after "$FE2_IP" 2
assert_eq "$(agent_metric lynx_agent_region_fence '' min)" "$E2" "h1: the epoch every region admits after fe1 is back"
kill "$SAMPLER" 2>/dev/null || true
wait "$SAMPLER" 2>/dev/null || true
n=$(grep -c . "$SAMPLES") || n=0
assert_gt "$n" 20 "samples of the epochs h1's regions admit"
bad=$(awk -v e1="$EPOCHS1" -v e2="$E2" '
  BEGIN { n = split(e1, a, " "); for (i = 1; i <= n; i++) ok[a[i]] = 1; ok[e2] = 1 }
  { if (!($1 in ok) || !($2 in ok) || $1 < last) bad++; last = $1 }
  END { print bad + 0 }' "$SAMPLES")
assert_eq "$bad" 0 "samples where a region admitted an epoch other than fe1's ($EPOCHS1) or $E2, or went back"
log "ok: $n samples: the regions admitted fe1's epochs ($EPOCHS1), then $E2, never back"
it_done
