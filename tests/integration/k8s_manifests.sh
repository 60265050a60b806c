#!/usr/bin/env bash
# k8s_manifests: deploy/k8s/ passes its schema check (deploy/k8s/check.py:
# required fields, selectors matching pod labels, what each workload names
# defined, Lynx's own placement rules), and the check fails for a broken
# copy: a selector that no longer matches its pods, an agent off the
# node's network.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init k8s_manifests
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
K8S=$SRC/deploy/k8s
PY=/usr/bin/python3
if [[ ! -x $PY ]] || ! $PY -c 'import yaml' 2>/dev/null; then
  skip "Debian's python3 with python3-yaml is needed (deploy/install-deps.sh)"
fi

out=$($PY "$K8S/check.py" "$K8S"/*.yaml 2>&1) || { echo "$out"; fail "deploy/k8s/check.py refused the manifests"; }
log "ok: $out"

# broken copies must be refused
mkdir -p "$IT_DIR/bad"
cp "$K8S"/*.yaml "$IT_DIR/bad/"
sed -i '0,/app.kubernetes.io\/name: lynx-frontend/{/matchLabels/,/lynx-frontend/s/lynx-frontend/lynx-frontend-x/}' "$IT_DIR/bad/frontend.yaml"
if out=$($PY "$K8S/check.py" "$IT_DIR/bad"/*.yaml 2>&1); then
  fail "a frontend whose selector matches no pod label passed the check"
fi
grep -q "selector does not match" <<<"$out" || { echo "$out"; fail "the check did not say why"; }
cp "$K8S/frontend.yaml" "$IT_DIR/bad/frontend.yaml"
grep -v hostNetwork "$K8S/agent.yaml" >"$IT_DIR/bad/agent.yaml"
if out=$($PY "$K8S/check.py" "$IT_DIR/bad"/*.yaml 2>&1); then
  fail "an agent off the node's network passed the check"
fi
grep -q "not on the node's network" <<<"$out" || { echo "$out"; fail "the check did not say why"; }
log "ok: broken copies refused, with the reason"
it_done
