#!/usr/bin/env python3
"""Module import cycles inside each crate.

Usage: .ci/import-cycles.py quic-rdma/src tools/src benches/src quic-rdma-ffi/src

An edge A -> B is any `crate::`/`super::` path in A's file (comments and the
trailing `#[cfg(test)] mod tests` left out) that resolves to B's file; a
module's own ancestors and descendants do not count. Prints every strongly
connected set of two or more modules and exits 1 if there is one. A textual
approximation of `cargo modules dependencies --acyclic`, which is not
installed here.
"""
import os, re, sys, itertools
def modpath(root, f):
    rel = os.path.relpath(f, root)[:-3].split('/')
    if rel[-1] in ('mod', 'lib', 'main'): rel = rel[:-1]
    return rel
def crate_mods(root):
    mods = {}
    for d,_,fs in os.walk(root):
        for f in fs:
            if f.endswith('.rs'):
                p=os.path.join(d,f); mods[tuple(modpath(root,p))]=p
    return mods
def resolve(mods, cur, path):
    # longest prefix that is a module
    for n in range(len(path),0,-1):
        if tuple(path[:n]) in mods: return tuple(path[:n])
    return None
def edges(root, bin_root=False):
    mods = crate_mods(root); E=set()
    for m,p in mods.items():
        src=open(p).read()
        # drop test modules roughly: cut at '#[cfg(test)]\nmod tests'
        src=re.split(r'#\[cfg\(test\)\]\s*mod tests', src)[0]
        src=re.sub(r'//[^\n]*', '', src)
        for mt in re.finditer(r'\b(crate|super)((?:::\w+)+)', src):
            kind, rest = mt.group(1), mt.group(2).split('::')[1:]
            if kind=='crate': base=[]
            else:
                is_mod_rs = p.endswith(('mod.rs','lib.rs','main.rs'))
                base=list(m) if is_mod_rs else list(m[:-1])
                while rest and rest[0]=='super': rest=rest[1:]; base=base[:-1]
            # group imports: crate::{a, b::c}
            tgt = resolve(mods, m, base+rest)
            if tgt is not None and tgt!=m and tgt!=() and not (m[:len(tgt)]==tgt) :
                E.add((m,tgt))
        for mt in re.finditer(r'\b(crate|super)::\{([^}]*)\}', src):
            kind=mt.group(1)
            if kind=='crate': base=[]
            else:
                is_mod_rs = p.endswith(('mod.rs','lib.rs','main.rs'))
                base=list(m) if is_mod_rs else list(m[:-1])
            for item in mt.group(2).split(','):
                item=item.strip().split(' as ')[0]
                if not item: continue
                tgt=resolve(mods,m,base+item.split('::'))
                if tgt is not None and tgt!=m and tgt!=() and not (m[:len(tgt)]==tgt): E.add((m,tgt))
    return E
def cycles(E):
    out=set()
    for a,b in E:
        if (b,a) in E and a<b: out.add((a,b))
    return out
def sccs(E):
    g={}
    for a,b in E: g.setdefault(a,set()).add(b); g.setdefault(b,set())
    idx={}; low={}; st=[]; on=set(); res=[]; c=[0]
    sys.setrecursionlimit(10000)
    def sc(v):
        idx[v]=low[v]=c[0]; c[0]+=1; st.append(v); on.add(v)
        for w in g[v]:
            if w not in idx: sc(w); low[v]=min(low[v],low[w])
            elif w in on: low[v]=min(low[v],idx[w])
        if low[v]==idx[v]:
            comp=[]
            while True:
                w=st.pop(); on.discard(w); comp.append(w)
                if w==v: break
            if len(comp)>1: res.append(comp)
    for v in list(g):
        if v not in idx: sc(v)
    return res
found = False
for root in sys.argv[1:]:
    E=edges(root)
    for a,b in sorted(cycles(E)): print(f"{root}: {'::'.join(a)} <-> {'::'.join(b)}")
    for comp in sccs(E):
        found = True
        print(f"{root}: SCC {sorted('::'.join(x) for x in comp)}")
sys.exit(1 if found else 0)
