#!/usr/bin/env bash
# docs_api: the API reference (docs/api.md) shows what the API returns. A
# real coordinator, an agent registered as the docs' node1 (labels
# zone=a,rack=r1, two CPU accelerators), a frontend and the docs' service
# echo; then every documented `curl -s http://127.0.0.1:7780/PATH` whose
# example answer is JSON is asked of the real API, and the two must have the
# same fields (the same key paths, array positions aside), with the CPU
# accelerators' kind, model and memory as the agent registers them. Node
# ids in the docs must be ids lynx-agent accepts.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init docs_api
it_require_coord
it_require awk
DOC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../docs" && pwd)/api.md
pick_ports COORD_PORT API_PORT METRICS_PORT UDP_PORT
IT_SOFT=1

start_coordinator --lease-ms 3000
# the docs' node1 (node ids are this test's own elsewhere; its region files
# are cleaned like theirs)
IT_NODES+=(node1)
start_node_agent node1 --labels zone=a,rack=r1
A=$AGENT_PID
start_coord_frontend
api POST /v1/services -d "{\"name\":\"echo\",\"port\":$UDP_PORT,\"app\":\"sockperf-echo\"}"
[[ $API_STATUS == 201 ]] || fail "POST /v1/services: HTTP $API_STATUS: $(cat "$API_BODY")"
wait_log "$FRONTEND_LOG" "serving service echo" 10 1 "$FRONTEND_PID"
# instances ready and reported by the frontend (mqueues listed)
end=$(($(now_ms) + 10000))
until [[ $(api_json /v1/mqueues '.items | length') -gt 0 ]]; do
  (($(now_ms) < end)) || fail "no mqueue listed 10 s after the service was created"
  sleep 0.1
done

# every documented GET with a JSON example answer: "PATH<TAB>JSON"
examples=$IT_DIR/examples.tsv
awk '
  /^```sh$/ { insh = 1; n = 0; path = ""; next }
  insh && /^```$/ { insh = 0; want = (n == 1); next }
  insh { if ($0 ~ /^curl -s http:\/\/127\.0\.0\.1:7780\//) { n++; path = $3 } else if ($0 ~ /curl/) n += 2; next }
  want && /^```json$/ { injson = 1; body = ""; next }
  injson && /^```$/ { injson = 0; want = 0; sub(/^http:\/\/127\.0\.0\.1:7780/, "", path); print path "\t" body; next }
  injson { body = body $0; next }
  /^```/ { want = 0 }
' "$DOC" >"$examples"
n_ex=$(wc -l <"$examples")
assert_ge "$n_ex" 5 "documented GET examples with a JSON answer"

# keys FILE: the key paths of a JSON document, array positions as []
keys() {
  jq -r '[paths | map(if type == "number" then "[]" else . end) | join(".")] | unique | .[]' "$1"
}

checked=0
while IFS=$'\t' read -r path body; do
  printf '%s\n' "$body" >"$IT_DIR/doc.json"
  if ! jq -e . "$IT_DIR/doc.json" >/dev/null 2>&1; then
    log "note: the example for GET $path is abbreviated (not JSON): not compared"
    continue
  fi
  api GET "$path"
  if [[ $API_STATUS != 200 ]]; then
    it_check_failed "GET $path (documented): HTTP $API_STATUS: $(head -c 200 "$API_BODY")"
    continue
  fi
  keys "$IT_DIR/doc.json" >"$IT_DIR/doc.keys"
  keys "$API_BODY" >"$IT_DIR/real.keys"
  only_doc=$(comm -23 "$IT_DIR/doc.keys" "$IT_DIR/real.keys" | tr '\n' ' ')
  only_real=$(comm -13 "$IT_DIR/doc.keys" "$IT_DIR/real.keys" | tr '\n' ' ')
  if [[ -n $only_doc || -n $only_real ]]; then
    it_check_failed "GET $path: documented but not returned: [${only_doc}] returned but not documented: [${only_real}]"
  else
    log "ok: GET $path returns the documented fields ($(wc -l <"$IT_DIR/real.keys") key paths)"
  fi
  checked=$((checked + 1))
done <"$examples"
assert_ge "$checked" 5 "documented examples compared with the real API"

# CPU accelerators as agents register them
for f in kind model memory_bytes; do
  real=$(api_json /v1/accelerators "[.items[] | select(.kind == \"cpu\") | .$f] | unique | .[]")
  doc=$(grep -o "\"kind\":\"cpu\",[^}]*" "$DOC" | grep -o "\"$f\":[^,]*" | sed 's/^[^:]*://; s/"//g' | sort -u)
  [[ $doc == "$real" ]] ||
    it_check_failed "CPU accelerators' $f: the docs show '$(tr '\n' ' ' <<<"$doc")', the API returns '$real'"
done
# node ids in the docs' examples are ids an agent accepts
for id in $(grep -o '"node":"[^"]*"' "$DOC" | sed 's/.*:"//; s/"$//' | sort -u); do
  "$LYNX_BIN_DIR/lynx-agent" --node-id "$id" --cpu-accels 1 --list-accels >/dev/null 2>&1 ||
    it_check_failed "the docs use node id '$id', which lynx-agent --node-id refuses"
done
it_done
