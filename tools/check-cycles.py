#!/usr/bin/env python3
"""check-cycles.py - fail when source files call each other in a circle.

Usage: tools/check-cycles.py BUILD_DIR [--graph]

Reads every object file CMake built under BUILD_DIR for the project's own
targets (the tests' and the fuzz harnesses' objects are left out: they
compile daemon sources beside fakes on purpose), takes from `nm` the
global symbols each defines and the ones it leaves undefined, and draws an
arrow from file A to file B when A uses a symbol B defines: "A calls B"
(a function, or a variable it reads or writes). The files must form a DAG
(HACKING.md, "Layering"): a strongly connected component of more than
one file is a circle, printed with the symbols on each of its arrows, and
the exit status is 1. --graph prints every arrow instead.

Objects left from an earlier layout of the tree (a file since moved or
split, in a build directory used before) are not read: an object counts
when its source still exists and is not newer than the object.

A symbol defined in more than one file (the CUDA backend and its stand-in
built without CUDA, cuda_none.c) gives an arrow to each. Calls through
function pointers are not arrows: they are how a lower layer hands events
up (a callback registered at creation), which is the point.
"""
import os
import subprocess
import sys
from collections import defaultdict

DEFINED = set("TDBRCVWGSi")  # text, data, bss, rodata, common, weak, small


def source_of(build, obj):
    """build/DIR/CMakeFiles/TARGET.dir/REL.o -> DIR/REL (a source path).

    A source outside the target's directory is REL with each ".." written
    "__" by CMake (tools/gpu-probe.cu of accel/cuda/'s target). None for
    what is not a target's object, or a target of tests/."""
    rel = os.path.relpath(obj, build)
    head, _, tail = rel.partition("CMakeFiles" + os.sep)
    if not tail or not head:
        return None  # no target's (CMake's own probes)
    if head.split(os.sep, 1)[0] in ("tests", "_deps"):
        return None
    tail = tail.split(os.sep, 1)[1] if os.sep in tail else tail
    parts = [".." if p == "__" else p for p in tail[:-2].split(os.sep)]
    return os.path.normpath(os.path.join(head, *parts))


def skipped(src):
    top = src.split(os.sep, 1)[0]
    return top in ("tests", "_deps", "..") or src.startswith("CMakeFiles")


def symbols(obj):
    out = subprocess.run(["nm", "-P", "-A", obj], capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"check-cycles: nm {obj}: {out.stderr.strip()}")
    defs, undefs = set(), set()
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        name, kind = parts[1], parts[2]
        if kind == "U":
            undefs.add(name)
        elif kind in DEFINED:
            defs.add(name)
    return defs, undefs


def tarjan(nodes, edges):
    index, low, on, stack, comps, n = {}, {}, set(), [], [], [0]

    def visit(v):
        work = [(v, iter(sorted(edges[v])))]
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            u, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = n[0]
                    n[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on:
                    low[u] = min(low[u], index[w])
            else:
                work.pop()
                if work:
                    p = work[-1][0]
                    low[p] = min(low[p], low[u])
                if low[u] == index[u]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == u:
                            break
                    comps.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return comps


def main():
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    build = sys.argv[1]
    graph = "--graph" in sys.argv[2:]
    objs = []
    for root, dirs, files in os.walk(build):
        # a build tree nested in this one (the fuzz harnesses' clang build)
        # is another build of the same sources: not read
        dirs[:] = [d for d in dirs if not os.path.isfile(
            os.path.join(root, d, "CMakeCache.txt"))]
        if "CMakeFiles" not in root:
            continue
        objs += [os.path.join(root, f) for f in files if f.endswith(".o")]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    defs_of, undefs_of, definer = {}, {}, defaultdict(set)
    stale = []
    for obj in sorted(objs):
        src = source_of(build, obj)
        if src is None or skipped(src):
            continue
        path = next((p for p in (os.path.join(root, src),
                                 os.path.join(build, src))
                     if os.path.isfile(p)), None)
        if path is None or os.path.getmtime(path) > os.path.getmtime(obj):
            stale.append(src)  # its source moved, or it was not rebuilt
            continue
        d, u = symbols(obj)
        defs_of.setdefault(src, set()).update(d)
        undefs_of.setdefault(src, set()).update(u)
    if not defs_of:
        print(f"check-cycles: no object files under {build} (build it first)",
              file=sys.stderr)
        return 2
    for src, d in defs_of.items():
        for s in d:
            definer[s].add(src)
    edges, why = defaultdict(set), defaultdict(set)
    for src, u in undefs_of.items():
        for s in u:
            for dst in definer.get(s, ()):
                if dst != src:
                    edges[src].add(dst)
                    why[(src, dst)].add(s)
    nodes = set(defs_of)
    if graph:
        for a in sorted(edges):
            for b in sorted(edges[a]):
                print(f"{a} -> {b}: {' '.join(sorted(why[(a, b)]))}")
        return 0
    circles = [c for c in tarjan(nodes, edges) if len(c) > 1]
    for c in circles:
        print("check-cycles: these files call each other in a circle:")
        members = set(c)
        for a in c:
            for b in sorted(edges[a] & members):
                syms = sorted(why[(a, b)])
                shown = " ".join(syms[:6]) + (" ..." if len(syms) > 6 else "")
                print(f"  {a} -> {b}: {shown}")
    n_edges = sum(len(v) for v in edges.values())
    print(f"check-cycles: {len(nodes)} files, {n_edges} arrows, "
          f"{len(circles)} circle(s)" +
          (f"; {len(stale)} stale object(s) not read (build first): "
           f"{' '.join(sorted(set(stale))[:8])}" if stale else ""))
    return 1 if circles else 0


if __name__ == "__main__":
    sys.exit(main())
