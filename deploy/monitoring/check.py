#!/usr/bin/env python3
"""check.py - checks of deploy/monitoring/ beyond what promtool checks.

  check.py rules RULES.yml DOCS.md
      every alerting rule has alert, expr, for, labels.severity (page or
      ticket), annotations summary, description and runbook_url, and the
      runbook_url is docs/operations.md#ANCHOR with ANCHOR a heading of
      DOCS.md (the runbook). Needs python3-yaml.
  check.py dashboard DASH.json RULES_OUT.yml
      the Grafana dashboard's structure (schemaVersion 36 or later, a
      Prometheus datasource variable that every panel uses, the service and
      node variables from label_values, the rows Cluster, Requests,
      Accelerators, Failures) and every variable its queries use is
      defined; writes each query, the variables replaced by what Grafana
      would put there, as a recording rule into RULES_OUT.yml, for
      `promtool check rules` to parse as PromQL.
  check.py names SCRAPE... -- FILE...
      every metric name (lynx_...) the expressions of FILE (a dashboard
      .json, or a rules .yml) use is exported by one of the SCRAPEs
      (/metrics bodies): a sample name, histograms' _bucket, _sum, _count
      included.
  check.py exposition SCRAPE...
      the text format's grouping rules, which promtool does not check: a
      family's HELP and TYPE come before its samples, all its samples form
      one group, no series appears twice.
  check.py histogram SCRAPE NAME [COUNTER]
      every series of histogram NAME is cumulative (bucket counts do not
      decrease as le grows), has a +Inf bucket equal to its _count; with
      COUNTER, _count equals COUNTER's sample with the same labels.

Exit status 0 when the check passes, 1 with the reasons on stderr.
"""
import json
import math
import re
import sys

NAME_RE = re.compile(r"\blynx_[a-z0-9_]+")
SEVERITIES = ("page", "ticket")
RUNBOOK_RE = re.compile(r"^docs/operations\.md#([a-z0-9_-]+)$")


def fail(errors):
    """Prints errors and exits 1 when there are any."""
    for e in errors:
        print("check.py: " + e, file=sys.stderr)
    if errors:
        sys.exit(1)


def load_yaml(path):
    try:
        import yaml
    except ImportError:
        print("check.py: python3-yaml is needed to read " + path, file=sys.stderr)
        sys.exit(2)
    with open(path) as f:
        return yaml.safe_load(f)


def anchors(md_path):
    """GitHub's anchors of the headings of a Markdown file."""
    out = set()
    fence = False
    with open(md_path) as f:
        for line in f:
            if line.startswith("```"):
                fence = not fence
            if fence:
                continue
            m = re.match(r"^#{1,6}\s+(.*?)\s*$", line)
            if not m:
                continue
            text = re.sub(r"[`*_]", "", m.group(1)).strip().lower()
            slug = re.sub(r"[^a-z0-9 -]", "", text).replace(" ", "-")
            out.add(slug)
    return out


def alert_rules(doc):
    for g in doc.get("groups") or []:
        for r in g.get("rules") or []:
            if "alert" in r:
                yield g.get("name", "?"), r


# ---- rules ----------------------------------------------------------------

def cmd_rules(rules_path, docs_path):
    doc = load_yaml(rules_path)
    errors = []
    if not isinstance(doc, dict) or not doc.get("groups"):
        fail([rules_path + ": no groups"])
    have = anchors(docs_path)
    n = 0
    for g, r in alert_rules(doc):
        n += 1
        who = "%s: group %s: alert %s" % (rules_path, g, r.get("alert"))
        for k in ("expr", "for"):
            if not str(r.get(k, "")).strip():
                errors.append(who + ": no " + k)
        labels = r.get("labels") or {}
        if labels.get("severity") not in SEVERITIES:
            errors.append(who + ": labels.severity is %r, want one of %s"
                          % (labels.get("severity"), "|".join(SEVERITIES)))
        ann = r.get("annotations") or {}
        for k in ("summary", "description", "runbook_url"):
            if not str(ann.get(k, "")).strip():
                errors.append(who + ": no annotations." + k)
        url = str(ann.get("runbook_url", ""))
        m = RUNBOOK_RE.match(url)
        if url and not m:
            errors.append(who + ": runbook_url %r is not docs/operations.md#<anchor>" % url)
        elif m and m.group(1) not in have:
            errors.append(who + ": runbook_url %r: %s has no heading with anchor #%s"
                          % (url, docs_path, m.group(1)))
    if n == 0:
        errors.append(rules_path + ": no alerting rule")
    fail(errors)
    print("%s: %d alerting rules, each with expr, for, severity, summary, "
          "description and a runbook in %s" % (rules_path, n, docs_path))


# ---- dashboard ----------------------------------------------------------------

# what the variables become when the queries are parsed
GRAFANA_VARS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}


def panels_of(dash):
    for p in dash.get("panels") or []:
        yield p
        for q in p.get("panels") or []:  # a collapsed row's
            yield q


def dashboard_exprs(dash):
    """(where, expression) of every query: panels' targets, and the metric
    of each label_values() variable."""
    out = []
    for p in panels_of(dash):
        for t in p.get("targets") or []:
            if t.get("expr"):
                out.append(("panel %r target %s" % (p.get("title"), t.get("refId")), t["expr"]))
    for v in (dash.get("templating") or {}).get("list") or []:
        if v.get("type") != "query":
            continue
        q = v.get("query")
        if isinstance(q, dict):
            q = q.get("query")
        m = re.match(r"^\s*label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$", q or "")
        if m:
            out.append(("variable %s" % v.get("name"), m.group(1)))
        elif q:
            out.append(("variable %s" % v.get("name"), q))
    return out


def cmd_dashboard(path, rules_out):
    with open(path) as f:
        dash = json.load(f)
    errors = []
    if not isinstance(dash.get("schemaVersion"), int) or dash["schemaVersion"] < 36:
        errors.append("schemaVersion %r, want 36 or later" % dash.get("schemaVersion"))
    variables = {v.get("name"): v for v in (dash.get("templating") or {}).get("list") or []}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        errors.append("no variable 'datasource' of type datasource, query prometheus")
    for name in ("service", "node"):
        v = variables.get(name)
        q = v.get("query") if v else None
        if isinstance(q, dict):
            q = q.get("query")
        if not v or v.get("type") != "query" or not re.match(r"^\s*label_values\(", q or ""):
            errors.append("no variable %r from label_values(...)" % name)
    rows = [p.get("title") for p in dash.get("panels") or [] if p.get("type") == "row"]
    for want in ("Cluster", "Requests", "Accelerators", "Failures"):
        if want not in rows:
            errors.append("no row %r (rows: %s)" % (want, rows))
    for p in panels_of(dash):
        if p.get("type") == "row":
            continue
        for obj in [p] + (p.get("targets") or []):
            d = obj.get("datasource")
            if not isinstance(d, dict) or d.get("uid") != "${datasource}":
                errors.append("panel %r: datasource %r, want uid ${datasource}" % (p.get("title"), d))
                break
        if not p.get("targets"):
            errors.append("panel %r: no query" % p.get("title"))
    exprs = dashboard_exprs(dash)
    lines = ["# generated by deploy/monitoring/check.py from %s: its queries" % path,
             "groups:", "  - name: dashboard", "    rules:"]

    def subst(where, expr):
        def one(m):
            name = m.group(1) or m.group(2)
            if name in GRAFANA_VARS:
                return GRAFANA_VARS[name]
            if name in variables and name != "datasource":
                return ".*"
            errors.append("%s: variable $%s is not defined" % (where, name))
            return m.group(0)
        return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::[a-z]+)?\}|\$([A-Za-z_][A-Za-z0-9_]*)", one, expr)

    for i, (where, expr) in enumerate(exprs):
        lines.append("      # " + where.replace("\n", " "))
        lines.append("      - record: dashboard:query_%d" % i)
        lines.append("        expr: " + json.dumps(subst(where, expr)))
    if not exprs:
        errors.append("no query at all")
    fail(errors)
    with open(rules_out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("%s: schemaVersion %d, rows %s, %d queries written to %s"
          % (path, dash["schemaVersion"], ", ".join(rows), len(exprs), rules_out))


# ---- scrapes ---------------------------------------------------------------------

SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?\s*$")
LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')


def parse_labels(text):
    out = []
    pos = 0
    text = text or ""
    while pos < len(text):
        m = LABEL_RE.match(text, pos)
        if not m:
            raise ValueError("bad label set {%s}" % text)
        out.append((m.group(1), m.group(2)))
        pos = m.end()
    return tuple(out)


def parse_scrape(path):
    """[(kind, name, labels, value, line_no)], kind 'help'/'type'/'sample'."""
    out = []
    with open(path) as f:
        for no, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            if line.startswith("#"):
                m = re.match(r"^#\s+(HELP|TYPE)\s+(\S+)\s*(.*)$", line)
                if m:
                    out.append((m.group(1).lower(), m.group(2), m.group(3), None, no))
                continue
            m = SAMPLE_RE.match(line)
            if not m:
                raise ValueError("%s:%d: not a sample: %r" % (path, no, line))
            out.append(("sample", m.group(1), parse_labels(m.group(3)), float(m.group(4)), no))
    return out


def family_of(name, types):
    if name in types:
        return name
    for suf in ("_bucket", "_sum", "_count"):
        base = name[: -len(suf)]
        if name.endswith(suf) and types.get(base) in ("histogram", "summary"):
            return base
    return name


def cmd_names(scrapes, files):
    have = set()
    for s in scrapes:
        for kind, name, _, _, _ in parse_scrape(s):
            have.add(name)
    errors = []
    n = 0
    for path in files:
        if path.endswith(".json"):
            with open(path) as f:
                exprs = dashboard_exprs(json.load(f))
        else:
            doc = load_yaml(path)
            exprs = []
            for g in doc.get("groups") or []:
                for r in g.get("rules") or []:
                    exprs.append(("rule " + str(r.get("alert") or r.get("record")), str(r.get("expr", ""))))
        for where, expr in exprs:
            for name in sorted(set(NAME_RE.findall(expr))):
                n += 1
                if name not in have:
                    errors.append("%s: %s: %s is in no scrape" % (path, where, name))
    fail(errors)
    print("%d uses of %d lynx_ metric names in %s: all exported" % (
        n, len({x for x in have if x.startswith("lynx_")}), ", ".join(files)))


def cmd_exposition(scrapes):
    errors = []
    for path in scrapes:
        items = parse_scrape(path)
        types = {name: rest.split()[0] for kind, name, rest, _, _ in items if kind == "type" and rest}
        done = set()     # families whose group has ended
        current = None   # the family of the group being read
        seen = set()
        nfam = 0
        for kind, name, labels, _, no in items:
            fam = family_of(name, types) if kind == "sample" else name
            if fam != current:
                if current is not None:
                    done.add(current)
                if fam in done:
                    errors.append("%s:%d: %s %s after its family's group ended (another family came between)"
                                  % (path, no, "sample of" if kind == "sample" else kind.upper() + " of", fam))
                current = fam
                nfam += 1
            if kind == "sample":
                if fam not in types:
                    errors.append("%s:%d: sample of %s before (or without) its TYPE line" % (path, no, fam))
                key = (name, tuple(sorted(labels)))
                if key in seen:
                    errors.append("%s:%d: series %s%s appears twice" % (path, no, name, dict(labels)))
                seen.add(key)
        if not errors:
            print("%s: %d families, %d series, each family in one group" % (path, len(types), len(seen)))
    fail(errors)


def le_value(v):
    return math.inf if v == "+Inf" else float(v)


def cmd_histogram(path, name, counter=None):
    items = [x for x in parse_scrape(path) if x[0] == "sample"]
    buckets, counts, totals = {}, {}, {}
    for _, n, labels, v, _ in items:
        if n == name + "_bucket":
            rest = tuple(sorted(l for l in labels if l[0] != "le"))
            le = dict(labels).get("le")
            buckets.setdefault(rest, []).append((le_value(le), v))
        elif n == name + "_count":
            counts[tuple(sorted(labels))] = v
        elif counter and n == counter:
            totals[tuple(sorted(labels))] = v
    errors = []
    if not buckets:
        errors.append("%s: no %s_bucket sample" % (path, name))
    for rest, bs in sorted(buckets.items()):
        who = "%s: %s%s" % (path, name, dict(rest))
        bs.sort()
        prev = -1.0
        for le, v in bs:
            if v < prev:
                errors.append("%s: bucket le=%g holds %d, less than the bucket below (%d): not cumulative"
                              % (who, le, v, prev))
            prev = v
        if not bs or bs[-1][0] != math.inf:
            errors.append(who + ": no +Inf bucket")
            continue
        c = counts.get(rest)
        if c is None:
            errors.append(who + ": no _count")
        elif c != bs[-1][1]:
            errors.append("%s: +Inf bucket %d != _count %d" % (who, bs[-1][1], c))
        if counter:
            t = totals.get(rest)
            if t is None:
                errors.append("%s: no %s%s to compare _count with" % (who, counter, dict(rest)))
            elif c is not None and t != c:
                errors.append("%s: _count %d != %s %d" % (who, c, counter, t))
        if not errors:
            print("%s: %d buckets, cumulative, +Inf = _count = %d%s"
                  % (who, len(bs), c, (" = " + counter) if counter else ""))
    fail(errors)


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, args = argv[1], argv[2:]
    if cmd == "rules" and len(args) == 2:
        cmd_rules(*args)
    elif cmd == "dashboard" and len(args) == 2:
        cmd_dashboard(*args)
    elif cmd == "names" and "--" in args:
        i = args.index("--")
        cmd_names(args[:i], args[i + 1:])
    elif cmd == "exposition" and args:
        cmd_exposition(args)
    elif cmd == "histogram" and len(args) in (2, 3):
        cmd_histogram(*args)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
