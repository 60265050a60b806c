#!/usr/bin/env bash
# openapi: docs/openapi.yaml describes the coordinator's API as the code
# serves it and as docs/api.md shows it (tests/integration/openapi_check.py
# does the checking; its docstring lists every check):
#   a. the routes of routes[] in coordinator/http.c are exactly the described
#      operations;
#   b. a live coordinator (token, agent with labels, frontend, service)
#      answers every described GET without a path parameter, and a series of
#      changes and refusals, with described statuses and bodies that validate
#      against the described schemas;
#   c. every JSON example of docs/api.md validates against the schema of the
#      route it documents;
#   d. the YAML is an OpenAPI 3.0 document whose $refs all resolve;
#   e. every error code the coordinator's C code sends, and every query
#      argument it reads, is described.
# Skipped (77) without python3-yaml or python3-jsonschema.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init openapi
it_require python3 curl
python3 -c 'import yaml' 2>/dev/null ||
  skip "python3-yaml is not installed (deploy/install-deps.sh)"
python3 -c 'import jsonschema' 2>/dev/null ||
  skip "python3-jsonschema is not installed (deploy/install-deps.sh)"
[[ -x $LYNX_BIN_DIR/lynx-coordinator ]] ||
  fail "$LYNX_BIN_DIR/lynx-coordinator is missing: build first (make)"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CHECK=$ROOT/tests/integration/openapi_check.py
pick_ports COORD_PORT API_PORT METRICS_PORT SVC_PORT SVC_PORT2
BODY_MAX=4096

printf 'openapi-test-token\n' >"$IT_DIR/token"
chmod 600 "$IT_DIR/token"
start_coordinator --token-file "$IT_DIR/token" --body-max "$BODY_MAX"
node_ids NODE
start_node_agent "$NODE" --labels zone=a,rack=r1 --token-file "$IT_DIR/token"
start_coord_frontend --token-file "$IT_DIR/token"

# a service with ready instances, so that /v1/mqueues lists some
api POST /v1/services -H "Authorization: Bearer openapi-test-token" \
  -d "{\"name\":\"echo\",\"port\":$SVC_PORT,\"app\":\"sockperf-echo\"}"
[[ $API_STATUS == 201 ]] || fail "POST /v1/services: HTTP $API_STATUS: $(cat "$API_BODY")"
end=$(($(now_ms) + 10000))
until [[ $(curl -s --max-time 2 "$(api_url)/v1/mqueues" | python3 -c \
  'import json,sys; print(len(json.load(sys.stdin)["items"]))' 2>/dev/null) -gt 0 ]]; do
  (($(now_ms) < end)) || fail "no mqueue listed 10 s after the service was created"
  sleep 0.1
done

python3 "$CHECK" --root "$ROOT" --api "$(api_url)" --token-file "$IT_DIR/token" \
  --node "$NODE" --port "$SVC_PORT2" --body-max "$BODY_MAX"
rc=$?
((rc == 77)) && skip "openapi_check.py skipped"
((rc == 0)) || fail "docs/openapi.yaml is out of step (see FAIL above)"
is_alive "$COORD_PID" || fail "the coordinator died during the checks"
it_done
