#!/usr/bin/env python3
"""check.py FILE...: checks the Kubernetes manifests of deploy/k8s/ for what
a cluster would refuse or run wrongly (Debian has no kubeconform): every
document has apiVersion, kind and metadata.name (and a namespace unless it
is a Namespace); a workload's selector matches its pod labels, its
containers have a name and an image, ports are numbers, the ConfigMaps,
Secrets and Services it names exist in the set; and Lynx's own rules: the
agent runs on GPU nodes on the node's network and asks for nvidia.com/gpu,
the frontend is pinned by a node selector on the node's network, the
coordinators run on etcd. Prints each problem; exit 1 if any, else 0."""
import sys

import yaml

WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet"}
problems = []


def need(cond, where, what):
    if not cond:
        problems.append(f"{where}: {what}")


def get(d, *path):
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


docs = []
for path in sys.argv[1:]:
    with open(path) as f:
        for i, d in enumerate(yaml.safe_load_all(f)):
            if d is not None:
                docs.append((f"{path}#{i}", d))

names = {(d.get("kind"), get(d, "metadata", "name")) for _, d in docs}
for where, d in docs:
    kind = d.get("kind")
    need(isinstance(d.get("apiVersion"), str), where, "no apiVersion")
    need(isinstance(kind, str), where, "no kind")
    need(isinstance(get(d, "metadata", "name"), str), where, "no metadata.name")
    if kind != "Namespace":
        need(get(d, "metadata", "namespace") is not None, where, "no metadata.namespace")
    if kind not in WORKLOADS:
        continue
    where = f"{where} ({kind} {get(d, 'metadata', 'name')})"
    sel = get(d, "spec", "selector", "matchLabels") or {}
    labels = get(d, "spec", "template", "metadata", "labels") or {}
    need(sel, where, "no spec.selector.matchLabels")
    need(all(labels.get(k) == v for k, v in sel.items()), where,
         "the selector does not match the pod template's labels")
    pod = get(d, "spec", "template", "spec") or {}
    containers = pod.get("containers") or []
    need(containers, where, "no containers")
    for c in containers:
        need(isinstance(c.get("name"), str) and isinstance(c.get("image"), str),
             where, "a container without name or image")
        for p in c.get("ports") or []:
            need(isinstance(p.get("containerPort"), int), where,
                 f"container port {p} is not a number")
        claims = [get(t, "metadata", "name")
                  for t in get(d, "spec", "volumeClaimTemplates") or []]
        for m in c.get("volumeMounts") or []:
            need(any(v.get("name") == m.get("name") for v in pod.get("volumes") or [])
                 or m.get("name") in claims,
                 where, f"volume mount {m.get('name')} names no volume")
    for v in pod.get("volumes") or []:
        cm = get(v, "configMap", "name")
        sec = get(v, "secret", "secretName")
        need(cm is None or ("ConfigMap", cm) in names, where, f"ConfigMap {cm} is not defined")
        # the token Secret is made by the operator (README.md)
        need(sec is None or sec == "lynx-token", where, f"Secret {sec} is not the documented one")
    if kind == "StatefulSet":
        need(("Service", get(d, "spec", "serviceName")) in names, where,
             "serviceName names no Service")
    cmd = " ".join(str(x) for c in containers for x in (c.get("command") or []) + (c.get("args") or []))
    name = get(d, "metadata", "name")
    if name == "lynx-agent":
        need(kind == "DaemonSet", where, "the agent is not a DaemonSet")
        need(pod.get("hostNetwork") is True, where, "the agent is not on the node's network")
        need(get(pod, "nodeSelector", "nvidia.com/gpu.present") == "true", where,
             "the agent is not pinned to GPU nodes")
        need(any(get(c, "resources", "limits", "nvidia.com/gpu") for c in containers),
             where, "the agent asks for no nvidia.com/gpu")
    if name == "lynx-frontend":
        need(pod.get("hostNetwork") is True, where, "the frontend is not on the node's network")
        need(pod.get("nodeSelector"), where, "the frontend has no node selector")
    if name == "lynx-coordinator":
        conf = get(next((x for _, x in docs if x.get("kind") == "ConfigMap" and
                         get(x, "metadata", "name") == "lynx-coordinator"), {}),
                   "data", "coordinator.conf") or ""
        need("etcd =" in conf, where, "the coordinators run without etcd")
        need(get(d, "spec", "replicas") in (3, 5), where,
             "coordinators: 3 or 5 (one may fail)")

for p in problems:
    print(p)
print(f"{len(docs)} documents, {len(problems)} problems")
sys.exit(1 if problems else 0)
