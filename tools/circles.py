#!/usr/bin/env python3
"""Import circles between source files, from what the compiler emitted.

Each object file of a build defines some global symbols and needs others;
file A depends on file B when A needs a symbol that B defines. A circle is
a set of two or more files that depend on each other in a ring (a strongly
connected component of that graph). Types and macros have no symbols, so a
circle made only of them is not seen here: keep them in headers.

  tools/circles.py [BUILD_DIR]     (default: build; needs nm)

Prints one line per circle (its files, and for each file the names it takes
from the next) and, last, "circles: N". Exits 0 either way.
"""
import collections
import os
import re
import subprocess
import sys


def objects(build):
    for root, _, files in os.walk(build):
        for f in files:
            if f.endswith(".o") and "CMakeFiles" in root:
                yield os.path.join(root, f)


def source_of(build, obj):
    # CMake names objects <dir>/CMakeFiles/<target>.dir/<path from dir>.c.o
    m = re.search(r"^(.*?)/?CMakeFiles/([^/]+)\.dir/(.+)\.o$", os.path.relpath(obj, build))
    if not m:
        return None, obj
    return m.group(2), os.path.join(m.group(1), m.group(3))


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    defs = collections.defaultdict(dict)  # target -> symbol -> source
    needs = collections.defaultdict(dict)  # target -> source -> symbols
    for obj in objects(build):
        target, src = source_of(build, obj)
        if target is None or "/test" in obj or target.startswith(("test_", "fuzz_", "sync_test")):
            continue  # tests and fuzzers are not part of the house
        out = subprocess.run(["nm", obj], capture_output=True, text=True).stdout
        und = set()
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "U":
                und.add(parts[1])
            elif len(parts) == 3 and parts[1] in "TDBRCV":
                defs[target][parts[2]] = src
        needs[target][src] = und
    seen_rings = set()
    rings = []
    for target in sorted(needs):
        graph = collections.defaultdict(dict)
        for src, und in needs[target].items():
            for sym in und:
                to = defs[target].get(sym)
                if to and to != src:
                    graph[src].setdefault(to, set()).add(sym)
        for comp in scc(list(needs[target]), graph):
            key = tuple(sorted(comp))
            if len(comp) > 1 and key not in seen_rings:
                seen_rings.add(key)
                rings.append((key, graph))
    for key, graph in rings:
        print("circle: " + ", ".join(key))
        for a in key:
            for b in key:
                if b in graph.get(a, {}):
                    print("  %s -> %s: %s" % (a, b, ", ".join(sorted(graph[a][b]))))
    print("circles: %d" % len(rings))


def scc(nodes, graph):
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in nodes:
        if v not in index:
            visit(v)
    return out


if __name__ == "__main__":
    main()
