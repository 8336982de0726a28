#!/usr/bin/env python3
"""Import circles between the modules of a crate: `scripts/module-cycles.py host/controller/src`.

A module is a file (`foo.rs`, or `foo/mod.rs` for `foo`); it depends on every module of the
crate its code names (`crate::a::b`, `use crate::{a, b::c}`, `super::x`), its own
submodules excepted. Prints each strongly connected group of more than one module and
exits 1 if there is any.
"""
import os, re, sys

args = [a for a in sys.argv[1:] if not a.startswith("-")]
root = args[0] if args else "host/controller/src"
modules = {}
for dirpath, _, files in os.walk(root):
    for f in files:
        if not f.endswith(".rs"):
            continue
        rel = os.path.relpath(os.path.join(dirpath, f), root)[:-3].split(os.sep)
        if rel[-1] == "mod":
            rel = rel[:-1]
        if rel in (["lib"], ["main"]):
            rel = []
        modules["::".join(rel)] = open(os.path.join(dirpath, f)).read()

def strip(src):
    src = re.sub(r"//[^\n]*", "", src)             # comments, doc comments (links are not dependencies)
    src = re.sub(r'"(\\.|[^"\\])*"', '""', src)     # strings
    return re.sub(r"#\[cfg\(test\)\]\s*mod tests\s*\{.*", "", src, flags=re.S)  # unit tests may look anywhere

def expand(prefix, body):
    """`a::{b, c::{d, e}}` -> a::b, a::c::d, a::c::e"""
    out, depth, cur = [], 0, ""
    for ch in body + ",":
        if ch == "{": depth += 1
        if ch == "}": depth -= 1
        if ch == "," and depth == 0:
            cur = cur.strip()
            m = re.match(r"^([\w:]*?)::\{(.*)\}$", cur, re.S)
            if m:
                out += expand(prefix + [p for p in m.group(1).split("::") if p], m.group(2))
            elif cur:
                out.append(prefix + cur.split(" as ")[0].strip().split("::"))
            cur = ""
        else:
            cur += ch
    return out

def resolve(path):
    """The longest module name that `path` starts with."""
    for n in range(len(path), -1, -1):
        name = "::".join(path[:n])
        if name in modules:
            return name
    return ""

# What the crate root re-exports (`pub use a::b::{X, Y};`) is named as `crate::X`: it
# depends on where X is defined.
reexports = {}
for g in re.finditer(r"pub use ((?:\w+::)*)\{?([\w, ]+)\}?;", modules.get("", "")):
    for name in g.group(2).split(","):
        name = name.strip()
        if name:
            reexports[name] = [p for p in g.group(1).split("::") if p]

deps = {m: set() for m in modules}
for m, src in modules.items():
    src = strip(src)
    me = m.split("::") if m else []
    paths = []
    for g in re.finditer(r"\b(crate|super)((?:::\w+)*)(::\{)?", src):
        base = (me[:-1] if g.group(1) == "super" else []) + [p for p in g.group(2).split("::") if p]
        if g.group(3):
            # `crate::a::{b, c::{d}}`: the group up to its closing brace.
            depth, k = 1, g.end()
            while depth and k < len(src):
                depth += {"{": 1, "}": -1}.get(src[k], 0)
                k += 1
            paths += expand(base, src[g.end():k - 1])
        else:
            paths.append(base)
    for p in paths:
        p = [x for x in p if x and x != "self"]
        if p and p[0] in reexports:
            p = reexports[p[0]] + p
        target = resolve(p)
        # A module's own submodules and ancestors are its structure, not a dependency.
        if target and target != m and not target.startswith(m + "::") and not (m.startswith(target + "::") or target == ""):
            deps[m].add(target)

# Tarjan's strongly connected components.
index, low, stack, on, groups, n = {}, {}, [], set(), [], [0]
def visit(v):
    index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
    for w in deps[v]:
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        group = []
        while True:
            w = stack.pop(); on.discard(w); group.append(w)
            if w == v: break
        if len(group) > 1:
            groups.append(sorted(group))
sys.setrecursionlimit(10000)
for v in sorted(deps):
    if v not in index:
        visit(v)
for g in groups:
    print("import circle:", " <-> ".join(g))
    for a in g:
        print(f"  {a or 'lib'} -> {', '.join(sorted(d for d in deps[a] if d in g))}")
if "-v" in sys.argv:
    for m in sorted(deps):
        print(f"{m or 'lib'} -> {', '.join(sorted(deps[m]))}")
print(f"{len(modules)} modules, {sum(map(len, deps.values()))} dependencies, {len(groups)} circles")
sys.exit(1 if groups else 0)
