#!/usr/bin/env python3
"""The layering rules of docs/architecture.md §1, checked from the source.

Reads every `crate::`, `super::` and `self::` path in each crate's `src/` and
resolves it to the module (file) it names, then checks:

* no import cycles: two modules that are not one inside the other never use
  each other, directly or around a loop (a parent's `mod.rs` and its own
  children may: that is how Rust declares and re-exports them);
* quic-rdma: `fabric/` and `socket/` use nothing of the QUIC side or the
  drivers above them;
* tools: a channel (`image`, `kv`, `gateway`) uses no other channel.

Prints each violation and exits 1 if there is any. Usage: layering.py [ROOT]
"""

import os
import re
import sys
from collections import defaultdict

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CRATES = {
    "quic-rdma": "quic-rdma/src",
    "tools": "tools/src",
    "quic-rdma-ffi": "quic-rdma-ffi/src",
    "benches": "benches/src",
}

# (crate, module prefix that may not use..., ...these module prefixes, why)
FORBIDDEN = [
    ("quic-rdma", "fabric", ("discovery", "quic", "engine", "quinn_adapter"),
     "the fabric is below the QUIC side (docs/architecture.md §1)"),
    ("quic-rdma", "socket", ("discovery", "quic", "engine", "quinn_adapter"),
     "the socket is below the QUIC side (docs/architecture.md §1)"),
]
CHANNELS = ("image", "kv", "gateway")


def modules(src):
    """Module path (tuple) -> file, for every .rs file under src."""
    mods = {}
    for dirpath, _, files in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        parts = () if rel == "." else tuple(rel.split(os.sep))
        for f in files:
            if not f.endswith(".rs"):
                continue
            stem = f[:-3]
            if stem in ("mod", "lib", "main") and (stem == "mod" or not parts):
                path = parts
            else:
                path = parts + (stem,)
            if parts and parts[0] == "bin":
                continue  # each bin is its own crate root
            mods.setdefault(path, os.path.join(dirpath, f))
    return mods


def strip_comments(text):
    """The code without comments and without the unit tests at its end (a
    test module may use what the module's own code must not)."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.split(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text)[0]


def expand_use(tree):
    """Expand a use tree `a::{b, c::{d, e}}` into flat paths."""
    tree = tree.strip()
    depth, start = 0, None
    for i, ch in enumerate(tree):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                prefix, inner = tree[:start], tree[start + 1:i]
                items, d, cur = [], 0, ""
                for c in inner:
                    if c == "," and d == 0:
                        items.append(cur)
                        cur = ""
                        continue
                    d += c == "{"
                    d -= c == "}"
                    cur += c
                items.append(cur)
                out = []
                for it in items:
                    if it.strip():
                        out.extend(prefix + p for p in expand_use(it))
                return out
    return [re.sub(r"\s+as\s+\w+$", "", tree)]


PATH = re.compile(r"\b(crate|super|self)((?:\s*::\s*\w+)+)")


def paths_in(text):
    text = strip_comments(text)
    found = []
    for m in re.finditer(r"\buse\s+([^;]+);", text):
        found.extend(expand_use(m.group(1)))
    text = re.sub(r"\buse\s+[^;]+;", "", text)
    found.extend(m.group(0) for m in PATH.finditer(text))
    return [re.sub(r"\s+", "", p) for p in found]


def resolve(path, here, mods):
    """The module a path names, from module `here`; None if not in this crate."""
    segs = path.split("::")
    if segs[0] == "crate":
        cur = ()
    elif segs[0] in ("super", "self"):
        cur = here
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                cur = cur[:-1]
            segs = segs[1:]
        segs = ["_"] + segs
    else:
        return None
    for s in segs[1:]:
        if cur + (s,) in mods:
            cur = cur + (s,)
        else:
            break
    return cur


def is_within(a, b):
    return a[: len(b)] == b


def check(crate, src, problems):
    mods = modules(src)
    edges = defaultdict(set)
    for mod, file in mods.items():
        # A file's own module: `mod.rs` files are the directory's module.
        with open(file, encoding="utf-8") as fh:
            text = fh.read()
        for p in paths_in(text):
            tgt = resolve(p, mod, mods)
            if tgt is None or tgt == mod:
                continue
            edges[mod].add((tgt, p))
            for c, low, highs, why in FORBIDDEN:
                if c == crate and is_within(mod, (low,)) and tgt and tgt[0] in highs:
                    problems.append(f"{file}: `{p}`: {why}")
            if crate == "tools" and mod and tgt and mod[0] in CHANNELS and tgt[0] in CHANNELS and mod[0] != tgt[0]:
                problems.append(f"{file}: `{p}`: the channel `{mod[0]}` uses the channel `{tgt[0]}`")
    # Cycles among modules none of which contains another.
    graph = defaultdict(set)
    for a, tg in edges.items():
        for b, _ in tg:
            if not is_within(a, b) and not is_within(b, a):
                graph[a].add(b)
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
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
            if len(comp) > 1:
                sccs.append(comp)

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            strong(v)
    for comp in sccs:
        names = sorted("::".join(m) or "crate" for m in comp)
        detail = []
        for a in comp:
            for b, p in sorted(edges[a]):
                if b in comp and not is_within(a, b) and not is_within(b, a):
                    detail.append(f"{'::'.join(a)} -> {'::'.join(b)} (`{p}`)")
        problems.append(f"{crate}: import cycle among {', '.join(names)}: " + "; ".join(sorted(set(detail))))


def main():
    problems = []
    for crate, src in CRATES.items():
        check(crate, os.path.join(ROOT, src), problems)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} layering violation(s) (docs/architecture.md §1)", file=sys.stderr)
        sys.exit(1)
    print("layering: no cycles, no lower layer using a higher one, no channel using another")


if __name__ == "__main__":
    main()
