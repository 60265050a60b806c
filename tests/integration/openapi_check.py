#!/usr/bin/env python3
"""openapi_check.py --root SRC [--api URL --token-file F --node ID --port P
--body-max N]: checks docs/openapi.yaml against the code, the docs and (with
--api) a live coordinator. integration.openapi (openapi.sh) runs it.

  [d] the YAML is an OpenAPI 3.0 document: openapi, info, paths, every
      operation has responses, every $ref resolves (locally), path
      parameters match the path templates, operationIds are unique, every
      schema is a valid JSON Schema once converted; changes (POST, DELETE)
      need the bearer token and describe 401 and 403, reads need none
  [a] the routes of coordinator/http.c's routes[] table and the described
      operations are the same set (method + path; the names inside braces
      and a trailing slash do not count)
  [e] every error code coordinator/*.c can send is in the Error schema's
      enum with a status the spec describes, and every query argument
      http.c reads is a described query parameter
  [c] every JSON example of docs/api.md (```json blocks, and inline
      `NNN {...}` answers) validates against the schema of the route it
      documents: the route of the curl command just before the block, else
      the one its heading names; a line "NNN {...}" is an answer with that
      status, which the route must describe; "[...]" stands for an elided
      array (checked as []); a "# " line is a comment. The bodies the curl
      commands send (-d '...') validate against the request body's schema
  [b] a live coordinator (with an agent, a frontend and a service) answers
      every described GET without a path parameter with its 2xx status and a
      body that validates, and a series of changes and refusals (each
      operation of the spec, pages, 400, 401, 404, 405, 409, 413, 422) with
      described statuses, headers and bodies; a request body it took
      validates against the described request body. A described GET that
      routes[] lacks and that answers 404 is not asked (a note; [a] fails)

Prints one line per check ("ok", "FAIL", "note"), exits 1 when a check
failed, 77 when python3-yaml or python3-jsonschema is missing."""
import argparse
import http.client
import json
import os
import re
import sys
import urllib.parse

try:
    import yaml
except ImportError:
    print("SKIP: python3-yaml is not installed (deploy/install-deps.sh)")
    sys.exit(77)
try:
    import jsonschema
except ImportError:
    print("SKIP: python3-jsonschema is not installed (deploy/install-deps.sh)")
    sys.exit(77)

METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")
failures = 0


def fail(part, msg):
    global failures
    failures += 1
    print(f"FAIL [{part}] {msg}")


def ok(part, msg):
    print(f"ok   [{part}] {msg}")


def note(part, msg):
    print(f"note [{part}] {msg}")


def norm(path):
    """A path template with the names in braces and a trailing slash
    dropped: /v1/nodes/{id}/ and /v1/nodes/{name} are both /v1/nodes/{}."""
    p = re.sub(r"\{[^}]*\}", "{}", path)
    if len(p) > 1 and p.endswith("/"):
        p = p[:-1]
    return p


# ---- the spec -----------------------------------------------------------


def pointer(doc, ref):
    """The object a local $ref names, or raises KeyError."""
    if not ref.startswith("#/"):
        raise KeyError(f"{ref}: not a local reference")
    node = doc
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise KeyError(ref)
    return node


def deref(doc, node):
    """node, or what its $ref names (followed)."""
    seen = 0
    while isinstance(node, dict) and "$ref" in node and seen < 32:
        node = pointer(doc, node["$ref"])
        seen += 1
    return node


def operations(spec):
    """(method, path, operation, path item) of every described operation."""
    for path, item in (spec.get("paths") or {}).items():
        if not isinstance(item, dict):
            continue
        for m in METHODS:
            if m in item:
                yield m.upper(), path, item[m], item


def to_jsonschema(node):
    """An OpenAPI 3.0 schema object as a JSON Schema (draft 7): component
    references point into "definitions", nullable adds null, the boolean
    exclusiveMinimum/Maximum become numbers, OpenAPI-only keywords go."""
    if isinstance(node, list):
        return [to_jsonschema(x) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        m = re.fullmatch(r"#/components/schemas/([^/]+)", node["$ref"])
        if not m:
            raise ValueError(f"$ref {node['$ref']}: not a component schema")
        return {"$ref": "#/definitions/" + m.group(1)}
    out = {}
    for k, v in node.items():
        if k in ("nullable", "example", "discriminator", "xml", "externalDocs",
                 "deprecated", "exclusiveMinimum", "exclusiveMaximum"):
            continue
        if k == "properties":
            out[k] = {name: to_jsonschema(s) for name, s in v.items()}
        elif k in ("items", "not") or (k == "additionalProperties" and
                                        isinstance(v, dict)):
            out[k] = to_jsonschema(v)
        elif k in ("allOf", "anyOf", "oneOf"):
            out[k] = [to_jsonschema(s) for s in v]
        else:
            out[k] = v  # type, enum, default, minimum, ...: as they are
    for ex, bound in (("exclusiveMinimum", "minimum"),
                      ("exclusiveMaximum", "maximum")):
        if node.get(ex) is True and bound in out:
            out[ex] = out.pop(bound)
    if node.get("nullable") is True:
        if "type" in out:
            out["type"] = [out["type"], "null"]
            if "enum" in out:
                out["enum"] = list(out["enum"]) + [None]
        else:
            out = {"anyOf": [out, {"type": "null"}]}
    return out


class Schemas:
    """Validators for the spec's schemas, components included."""

    def __init__(self, spec):
        comps = (spec.get("components") or {}).get("schemas") or {}
        self.defs = {name: to_jsonschema(s) for name, s in comps.items()}

    def validator(self, openapi_schema):
        s = {"$schema": "http://json-schema.org/draft-07/schema#",
             "definitions": self.defs,
             "allOf": [to_jsonschema(openapi_schema)]}
        return jsonschema.Draft7Validator(s)

    def errors(self, openapi_schema, value):
        """The validation errors of value, as short strings."""
        v = self.validator(openapi_schema)
        out = []
        for e in sorted(v.iter_errors(value), key=lambda e: list(e.path)):
            where = "/".join(str(p) for p in e.absolute_path) or "(top)"
            out.append(f"at {where}: {e.message[:300]}")
        return out


# ---- [d] structure ---------------------------------------------------------


def check_structure(spec, schemas):
    part = "d"
    if not isinstance(spec, dict):
        fail(part, "the document is not a mapping")
        return False
    if not str(spec.get("openapi", "")).startswith("3.0."):
        fail(part, f"openapi: want 3.0.x, got {spec.get('openapi')!r}")
    info = spec.get("info")
    if not (isinstance(info, dict) and isinstance(info.get("title"), str) and
            isinstance(info.get("version"), str)):
        fail(part, "info: needs a title and a version (strings)")
    if not isinstance(spec.get("paths"), dict) or not spec["paths"]:
        fail(part, "paths: missing or empty")
        return False
    n_refs = 0

    def walk(node, where):
        nonlocal n_refs
        if isinstance(node, dict):
            if "$ref" in node:
                n_refs += 1
                try:
                    pointer(spec, node["$ref"])
                except (KeyError, ValueError, IndexError):
                    fail(part, f"{where}: $ref {node['$ref']} does not resolve")
            for k, v in node.items():
                walk(v, f"{where}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}/{i}")

    walk(spec, "#")
    ok(part, f"{n_refs} $refs checked")
    schemes = (spec.get("components") or {}).get("securitySchemes") or {}
    op_ids = {}
    n_ops = 0
    for method, path, op, item in operations(spec):
        where = f"{method} {path}"
        n_ops += 1
        if not path.startswith("/"):
            fail(part, f"{where}: a path must start with /")
        if not isinstance(op, dict) or not isinstance(op.get("responses"), dict) \
                or not op["responses"]:
            fail(part, f"{where}: no responses")
            continue
        for code, resp in op["responses"].items():
            if not re.fullmatch(r"[1-5](\d\d|XX)|default", str(code)):
                fail(part, f"{where}: response key {code!r} is not a status")
            r = deref(spec, resp)
            if not isinstance(r, dict) or "description" not in r:
                fail(part, f"{where} {code}: a response needs a description")
                continue
            for mt, media in (r.get("content") or {}).items():
                if mt.startswith("application/json") and "schema" not in media:
                    fail(part, f"{where} {code} {mt}: no schema")
        oid = op.get("operationId")
        if oid:
            if oid in op_ids:
                fail(part, f"{where}: operationId {oid} also on {op_ids[oid]}")
            op_ids[oid] = where
        # path parameters: one per template variable, required, in: path
        params = [deref(spec, p) for p in
                  (item.get("parameters") or []) + (op.get("parameters") or [])]
        declared = {p.get("name") for p in params if p.get("in") == "path"}
        for p in params:
            if p.get("in") == "path" and p.get("required") is not True:
                fail(part, f"{where}: path parameter {p.get('name')} must be required")
        wanted = set(re.findall(r"\{([^}]+)\}", path))
        if declared != wanted:
            fail(part, f"{where}: path parameters {sorted(declared)} but the "
                       f"template has {sorted(wanted)}")
        # authorisation (docs/api.md): changes need the token, reads none
        sec = op.get("security", spec.get("security", []))
        needs = any("bearerAuth" in s for s in sec or [])
        for s in sec or []:
            for name in s:
                if name not in schemes:
                    fail(part, f"{where}: security scheme {name} is not defined")
        if method in ("POST", "DELETE"):
            if not needs:
                fail(part, f"{where}: a change must require bearerAuth")
            for st in ("401", "403"):
                if st not in op["responses"]:
                    fail(part, f"{where}: a change must describe {st}")
        elif needs:
            fail(part, f"{where}: a read needs no token (docs/api.md, Authorisation)")
    ok(part, f"{n_ops} operations have responses, path parameters and security")
    n = 0
    for name, s in schemas.defs.items():
        try:
            jsonschema.Draft7Validator.check_schema(s)
            n += 1
        except jsonschema.exceptions.SchemaError as e:
            fail(part, f"components/schemas/{name}: not a valid schema: {e.message}")
    ok(part, f"{n} component schemas are valid JSON Schemas")
    return True


# ---- [a] routes ------------------------------------------------------------


def c_routes(http_c):
    with open(http_c, encoding="utf-8") as f:
        src = f.read()
    m = re.search(r"static const struct route routes\[\]\s*=\s*\{(.*?)\n\};",
                  src, re.S)
    if not m:
        return None
    return re.findall(r'\{\s*"([A-Z]+)"\s*,\s*"([^"]+)"\s*,\s*\w+\s*(?:,\s*\d+\s*)?\}',
                      m.group(1))


def check_routes(spec, routes):
    part = "a"
    served = {(m, norm(p)) for m, p in routes}
    described = {(m, norm(p)): p for m, p, _, _ in operations(spec)}
    for m, p in routes:
        if (m, norm(p)) in described:
            ok(part, f"{m} {p} is described")
        else:
            fail(part, f"{m} {p} is served (routes[] in coordinator/http.c) "
                       "but not described in docs/openapi.yaml")
    for (m, n), p in sorted(described.items()):
        if (m, n) not in served:
            fail(part, f"{m} {p} is described in docs/openapi.yaml but not "
                       "served (no such entry in routes[] of coordinator/http.c)")
    return served


# ---- [e] codes and query arguments --------------------------------------


def check_code(spec, root):
    part = "e"
    statuses = set(every_path(spec))
    for _, _, op, _ in operations(spec):
        statuses |= {str(s) for s in op.get("responses", {})}
    enum = set(pointer(spec, "#/components/schemas/Error")["properties"]
               ["error"]["properties"]["code"].get("enum", []))
    pairs = set()
    cdir = os.path.join(root, "coordinator")
    srcs = {}
    for name in sorted(os.listdir(cdir)):
        if name.endswith(".c"):
            with open(os.path.join(cdir, name), encoding="utf-8") as f:
                srcs[name] = f.read()
    for name, src in srcs.items():
        for st, code in re.findall(
                r'(?:reply_err|set_err)\(\s*[^,()]+,\s*(\d{3}),\s*"([a-z_]+)"', src):
            pairs.add((st, code, name))
        for st, code in re.findall(r'status = (\d{3}), code = "([a-z_]+)"', src):
            pairs.add((st, code, name))
        # save_err_status: *code = "x"; return NNN;
        for code, st in re.findall(r'\*code = "([a-z_]+)";\s*return (\d{3});', src):
            pairs.add((st, code, name))
    if len(pairs) < 10:
        fail(part, f"found only {len(pairs)} (status, code) pairs in coordinator/*.c: "
                   "the patterns no longer match the code")
    for st, code, name in sorted(pairs):
        if code not in enum:
            fail(part, f"{name} sends code {code} ({st}), which Error.code's enum lacks")
        if st not in statuses:
            fail(part, f"{name} sends status {st} ({code}), which no operation describes")
    ok(part, f"{len({(s, c) for s, c, _ in pairs})} (status, code) pairs of "
             "coordinator/*.c are described")
    qparams = set()
    for _, _, op, item in operations(spec):
        for p in (item.get("parameters") or []) + (op.get("parameters") or []):
            p = deref(spec, p)
            if p.get("in") == "query":
                qparams.add(p.get("name"))
    args = set(re.findall(r'MHD_GET_ARGUMENT_KIND,\s*"(\w+)"', srcs.get("http.c", "")))
    for a in sorted(args):
        if a not in qparams:
            fail(part, f"http.c reads the query argument {a}, which no operation describes")
    ok(part, f"query arguments read by http.c: {', '.join(sorted(args))}: described")


# ---- matching a request to the spec ---------------------------------------


def find_op(spec, method, path):
    """(template, operation) for a concrete path ("" and None when none).
    Literal segments win over parameters."""
    segs = norm(path.split("?")[0]).split("/")
    best = None
    for m, tmpl, op, _ in operations(spec):
        if m != method:
            continue
        t = norm(tmpl).split("/")
        if len(t) != len(segs):
            continue
        score = 0
        for a, b in zip(t, segs):
            if a == "{}":
                if not b:
                    break
            elif a != b:
                break
            else:
                score += 1
        else:
            if best is None or score > best[0]:
                best = (score, tmpl, op)
    return (best[1], best[2]) if best else ("", None)


def every_path(spec):
    """The responses any path may give (x-lynx-every-path: 404, 405)."""
    return {str(k): deref(spec, v)
            for k, v in (spec.get("x-lynx-every-path") or {}).items()}


def success_status(op):
    codes = sorted(s for s in op["responses"] if str(s).startswith("2"))
    return codes[0] if codes else None


def response_schema(spec, op, status, media="application/json"):
    """(response, schema or None) for status of op; response None when the
    status is not described."""
    resp = op["responses"].get(str(status)) or op["responses"].get(
        f"{str(status)[0]}XX") or op["responses"].get("default")
    if resp is None:
        return None, None
    resp = deref(spec, resp)
    media_obj = (resp.get("content") or {}).get(media)
    return resp, (media_obj or {}).get("schema")


ERROR_SCHEMA = {"$ref": "#/components/schemas/Error"}


def request_schema(spec, op):
    """The JSON schema of op's request body, or None."""
    rb = deref(spec, op.get("requestBody") or {})
    return ((rb.get("content") or {}).get("application/json") or {}).get("schema")


# ---- [c] the examples of docs/api.md -------------------------------------


def curl_routes(spec, sh_lines, bodies):
    """(method, template, operation) of each curl command of a ```sh block;
    appends the JSON bodies they send (-d '...') to bodies."""
    out = []
    text = "\n".join(sh_lines).replace("\\\n", " ")
    for line in text.split("\n"):
        if "curl" not in line:
            continue
        cmd = line[line.index("curl"):]
        m = re.search(r"https?://[^/\s'\"]+(/[^\s'\"|)]*)", cmd)
        if not m:
            continue
        mm = re.search(r"-X\s+([A-Z]+)", cmd)
        method = mm.group(1) if mm else ("POST" if re.search(r"\s-d\s", cmd) else "GET")
        tmpl, op = find_op(spec, method, urllib.parse.urlsplit(m.group(1)).path)
        out.append((method, tmpl if op else m.group(1), op))
        body = re.search(r"\s-d\s+'([^']*)'", cmd)
        if body:
            bodies.append((method, tmpl if op else m.group(1), op, body.group(1)))
    return out


def split_docs(lines):
    """The JSON documents of a ```json block, (status or None, value, text)
    each, and the text that is not JSON. A document may span lines; one
    that starts with a status ("503 {...}") is one line."""
    docs, bad, buf, status = [], [], "", None
    for line in lines:
        s = line.strip()
        if not buf:
            if not s or s.startswith("#"):
                continue
            m = re.match(r"^(\d{3})\s+(.*)$", s)
            status = None
            if m:
                status, s = int(m.group(1)), m.group(2)
        buf = (buf + "\n" + s) if buf else s
        try:
            value = json.loads(buf.replace("[...]", "[]"))
        except ValueError:
            if status is not None:
                bad.append(buf)
                buf = ""
            continue
        docs.append((status, value, buf))
        buf = ""
    if buf:
        bad.append(buf)
    return docs, bad


def check_examples(spec, schemas, api_md):
    part = "c"
    with open(api_md, encoding="utf-8") as f:
        lines = f.read().split("\n")
    heading = ""
    fence = None
    block = []
    last_sh = None  # the lines of the ```sh block just before, if adjacent
    n_docs = n_inline = n_elided = 0

    def heading_routes():
        out = []
        for m, p in re.findall(r"\b(GET|POST|DELETE|PUT|PATCH) (/[^\s,`]*)", heading):
            tmpl, op = find_op(spec, m, p)
            if op is None:
                fail(part, f"heading '{heading}': {m} {p} is not a described operation")
            else:
                out.append((m, tmpl, op))
        return out

    def check_doc(where, status, value, text, cands):
        nonlocal n_elided
        if "[...]" in text:
            n_elided += 1
        if status is not None and not cands:
            # an answer outside a route's section (Errors, Authorisation)
            if str(status) not in every_path(spec) and not any(
                    str(status) in op["responses"] for _, _, op, _ in operations(spec)):
                fail(part, f"{where}: status {status} is described by no operation")
            schema, label = ERROR_SCHEMA, f"Error ({status})"
        elif status is None and not cands:
            if heading.strip("# ") == "Errors":
                schema, label = ERROR_SCHEMA, "Error"
            else:
                fail(part, f"{where}: a JSON example under '{heading}', which names "
                           "no described route and follows no curl of one: cannot "
                           "tell what it documents")
                return
        else:
            found = []
            for m, tmpl, op in cands:
                st = status if status is not None else success_status(op)
                resp, schema = response_schema(spec, op, st)
                if resp is not None:
                    found.append((f"{m} {tmpl} {st}", schema))
            if not found:
                fail(part, f"{where}: status {status} is not described for "
                           f"{', '.join(m + ' ' + t for m, t, _ in cands)}")
                return
            label, schema = found[0]
            if len(found) > 1:  # "GET /healthz, GET /readyz": any of them
                errs = [schemas.errors(s, value) for _, s in found]
                if any(not e for e in errs):
                    ok(part, f"{where}: valid ({' or '.join(l for l, _ in found)})")
                    return
        if schema is None:
            fail(part, f"{where}: {label} has no JSON schema")
            return
        errs = schemas.errors(schema, value)
        if errs:
            for e in errs:
                fail(part, f"{where}: not valid against {label}: {e}")
        else:
            ok(part, f"{where}: valid against {label}")

    def check_bodies():
        nonlocal n_bodies
        for m, t, op, text in bodies:
            n_bodies += 1
            where = f"docs/api.md: the body of curl -X {m} {t}"
            schema = request_schema(spec, op) if op else None
            if schema is None:
                fail(part, f"{where}: the operation takes no JSON body")
                continue
            try:
                value = json.loads(text)
            except ValueError as e:
                fail(part, f"{where}: not JSON: {e}")
                continue
            errs = schemas.errors(schema, value)
            for e in errs:
                fail(part, f"{where}: not valid against its request schema: {e}")
            if not errs:
                ok(part, f"{where}: valid against its request schema")
        bodies.clear()

    bodies = []
    n_bodies = 0
    for i, line in enumerate(lines, 1):
        if fence is None:
            m = re.match(r"^```(\w*)\s*$", line)
            if m:
                fence, block, start = m.group(1), [], i
                continue
            if line.startswith("#"):
                heading = line
                last_sh = None
                continue
            if line.strip():
                last_sh = None  # prose between: the block stands alone
                for st, js in re.findall(r"`(\d{3}) (\{[^`]*\})`", line):
                    n_inline += 1
                    where = f"docs/api.md:{i} (inline {st})"
                    try:
                        value = json.loads(js)
                    except ValueError as e:
                        fail(part, f"{where}: not JSON: {e}")
                        continue
                    check_doc(where, int(st), value, js, heading_routes())
            continue
        if not re.match(r"^```\s*$", line):
            block.append(line)
            continue
        kind, fence = fence, None
        if kind == "sh":
            last_sh = block
            curl_routes(spec, block, bodies)
            check_bodies()
            continue
        if kind != "json":
            last_sh = None
            continue
        docs, bad = split_docs(block)
        for b in bad:
            fail(part, f"docs/api.md:{start}: not JSON: {b[:120]}")
        ctx = curl_routes(spec, last_sh, []) if last_sh else []
        last_sh = None
        for m, t, op in ctx:
            if op is None:
                fail(part, f"docs/api.md:{start}: the curl before it asks {m} {t}, "
                           "which is not a described operation")
        ctx = [c for c in ctx if c[2] is not None]
        n_plain = sum(1 for d in docs if d[0] is None)
        distinct = {(m, t) for m, t, _ in ctx}
        k_plain = 0
        for k, (status, value, text) in enumerate(docs):
            n_docs += 1
            where = f"docs/api.md:{start} (example {k + 1})"
            if not ctx:
                cands = heading_routes()
            elif status is not None or len(distinct) == 1:
                cands = [ctx[0]] if len(distinct) == 1 else ctx
            elif n_plain == len(ctx):
                cands = [ctx[k_plain]]
            else:
                fail(part, f"{where}: {n_plain} answers after {len(ctx)} curl "
                           "commands of different routes: cannot pair them")
                continue
            if status is None:
                k_plain += 1
            if status is None and len(cands) > 1 and ctx:
                fail(part, f"{where}: cannot tell which of several routes it answers")
                continue
            check_doc(where, status, value, text, cands)
    if n_docs < 15:
        fail(part, f"only {n_docs} JSON examples found in docs/api.md: the parser "
                   "no longer understands the file")
    ok(part, f"{n_docs} JSON examples in blocks, {n_inline} inline answers and "
             f"{n_bodies} request bodies checked ({n_elided} with an elided array, "
             "[...], checked as [])")


# ---- [b] a live coordinator --------------------------------------------------


class Live:
    def __init__(self, spec, schemas, url, token, served):
        self.spec, self.schemas, self.served = spec, schemas, served
        u = urllib.parse.urlsplit(url)
        self.host, self.port = u.hostname, u.port or 80
        self.token = token
        self.exercised = set()

    def call(self, method, path, body=None, auth=True, headers=None):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=15)
        h = dict(headers or {})
        if auth and self.token and method in ("POST", "DELETE"):
            h["Authorization"] = "Bearer " + self.token
        if body is not None:
            h["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=body, headers=h)
            r = conn.getresponse()
            data = r.read()
            hdrs = {k.lower(): v for k, v in r.getheaders()}
            return r.status, hdrs, data
        finally:
            conn.close()

    def check(self, method, path, want, body=None, auth=True, why=""):
        """Asks method path; the answer must have status want, be described
        for the operation and validate. Returns the parsed JSON (or None)."""
        part = "b"
        where = f"{method} {path}" + (f" ({why})" if why else "")
        try:
            status, hdrs, data = self.call(method, path, body, auth)
        except OSError as e:
            fail(part, f"{where}: no answer: {e}")
            return None
        tmpl, op = find_op(self.spec, method, path)
        if status != want:
            fail(part, f"{where}: HTTP {status}, want {want}: {data[:300]!r}")
            return None
        if op is not None and body and status < 300:
            rs = request_schema(self.spec, op)
            errs = self.schemas.errors(rs, json.loads(body)) if rs else ["no request schema"]
            for e in errs:
                fail(part, f"{where}: the body the coordinator took is not valid "
                           f"against the described request body: {e}")
        if op is not None:
            self.exercised.add((method, tmpl))
            resp = deref(self.spec, op["responses"].get(str(status)) or {})
            if not resp:
                fail(part, f"{where}: answered {status}, which the spec does not "
                           f"describe for {method} {tmpl}")
                return None
        elif str(status) in every_path(self.spec):
            resp = every_path(self.spec)[str(status)]
        else:
            fail(part, f"{where}: answered {status} on an undescribed operation")
            return None
        for name, h in (resp.get("headers") or {}).items():
            if deref(self.spec, h).get("required") and name.lower() not in hdrs:
                fail(part, f"{where}: no {name} header (described as required)")
        content = resp.get("content") or {}
        ctype = hdrs.get("content-type", "").split(";")[0].strip()
        media = {k.split(";")[0].strip(): v for k, v in content.items()}
        if not content:
            ok(part, f"{where}: {status}")
            return None
        if ctype not in media:
            fail(part, f"{where}: Content-Type {ctype!r}, the spec describes "
                       f"{', '.join(media)}")
            return None
        if ctype != "application/json":
            text = data.decode("utf-8", "replace")
            if ctype == "text/plain" and tmpl == "/metrics":
                samples = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
                badl = [ln for ln in samples if not re.fullmatch(
                    r"[a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})? -?[0-9.eE+-]+|.* (NaN|[+-]Inf)", ln)]
                if not samples or badl:
                    fail(part, f"{where}: not Prometheus text: {badl[:2] or 'no sample'}")
                    return None
            ok(part, f"{where}: {status} {ctype}, {len(data)} bytes")
            return None
        if not data.endswith(b"\n"):
            fail(part, f"{where}: the JSON answer does not end with a newline")
        try:
            value = json.loads(data)
        except ValueError as e:
            fail(part, f"{where}: not JSON ({e}): {data[:200]!r}")
            return None
        schema = media[ctype].get("schema")
        errs = self.schemas.errors(schema, value) if schema else []
        if errs:
            for e in errs[:10]:
                fail(part, f"{where}: not valid against the described schema: {e}")
            return None
        ok(part, f"{where}: {status}, valid")
        return value

    def run(self, node, port, body_max):
        part = "b"
        spec = self.spec
        lists = {}
        for m, path, op, _ in operations(spec):
            if m != "GET" or "{" in path:
                continue
            want = int(success_status(op))
            if (m, norm(path)) not in self.served:
                try:
                    status = self.call(m, path)[0]
                except OSError:
                    status = 0
                if status == 404:
                    note(part, f"GET {path}: 404 and not in routes[] (not merged "
                               "yet): not probed")
                    continue
            q = "?timeout_ms=0" if path == "/v1/watch" else ""
            v = self.check(m, path + q, want)
            if isinstance(v, dict) and isinstance(v.get("items"), list):
                lists[path] = v
                if not v["items"]:
                    fail(part, f"GET {path}: no items: the schema of its items "
                               "was not exercised (the test registers an agent, "
                               "a frontend and a service)")
        # pages
        page = self.check("GET", "/v1/accelerators?limit=1", 200, why="a page")
        if page is not None:
            if "next" not in page:
                fail(part, "GET /v1/accelerators?limit=1: no next with 2 accelerators")
            else:
                self.check("GET", "/v1/accelerators?limit=1&after=" +
                           urllib.parse.quote(page["next"], safe=""), 200, why="next page")
        self.check("GET", "/v1/nodes?limit=1", 200, why="a page")
        self.check("GET", "/v1/nodes?limit=0", 400, why="limit out of range")
        self.check("GET", "/v1/nodes?after=x", 400, why="after without limit")
        self.check("GET", "/v1/watch?since=abc", 400, why="bad since")
        if ("GET", "/v1/events") in self.served:
            self.check("GET", "/v1/events?limit=0", 400, why="limit out of range")
        if ("GET", "/ui/{}") in self.served:
            self.check("GET", "/ui/no-such-file.js", 404, why="unknown file")
        self.check("GET", f"/v1/nodes/{node}", 200)
        self.check("GET", "/v1/nodes/no-such-node", 404)
        self.check("GET", "/v1/no-such-path", 404, why="unknown path")
        self.check("POST", "/v1/nodes", 405, body="", why="wrong method")
        # services
        svc = "openapi-svc"
        body = json.dumps({"name": svc, "port": port, "app": "sockperf-echo",
                           "placement": {"replicas": 1, "selector": {}}})
        if self.token:
            self.check("POST", "/v1/services", 401, body=body, auth=False, why="no token")
        self.check("POST", "/v1/services", 201, body=body)
        self.check("POST", "/v1/services", 409, body=body, why="again")
        self.check("POST", "/v1/services", 400, body='{"name": "x", "port": 1,',
                   why="malformed JSON")
        self.check("POST", "/v1/services", 422,
                   body=json.dumps({"name": "openapi-x", "port": port + 1,
                                    "app": "no-such-app"}), why="unknown app")
        self.check("POST", "/v1/services", 413, body=" " * (body_max + 1),
                   why="body above --body-max")
        self.check("GET", f"/v1/services/{svc}", 200)
        # nodes and frontends
        self.check("POST", f"/v1/nodes/{node}/drain", 200)
        self.check("POST", f"/v1/nodes/{node}/undrain", 200)
        self.check("POST", "/v1/nodes/no-such-node/drain", 404)
        self.check("DELETE", f"/v1/nodes/{node}", 409, why="a ready node")
        fes = (lists.get("/v1/frontends") or {}).get("items") or []
        if fes:
            fe = urllib.parse.quote(fes[0]["id"], safe="")
            self.check("POST", f"/v1/frontends/{fe}/drain", 200)
            self.check("POST", f"/v1/frontends/{fe}/undrain", 200)
        self.check("POST", "/v1/frontends/no-such-fe/undrain", 404)
        self.check("DELETE", f"/v1/services/{svc}", 200)
        self.check("DELETE", f"/v1/services/{svc}", 404, why="again")
        for m, path, _, _ in operations(spec):
            if (m, path) not in self.exercised:
                note(part, f"{m} {path}: not asked of the live coordinator")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", required=True, help="the source tree")
    ap.add_argument("--spec", help="default ROOT/docs/openapi.yaml")
    ap.add_argument("--http-c", help="default ROOT/coordinator/http.c")
    ap.add_argument("--api-md", help="default ROOT/docs/api.md")
    ap.add_argument("--api", help="a live coordinator's API URL")
    ap.add_argument("--token-file")
    ap.add_argument("--node", help="a registered node's id")
    ap.add_argument("--port", type=int, help="a free UDP port for a service")
    ap.add_argument("--body-max", type=int, default=65536)
    a = ap.parse_args()
    spec_path = a.spec or os.path.join(a.root, "docs", "openapi.yaml")
    try:
        with open(spec_path, encoding="utf-8") as f:
            spec = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        fail("d", f"{spec_path}: {e}")
        return 1
    schemas = Schemas(spec)
    if not check_structure(spec, schemas):
        return 1
    routes = c_routes(a.http_c or os.path.join(a.root, "coordinator", "http.c"))
    if not routes:
        fail("a", "no routes[] table found in coordinator/http.c")
        return 1
    served = check_routes(spec, routes)
    check_code(spec, a.root)
    check_examples(spec, schemas, a.api_md or os.path.join(a.root, "docs", "api.md"))
    if a.api:
        token = None
        if a.token_file:
            with open(a.token_file, encoding="utf-8") as f:
                token = f.readline().strip()
        Live(spec, schemas, a.api, token, served).run(a.node, a.port, a.body_max)
    print(f"{failures} check(s) failed" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
