#!/usr/bin/env python3
"""check-skips.py BUILD_DIR JUNIT...: the skips of a ctest run, and whether
the allowlist holds them (docs/testing.md, "Skips").

ctest counts a skip (exit 77) as a pass, so a test that cannot run where it
should would hide a failure for good. After each make test goal, this
reads the JUnit files ctest wrote (--output-junit) and prints every skipped
test with the reason it gave (its first line with "SKIP"). With
LYNX_STRICT_SKIPS=1 (CI's .ci/run), it fails (exit 1) when a test skipped
that tests/skips.allow does not hold for this build's flavor (plain,
sanitize, arm64: BUILD_DIR/lynx-test-flavor, written by CMake), or when a
skipped test named nothing that is missing. With LYNX_GPU_HOST=1 (a run on
a GPU host), the allowlist's gpu entries hold nothing: a GPU test that
skips there fails.

tests/skips.allow, one entry a line ('#' starts a comment):
    FLAVOR  KIND  TEST-REGEX  WHY...
FLAVOR is plain, sanitize, arm64 or *; KIND is gpu or - ; TEST-REGEX must
match the whole test name.
"""
import os
import re
import sys
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
FLAVORS = ("plain", "sanitize", "arm64")


def load_allow(path):
    entries = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split(None, 3)
            if len(parts) < 4:
                sys.exit(f"{path}:{n}: want FLAVOR KIND TEST-REGEX WHY")
            flavor, kind, rx, why = parts
            if flavor != "*" and flavor not in FLAVORS:
                sys.exit(f"{path}:{n}: flavor {flavor!r}: want one of "
                         f"{', '.join(FLAVORS)} or *")
            if kind not in ("gpu", "-"):
                sys.exit(f"{path}:{n}: kind {kind!r}: want gpu or -")
            try:
                entries.append((flavor, kind, re.compile(rx), why, n))
            except re.error as e:
                sys.exit(f"{path}:{n}: {rx!r}: {e}")
    return entries


def skips_of(paths):
    """(name, reason or None) of every skipped test, and the count of tests."""
    out, total = [], 0
    for p in paths:
        try:
            root = ET.parse(p).getroot()
        except (OSError, ET.ParseError) as e:
            sys.exit(f"check-skips: cannot read {p}: {e}")
        for tc in root.iter("testcase"):
            total += 1
            if tc.find("skipped") is None:
                continue
            text = tc.findtext("system-out") or ""
            reason = None
            for line in text.splitlines():
                m = re.search(r"\bSKIP:\s*(.*)", line)
                if m and m.group(1).strip():
                    reason = m.group(1).strip()
                    break
            out.append((tc.get("name"), reason))
    return out, total


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__.split("\n\n", 1)[0])
    build, junits = sys.argv[1], sys.argv[2:]
    try:
        with open(os.path.join(build, "lynx-test-flavor"), encoding="utf-8") as f:
            flavor = f.read().strip()
    except OSError as e:
        sys.exit(f"check-skips: {e}: configure {build} first")
    strict = os.environ.get("LYNX_STRICT_SKIPS") == "1"
    gpu_host = os.environ.get("LYNX_GPU_HOST") == "1"
    allow = [e for e in load_allow(os.path.join(HERE, "skips.allow"))
             if e[0] in ("*", flavor) and not (gpu_host and e[1] == "gpu")]
    skips, total = skips_of(junits)
    bad = 0
    print(f"skips: {len(skips)} of {total} tests skipped ({flavor} build"
          f"{', GPU host' if gpu_host else ''}{', strict' if strict else ''})")
    for name, reason in sorted(skips):
        held = next((e for e in allow if e[2].fullmatch(name)), None)
        why = reason or "(named nothing missing)"
        if reason and "runs only with LYNX_TEST_EXTRA=" in reason and not strict:
            verdict = "not asked for (CI asks: LYNX_TEST_EXTRA=host)"
        elif reason is None:
            verdict = "FAIL: a skip must name what is missing"
            bad += 1
        elif held:
            verdict = f"allowed (skips.allow:{held[4]}: {held[3]})"
        else:
            verdict = "NOT on the allowlist (tests/skips.allow)"
            bad += 1
        print(f"  {name}: {why}\n      {verdict}")
    if bad and strict:
        print(f"skips: FAIL: {bad} skip(s) the allowlist does not hold for "
              f"this build ({flavor}): each must run here, or be added to "
              f"tests/skips.allow with the reason", file=sys.stderr)
        return 1
    if bad:
        print(f"skips: {bad} of them would fail CI (LYNX_STRICT_SKIPS=1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
