#!/usr/bin/env python3
"""Finds import circles between the modules of Rust crates. Part of `make lint`.

Every path a module names (`crate::a::b`, `super::x`, `self::x`, or a child module's
name, `x::...`), in a `use` or inline, is an edge from that module to the module the
path lands in (the longest prefix that is a module file). `mod x;` declarations are
not edges; test code is left out (`#[cfg(test)]` modules, inline or in their own
files, and `tests/` directories). A circle is a strongly connected component of more
than one module; each is printed with its edges, and any circle fails the check.

    scripts/import-cycles.py agent/src              one crate's modules
    scripts/import-cycles.py --depth 1 agent/src    modules merged into their top level
    scripts/import-cycles.py agent/src other/src    several crates, each on its own

A circle that is justified says so in a comment on one of its imports; list the
crate's root here with the circle's modules in ALLOWED when one ever is.
"""
import os
import re
import sys

IDENT = r'[A-Za-z_][A-Za-z0-9_]*'
# Circles justified in a comment at the import, as (crate root, modules): none.
ALLOWED = set()


def strip_tests(text):
    """Drops inline `#[cfg(test)] mod x { ... }` blocks."""
    out, i = [], 0
    pattern = r'#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{'
    for m in re.finditer(pattern, text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {'{': 1, '}': -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return ''.join(out)


def expand_groups(text):
    """`use a::{b, c::d}` -> `a::b a::c::d`, nested groups included."""
    def repl(m):
        items = [s.strip() for s in m.group(2).split(',') if s.strip()]
        return ' '.join(m.group(1) + '::' + it.split(' as ')[0] for it in items)
    group = r'((?:' + IDENT + r'::)*' + IDENT + r')::\{([^{}]*)\}'
    while re.search(group, text):
        text = re.sub(group, repl, text)
    return text


def modules(src):
    """Module path -> file, without test-only modules."""
    found = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith('.rs'):
                continue
            path = os.path.join(root, f)
            rel = os.path.relpath(path, src)[:-3].split(os.sep)
            if 'tests' in rel[:-1] or rel == ['main']:
                continue
            if rel[-1] in ('mod', 'lib'):
                rel = rel[:-1]
            found['::'.join(rel)] = path
    test_only = set()
    for name, path in found.items():
        for m in re.finditer(r'#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;',
                             open(path).read()):
            test_only.add((name + '::' if name else '') + m.group(1))
    return {n: p for n, p in found.items()
            if not any(n == t or n.startswith(t + '::') for t in test_only)}


def edges(mods, depth):
    def landing(parts):
        for i in range(len(parts), 0, -1):
            name = '::'.join(parts[:i])
            if name in mods:
                return name
        return None

    def trunc(name):
        return '::'.join(name.split('::')[:depth])

    out = {}
    for name, path in mods.items():
        here = name.split('::') if name else []
        children = {k.split('::')[-1] for k in mods
                    if k and '::'.join(k.split('::')[:-1]) == name}
        text = open(path).read()
        text = re.sub(r'//[^\n]*', '', text)
        text = strip_tests(text)
        text = re.sub(r'\bmod\s+\w+\s*;', '', text)
        text = expand_groups(text)
        for m in re.finditer(r'(?<![A-Za-z0-9_:])((?:' + IDENT + r'::)+' + IDENT + ')', text):
            parts = m.group(1).split('::')
            if parts[0] == 'crate':
                target = parts[1:]
            elif parts[0] == 'self':
                target = here + parts[1:]
            elif parts[0] == 'super':
                base = here
                while parts and parts[0] == 'super':
                    base, parts = base[:-1], parts[1:]
                target = base + parts
            elif parts[0] in children:
                target = here + parts
            else:
                continue
            lands = landing(target)
            if not lands:
                continue
            a, b = trunc(name), trunc(lands)
            if a and b and a != b:
                out.setdefault(a, set()).add(b)
    nodes = sorted({trunc(n) for n in mods if n})
    return nodes, out


def circles(nodes, graph):
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, on, stack, found, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in nodes:
        if v not in index:
            visit(v)
    return found


def main(argv):
    depth = 99
    if len(argv) > 1 and argv[0] == '--depth':
        depth, argv = int(argv[1]), argv[2:]
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    failed = False
    for src in argv:
        nodes, graph = edges(modules(src), depth)
        found = [c for c in circles(nodes, graph) if (src, tuple(c)) not in ALLOWED]
        for comp in found:
            failed = True
            print(f'{src}: import circle: {" ".join(comp)}')
            for a in comp:
                inside = sorted(b for b in graph.get(a, ()) if b in comp)
                print(f'    {a} -> {" ".join(inside)}')
        if not found:
            print(f'{src}: {len(nodes)} modules, no import circle')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
