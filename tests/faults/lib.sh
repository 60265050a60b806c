# shellcheck shell=bash
# shellcheck disable=SC2154 # FLB_* and FLE_* are set by fl_counts (printf -v)
# shellcheck disable=SC2034 # FL_DROPPED, FL_WHY, SP_*: for the scripts
# shellcheck disable=SC2317 # helpers called through wait_until
# lib.sh - the fault suite's harness (tests/faults/, docs/faults.md): a
# cluster on network namespaces (tests/multihost/netns.sh), sockperf load
# through it, and the counts every fault is judged by. Source it after
# integration/lib.sh and netns.sh:
#
#   fl_cluster NAGENTS NFRONTENDS   # coord, h1..hN, fe1..feM, client;
#                                   # coordinator, agents, frontends, and
#                                   # the sockperf-echo service "echo"
#   fl_load_start NAME FE SECONDS   # sockperf under-load from client to
#                                   # frontend host FE, in the background
#   fl_load_wait                    # its end: SP_* (lib.sh sockperf_stats)
#   fl_window_begin FE / fl_window_end FE   # FE's counters around a fault
#   fl_check_window FE WHAT NODE REASONS... # judged (below)
#   fl_check_once HOST FE...        # HOST's accelerators ran exactly what
#                                   # the frontends gave them
#
# A script starts with `source .../lib.sh "$@"` (which sources
# integration/lib.sh and multihost/netns.sh) and mh_begin.
#
# What a fault is judged by (the issue's three counts):
#  - nothing lost but what was in flight on the failed part: the frontend
#    answered or counted every request it received (received = responded +
#    dropped), its drops have only the reasons the fault explains (an agent
#    failure: lost or in_doubt), all on the failed node's mqueues;
#  - nothing executed twice: the accelerators of every node that stayed up
#    ran exactly as many requests as the frontends dispatched to them
#    (agent metrics against frontend metrics);
#  - nothing answered by a fenced incarnation: sockperf saw no duplicate,
#    and a fenced frontend or agent answers nothing after it resumes (the
#    scripts check that where a fault fences).

# (sourced with the script's arguments: BIN_DIR)
FL_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../integration/lib.sh
source "$FL_HERE/../integration/lib.sh" "$@"
set -e
# shellcheck source-path=SCRIPTDIR source=../multihost/netns.sh
source "$FL_HERE/../multihost/netns.sh"

FL_COORD_PORT=7700
FL_API_PORT=7780
FL_METRICS_PORT=7790
FL_UDP_PORT=9000
FL_LEASE_MS=${FL_LEASE_MS:-1000}
FL_FE_TIMEOUT_MS=${FL_FE_TIMEOUT_MS:-1500}
# requests outlive a lease: one to a node that stops is counted lost when
# the node is declared down, never expired first
FL_REQ_TIMEOUT_MS=${FL_REQ_TIMEOUT_MS:-10000}
FL_RATE=${FL_RATE:-1000}
declare -A FL_PID=() FL_LOG=() FL_NODE=()
FL_AGENT_ARGS=()

step() { log "==== $* ($((($(mh_now_ms) - T0) / 1000)) s)"; }

ctl() { mh_exec coord "$BIN/lynxctl" --api "http://127.0.0.1:$FL_API_PORT" --token-file "$FL_TOKEN" "$@"; }
api_get() { mh_exec coord curl -sf --max-time 5 "http://127.0.0.1:$FL_API_PORT$1"; }
scrape_in() { mh_exec "$1" curl -sf --max-time 5 "http://127.0.0.1:$FL_METRICS_PORT/metrics"; }

# fl_metric HOST NAME [LABEL_PART]: the sum of HOST's samples of NAME whose
# labels contain LABEL_PART; 0 when there is none (a counter not yet
# exported); fails when HOST cannot be scraped.
fl_metric() {
  local text
  text=$(scrape_in "$1") || fail "cannot scrape the metrics of $1"
  fl_sum "$2" "${3:-}" <<<"$text"
}
# fl_sum NAME [LABEL_PART]: the same over Prometheus text on stdin.
fl_sum() {
  awk -v n="$1" -v l="${2:-}" '
    $1 ~ /^#/ { next }
    { name = $1; sub(/\{.*/, "", name) }
    name == n && index($1, l) { s += $2 }
    END { printf "%.0f\n", s }'
}

# On failure (netns.sh's cleanup): every daemon host's metrics and the
# API's frontends, next to the logs.
fl_on_fail() {
  local h
  for h in "${MH_HOSTS[@]}"; do
    [[ $h == client || $h == coord ]] && continue
    scrape_in "$h" 2>/dev/null | grep -v -e '^#' -e ' 0$' >"$MH_DIR/metrics-$h-at-failure.txt"
  done
  api_get /v1/frontends >"$MH_DIR/api-frontends-at-failure.json" 2>/dev/null
}
MH_ON_FAIL=fl_on_fail

# ---- the cluster --------------------------------------------------------------

# fl_agent HOST: starts HOST's agent (2 CPU accelerators over tcp).
fl_agent() {
  mh_spawn "$1" "agent-$1" "$BIN/lynx-agent" --coordinator "$FL_COORD_IP:$FL_COORD_PORT" \
    --node-id "${FL_NODE[$1]}" --cpu-accels 2 --transport tcp --token-file "$FL_TOKEN" \
    --metrics "127.0.0.1:$FL_METRICS_PORT" "${FL_AGENT_ARGS[@]}"
  FL_PID[$1]=$MH_PID FL_LOG[$1]=$MH_LOG
}

# fl_frontend HOST: starts HOST's frontend.
fl_frontend() {
  mh_spawn "$1" "frontend-$1" "$BIN/lynx-frontend" --coordinator "$FL_COORD_IP:$FL_COORD_PORT" \
    --frontend-id "mh${MH_ID}$1" --bind "$(mh_ip "$1")" --request-timeout-ms "$FL_REQ_TIMEOUT_MS" \
    --metrics "127.0.0.1:$FL_METRICS_PORT" --token-file "$FL_TOKEN"
  FL_PID[$1]=$MH_PID FL_LOG[$1]=$MH_LOG
}

# fl_coordinator [ARG...]: starts the coordinator (state in $MH_DIR/state
# unless ARGs say otherwise; FL_COORD_WRAP: a command it runs under) and
# waits until it serves.
FL_COORD_WRAP=()
fl_coordinator() {
  mh_spawn coord coordinator "${FL_COORD_WRAP[@]}" "$BIN/lynx-coordinator" --listen "$FL_COORD_IP:$FL_COORD_PORT" \
    --http "127.0.0.1:$FL_API_PORT" --lease-ms "$FL_LEASE_MS" \
    --frontend-timeout-ms "$FL_FE_TIMEOUT_MS" --token-file "$FL_TOKEN" "$@"
  FL_PID[coord]=$MH_PID FL_LOG[coord]=$MH_LOG
  mh_wait_log "$MH_LOG" "serving control on" 10 1 "$MH_PID"
  mh_wait_until 10 "the coordinator's /readyz" api_get /readyz
}

# fl_cluster NAGENTS NFRONTENDS [COORDINATOR ARG...]: the hosts, the
# daemons and the service; every agent ready, fe1 serving.
fl_cluster() {
  local na=$1 nf=$2 i h
  shift 2
  mh_host coord 10.77.0.1
  for ((i = 1; i <= na; i++)); do mh_host "h$i" "10.77.0.$((10 + i))"; done
  for ((i = 1; i <= nf; i++)); do mh_host "fe$i" "10.77.0.$((1 + i))"; done
  mh_host client 10.77.0.9
  FL_COORD_IP=$(mh_ip coord)
  for h in "${MH_HOSTS[@]}"; do
    [[ $h == coord ]] || mh_wait_reachable "$h" coord
  done
  FL_TOKEN=$MH_DIR/token
  head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$FL_TOKEN"
  echo >>"$FL_TOKEN"
  chmod 600 "$FL_TOKEN"
  fl_coordinator --state-dir "${FL_STATE_DIR:-$MH_DIR/state}" "$@"
  for ((i = 1; i <= na; i++)); do
    FL_NODE[h$i]=$(mh_node_id "h$i")
    fl_agent "h$i"
    mh_wait_log "$MH_LOG" "registered with coordinator" 10 1 "$MH_PID"
  done
  ctl service create --name echo --port "$FL_UDP_PORT" \
    --app sockperf-echo --placement all >"$MH_DIR/service-create.out" 2>&1 ||
    { cat "$MH_DIR/service-create.out"; fail "lynxctl service create failed"; }
  for ((i = 1; i <= nf; i++)); do
    fl_frontend "fe$i"
    if ((i == 1)); then
      mh_wait_log "${FL_LOG[fe1]}" "serving service echo" 15 1 "${FL_PID[fe1]}"
    else
      mh_wait_log "${FL_LOG[fe$i]}" "applied (standby)" 15 1 "${FL_PID[fe$i]}"
    fi
  done
  fl_wait_dispatch fe1 $((na * 2))
}

# fl_instances FE: instances in FE's dispatch (its mqueue series, by
# instance label).
fl_instances() {
  scrape_in "$1" | sed -n 's/^lynx_mqueue_dispatched_total{.*instance="\([^"]*\)".*/\1/p' | sort -u | wc -l
}
fl_wait_dispatch() { # FE N: until FE dispatches to N instances
  local fe=$1 n=$2
  _fl_has() { (($(fl_instances "$fe") == n)); }
  mh_wait_until 20 "$fe dispatching to $n instances" _fl_has
}

# fl_node_ready HOST: the coordinator counts HOST's node ready.
fl_node_ready() {
  [[ $(api_get "/v1/nodes/${FL_NODE[$1]}" | jq -r .state) == ready ]]
}
fl_node_down() {
  local s
  s=$(api_get "/v1/nodes/${FL_NODE[$1]}" | jq -r .state) || return 1
  [[ $s == down ]]
}

# ---- load ---------------------------------------------------------------------

# fl_load_start NAME FE SECONDS [nowait]: sockperf under-load at FL_RATE
# msg/s, every message answered by design (--reply-every 1), from client
# to FE; returns once FE receives it (sockperf warms up for a second or
# two first), unless nowait (FE cannot say: stopped, fenced).
fl_load_start() {
  local before end
  FL_LOAD_OUT=$MH_DIR/sockperf-$1.out
  [[ ${4:-} == nowait ]] || before=$(fl_metric "$2" lynx_frontend_received_total)
  log "sockperf under-load -i $(mh_ip "$2") --mps $FL_RATE -t $3 ($1)"
  mh_exec client timeout -k 3 $(($3 + 30 * TS)) sockperf under-load -i "$(mh_ip "$2")" \
    -p "$FL_UDP_PORT" -m 64 -t "$3" --mps "$FL_RATE" --reply-every 1 \
    --buffer-size 4194304 >"$FL_LOAD_OUT" 2>&1 </dev/null &
  FL_LOAD_PID=$!
  [[ ${4:-} == nowait ]] && return 0
  end=$(($(mh_now_ms) + 10000 * TS))
  # (sockperf's warm-up messages count: at least 100 more is the test)
  while (($(fl_metric "$2" lynx_frontend_received_total) < before + 100)); do
    (($(mh_now_ms) < end)) || fail "$2 received no load from sockperf within 10 s"
    sleep 0.05
  done
}
fl_load_wait() {
  wait "$FL_LOAD_PID" || { cat "$FL_LOAD_OUT"; fail "sockperf exited with an error"; }
  sockperf_stats "$FL_LOAD_OUT"
  assert_gt "$SP_RCVD" 0 "sockperf answers received"
  assert_eq "$SP_DUP" 0 "sockperf: duplicated answers"
}

# fl_fault_window NAME FE SECONDS FAULT_FN [REASON...]: FE's counts around
# sockperf for SECONDS through FE with FAULT_FN run 1 s into the load,
# then judged by fl_check_window (REASONs: the drops the fault explains).
fl_fault_window() {
  local name=$1 fe=$2 secs=$3 fn=$4
  shift 4
  fl_window_begin "$fe"
  fl_load_start "$name" "$fe" "$secs"
  sleep 1
  "$fn"
  fl_load_wait
  fl_check_window "$fe" "$name" "$@"
}

# ---- counts -------------------------------------------------------------------

# every reason of lynx_frontend_dropped_total: the worker's (before an
# mqueue) and the mqueues' (docs/design.md, "Counters")
FL_REASONS=(oversize ring_full flow_full no_mqueue tag_full shutdown
  stale_tag tx_oversize tx_bad_seq bad_index app_dropped expired lost
  write_error send_error client_gone backend_down in_doubt fenced)

# fl_counts FE PREFIX: FE's received, responded, dropped (and by reason)
# into variables PREFIX_rcv, PREFIX_resp, PREFIX_drop, PREFIX_<reason>.
fl_counts() {
  local text r
  text=$(scrape_in "$1") || fail "cannot scrape $1"
  printf -v "${2}_rcv" '%s' "$(fl_sum lynx_frontend_received_total <<<"$text")"
  printf -v "${2}_resp" '%s' "$(fl_sum lynx_frontend_responded_total <<<"$text")"
  printf -v "${2}_drop" '%s' "$(fl_sum lynx_frontend_dropped_total <<<"$text")"
  for r in "${FL_REASONS[@]}"; do
    printf -v "${2}_$r" '%s' \
      "$(fl_sum lynx_frontend_dropped_total "reason=\"$r\"" <<<"$text")"
  done
}

fl_window_begin() { fl_counts "$1" FLB; }

# fl_quiesce FE: until FE answered or dropped every request it received.
fl_quiesce() {
  local end=$(($(mh_now_ms) + 15000 * TS))
  for (( ; ; )); do
    fl_counts "$1" FLE
    ((FLE_resp + FLE_drop - FLE_stale_tag - FLE_tx_bad_seq - FLE_bad_index >= FLE_rcv)) && return 0
    (($(mh_now_ms) < end)) || return 0
    sleep 0.1
  done
}

# fl_node_drops FE HOST: FE's drops on the mqueues of HOST's node (a
# node's mqueue series go when it leaves dispatch: taken before).
fl_node_drops() { fl_metric "$1" lynx_mqueue_dropped_total "node=\"${FL_NODE[$2]}\""; }

# fl_check_window FE WHAT REASON...: since fl_window_begin, FE answered or
# dropped every request it received; its drops have only the REASONs;
# sockperf (fl_load_wait) duplicated nothing. Sets FL_DROPPED.
fl_check_window() {
  local fe=$1 what=$2 r allowed v other=0 rcv resp drop b e
  shift 2
  fl_quiesce "$fe"
  # stale tags, unpublished TX slots and bad indices are counted among the
  # drops but end no request of this frontend (an answer to an earlier
  # producer's request; an accelerator's slip)
  rcv=$((FLE_rcv - FLB_rcv)) resp=$((FLE_resp - FLB_resp))
  drop=$((FLE_drop - FLB_drop - (FLE_stale_tag - FLB_stale_tag) -
    (FLE_tx_bad_seq - FLB_tx_bad_seq) - (FLE_bad_index - FLB_bad_index)))
  assert_gt "$rcv" 0 "$what: requests $fe received"
  assert_eq $((resp + drop)) "$rcv" "$what: requests $fe answered ($resp) or dropped ($drop), of those it received"
  FL_WHY=''
  for r in "${FL_REASONS[@]}"; do
    b=FLB_$r e=FLE_$r
    v=$((${!e} - ${!b}))
    ((v)) && FL_WHY+=" $r $v"
    allowed=0
    for a in "$@"; do [[ $a == "$r" ]] && allowed=1; done
    ((v == 0 || allowed)) || { log "$what: $v requests dropped as $r"; other=$((other + v)); }
  done
  assert_eq "$other" 0 "$what: requests dropped for reasons the fault does not explain"
  FL_DROPPED=$drop
  log "ok: $what: $fe received $rcv, answered $resp, dropped $drop (${FL_WHY# }; allowed: ${*:-none}); sockperf sent $SP_SENT, got $SP_RCVD answers, none duplicated"
}

# fl_executed HOST: requests HOST's accelerators ran (their service-time
# histograms count each answer) since the agent started.
fl_executed() { fl_metric "$1" lynx_agent_accel_service_seconds_count; }
# fl_dispatched HOST FE...: requests the frontends gave HOST's node.
fl_dispatched() {
  local h=$1 fe s=0
  shift
  for fe in "$@"; do
    s=$((s + $(fl_metric "$fe" lynx_mqueue_dispatched_total "node=\"${FL_NODE[$h]}\"")))
  done
  echo "$s"
}

# fl_check_once HOST FE...: HOST's accelerators ran exactly the requests the
# frontends FE... dispatched to them (the agent samples its accelerators
# every health period: waited for). More would be a request executed twice.
fl_check_once() {
  local h=$1 end=$(($(mh_now_ms) + 10000 * TS)) ex di
  shift
  for (( ; ; )); do
    ex=$(fl_executed "$h") di=$(fl_dispatched "$h" "$@")
    ((ex == di)) && break
    ((ex > di)) && fail "$h ran $ex requests, more than the $di the frontends gave it: a request executed twice"
    (($(mh_now_ms) < end)) || break
    sleep 0.2
  done
  assert_eq "$ex" "$di" "requests $h's accelerators ran (the frontends gave it $di)"
  log "ok: $h ran each of the $di requests it was given exactly once"
}

# fl_ledger "FE..." HOST...: the frontends' dispatched, lost and in-doubt
# totals (fenced counts as in doubt: a fenced frontend's request may have
# run before, or after its successor resumed the ring) and the requests
# HOST...'s accelerators ran, into FLL_disp, FLL_lost, FLL_doubt, FLL_exec,
# and the requests their stopped instances left with answers unread and
# never taken, into FLL_unread and FLL_queued (for fl_check_ledger, around faults that keep the counting processes:
# the frontends' and agents' counts run on).
fl_ledger() {
  local fe h
  FLL_disp=0 FLL_lost=0 FLL_doubt=0 FLL_exec=0 FLL_unread=0 FLL_queued=0
  for fe in $1; do
    FLL_disp=$((FLL_disp + $(fl_metric "$fe" lynx_frontend_dispatched_total)))
    FLL_lost=$((FLL_lost + $(fl_metric "$fe" lynx_frontend_dropped_total 'reason="lost"')))
    FLL_doubt=$((FLL_doubt + $(fl_metric "$fe" lynx_frontend_dropped_total 'reason="in_doubt"') +
      $(fl_metric "$fe" lynx_frontend_dropped_total 'reason="fenced"')))
  done
  shift
  for h in "$@"; do
    FLL_exec=$((FLL_exec + $(fl_executed "$h")))
    FLL_unread=$((FLL_unread + $(fl_metric "$h" lynx_agent_left_requests_total 'state="unread"')))
    FLL_queued=$((FLL_queued + $(fl_metric "$h" lynx_agent_left_requests_total 'state="queued"')))
  done
}

# fl_check_ledger WHAT "FE..." HOST...: since fl_ledger_save, with the
# frontends quiesced: the accelerators ran every request the frontends
# dispatched except those counted lost, and at most those in doubt or
# fenced. A lost request may have run only before it was counted, its
# answer never read (docs/design.md, "Delivery guarantees": taken before
# the fence passed, on a node cut off or stopped before the frontend read
# the answer); the agents count those when the new incarnation discards
# the old instances (lynx_agent_left_requests_total{state="unread"}), so
# the ledger allows exactly that many. More runs than that: a lost
# request ran after the fence, or one ran twice.
fl_check_ledger() {
  local what=$1 fes=$2 end=$(($(mh_now_ms) + 10000 * TS)) hi lo ex ran
  shift 2
  for (( ; ; )); do
    fl_ledger "$fes" "$@"
    hi=$((FLL_disp - FL0_disp - (FLL_lost - FL0_lost)))
    lo=$((hi - (FLL_doubt - FL0_doubt)))
    ex=$((FLL_exec - FL0_exec))
    ran=$((FLL_unread - FL0_unread))
    ((ex > hi + ran)) && fail "$what: the accelerators ran $ex requests, more than the $hi dispatched and not lost and the $ran whose answers were left unread: a lost request ran after the fence, or one ran twice"
    ((ex >= lo)) && break
    (($(mh_now_ms) < end)) || break
    sleep 0.2 # the agents sample their accelerators every health period
  done
  ((ex >= lo)) || fail "$what: the accelerators ran $ex requests, fewer than the $lo dispatched and neither lost nor in doubt"
  ((ex <= hi)) || log "note: $what: $((ex - hi)) of the requests counted lost ran before the fence passed, their answers unread (the agents left $ran unread)"
  # what the old instances left is what the frontends gave up on
  assert_le $((ran + FLL_queued - FL0_queued)) $((FLL_lost - FL0_lost + FLL_doubt - FL0_doubt)) "$what: requests the stopped instances left queued or unread (the frontends counted $((FLL_lost - FL0_lost)) lost and $((FLL_doubt - FL0_doubt)) in doubt)"
  log "ok: $what: the accelerators ran $ex requests: $((FLL_disp - FL0_disp)) dispatched, $((FLL_lost - FL0_lost)) lost (none ran after the fence), $((FLL_doubt - FL0_doubt)) in doubt or fenced; the old instances left $ran answers unread and $((FLL_queued - FL0_queued)) requests queued"
}
fl_ledger_save() {
  fl_ledger "$@"
  FL0_disp=$FLL_disp FL0_lost=$FLL_lost FL0_doubt=$FLL_doubt FL0_exec=$FLL_exec
  FL0_unread=$FLL_unread FL0_queued=$FLL_queued
}
