#!/usr/bin/env python3
"""Lists the cycles between source files of each crate (issue 22: "no cycle between files").

Usage: scripts/file-cycles.py [CRATE_SRC_DIR...]   (default: every crates/*/src)

A file depends on another when its code (comments left out, `#[cfg(test)] mod tests` left out) names the
other's module path: `crate::a::b`, `super::b`, or `b` inside a `use crate::{...}` group. A module and its
own submodules (`stmt.rs` and `stmt/*.rs`) are one unit for this purpose: a parent declares its children.
Prints each cycle (a strongly connected component of two files or more) with the names one file takes
from the next, and exits 1 when there is one, 0 when there is none.
"""

import os
import re
import sys


def modules(src):
    """Maps module path (a::b) to file path, for every .rs file under src."""
    out = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(root, f), src)[:-3]
            parts = rel.split(os.sep)
            if parts[-1] == "mod":
                parts = parts[:-1]
            if parts in (["lib"], ["main"]):
                continue
            out["::".join(parts)] = os.path.join(root, f)
    return out


def code_of(path):
    text = open(path, encoding="utf-8").read()
    cut = re.search(r"#\[cfg\(test\)\]\s*mod tests", text)
    if cut:
        text = text[: cut.start()]
    return "\n".join(l for l in text.split("\n") if not l.strip().startswith("//"))


def unit(mod):
    """The top-level module a module belongs to: a parent and its children form one unit."""
    return mod.split("::")[0]


def deps(mods):
    edges = {}
    for mod, path in mods.items():
        code = code_of(path)
        me = unit(mod)
        parent = mod.rsplit("::", 1)[0] if "::" in mod else ""
        found = {}
        for target in mods:
            tu = unit(target)
            if tu == me:
                continue
            pats = [r"\bcrate::" + target.replace("::", r"::") + r"\b"]
            if parent == "" and "::" not in target:
                pats.append(r"\bsuper::" + target + r"\b")
            names = set()
            for p in pats:
                for m in re.finditer(p + r"(?:::(\w+))?", code):
                    names.add(m.group(1) or "")
            for g in re.finditer(r"use crate::\{(.*?)\};", code, re.S):
                for m in re.finditer(r"(?<![\w:])" + re.escape(target) + r"(?:::(\w+))?\b", g.group(1)):
                    names.add(m.group(1) or "")
            if names:
                found.setdefault(tu, set()).update(n for n in names if n)
        for tu, names in found.items():
            edges.setdefault(me, {}).setdefault(tu, set()).update(names)
    return edges


def sccs(edges):
    nodes = set(edges) | {t for d in edges.values() for t in d}
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
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
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return [c for c in out if len(c) > 1]


def main():
    dirs = sys.argv[1:] or sorted(
        os.path.join("crates", c, "src") for c in os.listdir("crates") if os.path.isdir(os.path.join("crates", c, "src"))
    )
    cycles = 0
    for src in dirs:
        edges = deps(modules(src))
        for comp in sccs(edges):
            cycles += 1
            print(f"{src}: cycle of {len(comp)} modules: {' '.join(comp)}")
            for a in comp:
                for b in sorted(edges.get(a, {})):
                    if b in comp:
                        names = " ".join(sorted(edges[a][b]))
                        print(f"  {a} -> {b}: {names}")
    if cycles == 0:
        print(f"no cycle between files in {' '.join(dirs)}")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
