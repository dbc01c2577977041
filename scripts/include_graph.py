#!/usr/bin/env python3
"""include_graph.py: the engine's and the kernels' import graph, and its circles.

    python3 scripts/include_graph.py                 # every unit's arrows, then the circles
    python3 scripts/include_graph.py --check engine kernels/cpu
                                                     # exit 1 when a circle lies in those folders

A unit is a .c (or .cu) file and its .h (engine/op.c + engine/op.h); a header
without a source of its own (engine/ops.h, kernels/backend.h) is a unit alone.
Unit A has an arrow to unit B when a file of A
  - includes a header of B (#include "..."), or
  - calls a function, or names a variable, that B alone defines (and a header
    declares): engine/ops.h declares what engine/ops_math.c, ops_create.c, ...
    define, so a file that calls mp_binary depends on ops_math.c whatever header
    it read. Taking a function's address (a backend's table of entries) is no
    arrow: the table is what registers its kernels.
    Of a header, only its macros and inline functions' bodies are read for these
    names, not its declarations.
A circle is a strongly connected component of more than one unit (or a unit
that reaches itself). Standard library only; reads engine/ and kernels/.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ("engine", "kernels")
SOURCES = (".c", ".cu", ".cc")
HEADERS = (".h",)
KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "do", "else", "case", "defined"}


def strip(text):
    """the code without comments, strings and character constants"""
    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'',
                  lambda m: "\n" * m.group(0).count("\n") if m.group(0)[0] == "/" else '""',
                  text, flags=re.S)


def files():
    for top in FOLDERS:
        for d, _, names in os.walk(os.path.join(ROOT, top)):
            for n in sorted(names):
                if n.endswith(SOURCES + HEADERS):
                    yield os.path.relpath(os.path.join(d, n), ROOT)


def unit_of(path):
    return os.path.splitext(path)[0]


def definitions(code):
    """the names a source defines at file scope for other files: its functions
    with a body, and its variables (neither static, extern nor inline)"""
    code = re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", "", code, flags=re.M)   # directives, continued lines too
    funcs, names, depth, start, func = set(), set(), 0, 0, None
    for m in re.finditer(r"[{};]", code):
        c = m.group(0)
        if depth == 0:
            text = code[start:m.start()].strip()
            local = re.search(r"\b(static|extern|typedef|inline)\b", text)
            if c == "{":   # a function's body, or a struct's or an initializer's braces
                f = re.search(r"(\w+)\s*\((?:[^()]|\([^()]*\))*\)\s*(?:__attribute__\s*\(\(.*\)\))?\s*$", text, re.S)
                func = (f.group(1), not local) if f and "=" not in text and f.group(1) not in KEYWORDS else None
            elif c == ";" and text and not local and not re.search(r"\w\s*\(", text.split("=")[0]):
                v = re.search(r"(\w+)\s*(\[[^\]]*\])*\s*(=.*)?$", text, re.S)
                if v and not re.match(r"(struct|enum|union)\b[^=]*$", text):
                    names.add(v.group(1))
        if c == "{":
            depth += 1
        elif c == "}":
            depth = max(depth - 1, 0)
            if depth == 0 and func:   # a function's body ends its definition; a struct's goes on to ';'
                if func[1]:
                    funcs.add(func[0])
                start, func = m.end(), None
        elif c == ";" and depth == 0:
            start = m.end()
    return funcs, names


def uses(path, code):
    """the code of a file that uses names: all of a source; of a header, its
    macros and the bodies of its inline functions (not its declarations: a
    header without a source of its own declares what others define)"""
    if path.endswith(SOURCES):
        return code
    macros = re.findall(r"^[ \t]*#[ \t]*define(?:[^\n]*\\\n)*[^\n]*", code, re.M)
    code = re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", "", code, flags=re.M)
    bodies, depth, begin = [], 0, 0
    for m in re.finditer(r"[{}]", code):
        if m.group(0) == "{":
            if depth == 0:
                begin = m.end()
            depth += 1
        elif depth:
            depth -= 1
            if depth == 0:
                bodies.append(code[begin:m.start()])
    return "\n".join(macros + bodies)


def graph():
    paths = list(files())
    units = sorted({unit_of(p) for p in paths})
    code = {p: strip(open(os.path.join(ROOT, p), encoding="utf-8", errors="replace").read()) for p in paths}
    raw = {p: open(os.path.join(ROOT, p), encoding="utf-8", errors="replace").read() for p in paths}
    by_name, functions = {}, set()
    for p in paths:
        if p.endswith(SOURCES):
            funcs, variables = definitions(code[p])
            functions |= funcs
            for n in funcs | variables:
                by_name.setdefault(n, set()).add(unit_of(p))
    # a name another unit can use: defined by one unit alone, declared in a header
    declared = set()
    for p in paths:
        if p.endswith(HEADERS):
            declared |= set(re.findall(r"\b[A-Za-z_]\w*\b", code[p]))
    owner = {n: next(iter(u)) for n, u in by_name.items() if len(u) == 1 and n in declared}
    edges = {u: {} for u in units}
    for p in paths:
        u = unit_of(p)
        for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', raw[p], re.M):
            for cand in (inc, os.path.join(os.path.dirname(p), inc)):
                cand = os.path.normpath(cand)
                if cand in code and unit_of(cand) != u:
                    edges[u].setdefault(unit_of(cand), set()).add("#include " + inc)
                    break
        text = uses(p, code[p])
        called = set(re.findall(r"\b([A-Za-z_]\w*)\s*\(", text))
        for name in set(re.findall(r"\b[A-Za-z_]\w*\b", text)):
            v = owner.get(name)
            if v and v != u and (name in called or name not in functions):
                edges[u].setdefault(v, set()).add(name)
    return units, edges


def circles(units, edges):
    """Tarjan's strongly connected components (iterative)"""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in units:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]; counter[0] += 1
        stack.append(root); on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1
                    stack.append(w); on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop(); on.discard(w); comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1 or v in edges[v]:
                        out.append(sorted(comp))
    return sorted(out)


def main(argv):
    check = None
    if argv and argv[0] == "--check":
        check = [a.rstrip("/") + "/" for a in argv[1:]] or ["engine/", "kernels/"]
    elif argv:
        print(__doc__.strip())
        return 2
    units, edges = graph()
    found = circles(units, edges)
    if check is None:
        for u in units:
            print(u + ":")
            for v in sorted(edges[u]):
                names = sorted(edges[u][v])
                more = " and %d more" % (len(names) - 6) if len(names) > 6 else ""
                print("  -> %s  (%s%s)" % (v, ", ".join(names[:6]), more))
    bad = [c for c in found if check is None or any(u.startswith(tuple(check)) for u in c)]
    for c in bad:
        print("circle of %d units: %s" % (len(c), ", ".join(c)))
        inside = set(c)
        for u in c:
            for v in sorted(set(edges[u]) & inside):
                print("  %s -> %s: %s" % (u, v, ", ".join(sorted(edges[u][v])[:8])))
    print("%d circle(s)%s" % (len(bad), " in " + " ".join(check) if check else ""))
    return 1 if bad and check is not None else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
