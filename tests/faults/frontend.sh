#!/usr/bin/env bash
# shellcheck disable=SC2317 # the fault functions are called through phase()
# faults/frontend: the faults of the active frontend, each under sockperf
# load, judged by the fault suite's counts (lib.sh; docs/faults.md).
#
#   coord  10.77.0.1   lynx-coordinator (lease 1 s, --frontend-timeout-ms
#                      1500)
#   h1, h2 10.77.0.11-12  an agent each, 2 CPU accelerators over tcp
#   fe1    10.77.0.2   lynx-frontend, active first
#   fe2    10.77.0.3   lynx-frontend, standby first
#   client 10.77.0.9   sockperf under-load, 1000 msg/s
#
# A frontend is the clients' endpoint: what a client sends a failed one is
# lost with it (clients then go to the new active one, as a VIP or DNS
# would move them). So each fault runs load through the active frontend,
# fails it, and once the standby serves, load through the new active one:
# that one answers or drops every request it receives, drops none (the
# answers to its predecessor's requests that it finds in the rings are
# stale tags, counted apart), and sockperf sees no duplicate.
#
#  0. no fault: fe1 serves, nothing dropped; h1 and h2 ran exactly what
#     fe1 gave them.
#  1. SIGSTOP of fe1 past the frontend timeout, then SIGCONT: fe2 is
#     promoted with a newer epoch, the agents cut fe1; fe1, resumed while a
#     client sends to it, answers none of the requests (those it took while
#     stopped and after) and becomes a standby: a fenced frontend answers
#     nothing. Ledger: the accelerators ran every
#     request fe2 dispatched and, of fe1's, at most those it dispatched
#     before the stop (fe1's counters go when it turns standby: read
#     just before the stop).
#  2. kill -9 of fe2 (active): fe1 is promoted and serves; a new fe2 comes
#     back as a standby.
#  3. restart of fe1 (SIGTERM, start): fe2 is promoted and serves; fe1
#     comes back as a standby.
#
# usage: frontend.sh [BIN_DIR]   (ctest passes build/bin; root)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

IT_NAME=faults_frontend
mh_begin "$IT_NAME" 240

step "set-up: coordinator, agents h1 and h2, frontends fe1 (active) and fe2 (standby), client"
fl_cluster 2 2

# serving FE: FE logged that it serves the service (once more than N, the
# count before).
serves_count() { grep -c "serving service echo" "${FL_LOG[$1]}" || true; }

# served_by NAME FE SECONDS: a window of load through FE, judged.
served_by() {
  fl_window_begin "$2"
  fl_load_start "$1" "$2" "$3"
  fl_load_wait
  fl_check_window "$2" "$1 (through $2)" stale_tag
  assert_eq "$FL_DROPPED" 0 "$1: requests $2 dropped"
}

step "0. no fault"
served_by none fe1 3
fl_check_once h1 fe1
fl_check_once h2 fe1

step "1. SIGSTOP of fe1 past the frontend timeout, then SIGCONT"
# the ledger: fe2's counts run on; fe1's go when it turns standby, so its
# dispatches are read just before the stop (at most a few more follow)
fl_ledger_save fe2 h1 h2
d1=$(fl_metric fe1 lynx_frontend_dispatched_total)
n=$(serves_count fe2)
fl_load_start stop-fe1 fe1 4
sleep 1
d1a=$(fl_metric fe1 lynx_frontend_dispatched_total)
t=$(mh_now_ms)
kill -STOP "${FL_PID[fe1]}"
gap=$(($(mh_now_ms) - t))
mh_wait_log "${FL_LOG[fe2]}" "serving service echo" 15 $((n + 1)) "${FL_PID[fe2]}"
log "fe2 serves $(($(mh_now_ms) - t)) ms after fe1 stopped (--frontend-timeout-ms $FL_FE_TIMEOUT_MS)"
wait "$FL_LOAD_PID" || true # its frontend stopped under it
served_by after-stop fe2 3
# fe1 resumes with a client sending to it: fenced, it answers nothing
fl_load_start to-fenced-fe1 fe1 3 nowait
sleep 0.5
kill -CONT "${FL_PID[fe1]}"
mh_wait_log "${FL_LOG[fe1]}" "applied (standby)" 15 1 "${FL_PID[fe1]}"
wait "$FL_LOAD_PID" || true
if grep -q 'No messages were received' "$FL_LOAD_OUT"; then
  log "ok: the client of fe1 got no answer after fe1 resumed fenced"
else
  sockperf_stats "$FL_LOAD_OUT"
  assert_eq "$SP_RCVD" 0 "answers the client of fe1 got after fe1 resumed fenced"
fi
fl_quiesce fe2
# the accelerators ran what fe2 dispatched (none lost), and of fe1's
# requests at most those it dispatched before the stop: none twice, none
# from fe1 after it was fenced
end=$(($(mh_now_ms) + 10000))
for (( ; ; )); do
  fl_ledger fe2 h1 h2
  of_fe1=$((FLL_exec - FL0_exec - (FLL_disp - FL0_disp)))
  max1=$((d1a - d1 + FL_RATE * (gap + 200) / 1000 + 1))
  ((of_fe1 > max1)) && fail "stop of fe1: the accelerators ran $of_fe1 requests besides fe2's, more than the $max1 fe1 dispatched before it stopped"
  ((of_fe1 >= 0)) && break
  (($(mh_now_ms) < end)) || break
  sleep 0.2
done
assert_eq $((FLL_lost - FL0_lost)) 0 "stop of fe1: requests fe2 lost"
assert_ge "$of_fe1" 0 "stop of fe1: requests of fe1 the accelerators ran (fe2's $((FLL_disp - FL0_disp)) all ran)"
log "ok: stop of fe1: the accelerators ran fe2's $((FLL_disp - FL0_disp)) requests and $of_fe1 of fe1's (it dispatched $((d1a - d1)) up to $gap ms before the stop)"

step "2. kill -9 of fe2 (active)"
n=$(serves_count fe1)
fl_load_start kill-fe2 fe2 4
sleep 1
t=$(mh_now_ms)
mh_stop "${FL_PID[fe2]}" 5 KILL
mh_wait_log "${FL_LOG[fe1]}" "serving service echo" 15 $((n + 1)) "${FL_PID[fe1]}"
log "fe1 serves $(($(mh_now_ms) - t)) ms after fe2 was killed"
wait "$FL_LOAD_PID" || true # its frontend died under it
served_by after-kill fe1 3
fl_frontend fe2
mh_wait_log "${FL_LOG[fe2]}" "applied (standby)" 15 1 "${FL_PID[fe2]}"
served_by fe2-back fe1 2

step "3. restart of fe1 (active): SIGTERM, then a new one"
n=$(serves_count fe2)
fl_load_start restart-fe1 fe1 4
sleep 1
t=$(mh_now_ms)
mh_stop "${FL_PID[fe1]}" 10
mh_wait_log "${FL_LOG[fe2]}" "serving service echo" 15 $((n + 1)) "${FL_PID[fe2]}"
log "fe2 serves $(($(mh_now_ms) - t)) ms after fe1 was stopped"
wait "$FL_LOAD_PID" || true
fl_frontend fe1
mh_wait_log "${FL_LOG[fe1]}" "applied (standby)" 15 1 "${FL_PID[fe1]}"
served_by after-restart fe2 3
it_done
