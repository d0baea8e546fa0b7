"""Layout rules read off the source: no import circle in sapp/ (nor in bench/), no sapp/ file over 500
lines, no sapp/ function over 80 lines.

The graph comes from each module's `ast`, not from importing it.  An edge is every import statement
in the module, at module level or inside a function: a lazy import that dodges a circle at load time
is still a circle in the design (each side needs the other), so it counts.  Relative imports are
resolved against the module's package; `from pkg import name` is an edge to pkg.name when that is a
module, else to pkg; `import a.b.c` is an edge to a.b.c.  Not counted: the package __init__ that
Python runs before a submodule (every submodule would otherwise sit in a circle with a package that
re-exports it) and importlib.import_module on a computed name (not an import statement)."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES = 500
MAX_FUNCTION_LINES = 80       # a function, method or nested function, `def` line to last line


def modules(root: str, top: str) -> dict:
    """{dotted name: (path, is_package)} of every .py file under root/top."""
    out = {}
    for folder, dirs, files in os.walk(os.path.join(root, top)):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = os.path.join(folder, f)
            parts = os.path.relpath(path, root)[:-3].split(os.sep)
            pkg = parts[-1] == "__init__"
            out[".".join(parts[:-1] if pkg else parts)] = (path, pkg)
    return out


def _base(name: str, pkg: bool, level: int, module) -> str:
    parts = name.split(".") if pkg else name.split(".")[:-1]
    if level > 1:
        parts = parts[:len(parts) - (level - 1)]
    return ".".join(parts + ([module] if module else []))


def _known(target: str, mods: dict):
    """The module `target` names, or the nearest enclosing one; None outside the scanned tree."""
    while target and target not in mods:
        if "." not in target:
            return None
        target = target.rsplit(".", 1)[0]
    return target


def import_targets(node, name, pkg, mods) -> list:
    """The modules an import statement `node` of module `name` (in package `pkg`) names: a submodule
    imported by name (`from . import x`) is that module, anything else the module it is taken from."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = _base(name, pkg, node.level, node.module) if node.level else node.module
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
    return []


def graph(mods: dict) -> dict:
    """{module: {modules it imports}} over `mods` (imports of anything else are left out)."""
    edges = {}
    for name, (path, pkg) in mods.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        out = set()
        for node in ast.walk(tree):
            for t in import_targets(node, name, pkg, mods):
                t = _known(t, mods)
                if t is not None and t != name:
                    out.add(t)
        edges[name] = out
    return edges


def circles(edges: dict) -> list:
    """One concrete circle [a, b, ..., a] per strongly connected component of more than one module
    (Tarjan's algorithm, iterative; deterministic order)."""
    index, low, on, stack, comps, counter = {}, {}, set(), [], [], [0]
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(comp)
    return [_path(edges, comp) for comp in comps]


def _path(edges: dict, comp: set) -> list:
    """A shortest circle through the component's first module (breadth-first inside the component)."""
    start = min(comp)
    prev, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v] & comp):
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return path[::-1] + [start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return sorted(comp)


def _report(found: list) -> str:
    return "; ".join(" -> ".join(c) for c in found)


def test_sapp_has_no_import_circle():
    found = circles(graph(modules(ROOT, "sapp")))
    assert not found, f"{len(found)} import circle(s) in sapp/: {_report(found)}"


def test_bench_has_no_import_circle():
    found = circles(graph(modules(ROOT, "bench")))
    assert not found, f"{len(found)} import circle(s) in bench/: {_report(found)}"


def test_no_sapp_file_over_500_lines():
    long = []
    for path, _ in modules(ROOT, "sapp").values():
        with open(path, encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > MAX_LINES:
            long.append(f"{os.path.relpath(path, ROOT)} ({n})")
    assert not long, f"files over {MAX_LINES} lines (split them by concern): {', '.join(sorted(long))}"


def long_functions(root: str, top: str, limit: int = MAX_FUNCTION_LINES) -> list:
    """'path:line name (n lines)' of every function (methods and nested ones too) under root/top longer
    than `limit` lines, counted from its `def` to its last line (decorators not counted)."""
    out = []
    for path, _ in modules(root, top).values():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    out.append(f"{os.path.relpath(path, root)}:{node.lineno} {node.name} ({n} lines)")
    return sorted(out)


def test_no_sapp_function_over_80_lines():
    long = long_functions(ROOT, "sapp")
    assert not long, (f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps with explicit "
                      f"inputs and outputs): {', '.join(long)}")


def test_the_function_reader_counts_methods_and_nested_functions(tmp_path):
    """The check above can fail: a method and a nested function of 81 lines are found, one of 80 is not."""
    def fn(name, lines, pad):         # a function of exactly `lines` lines, indented by `pad`
        return [f"{pad}def {name}():"] + [f"{pad}    x{i} = {i}" for i in range(lines - 2)] + [f"{pad}    return 0"]
    src = fn("ok", 80, "") + ["class C:"] + fn("method", 81, "    ") + ["def outer():"] + fn("inner", 81, "    ")
    src += ["    return inner", ""]
    pkg = tmp_path / "toy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("\n".join(src))
    found = [f.split(" ", 1)[1] for f in long_functions(str(tmp_path), "toy")]
    assert sorted(found) == ["inner (81 lines)", "method (81 lines)", "outer (83 lines)"], found


def test_the_reader_finds_planted_circles(tmp_path):
    """The checks above can fail: a package with a lazy relative import closing a circle, a
    `from pkg import module` edge and a `from pkg import name` edge (to the package itself)."""
    pkg = tmp_path / "toy"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("NAME = 1\n")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .sub.c import g\n")           # lazy: still an edge
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from ..a import x\nfrom .. import NAME\n")  # -> toy.a, toy
    (pkg / "d.py").write_text("import toy.a\n")                                  # into the circle only
    edges = graph(modules(str(tmp_path), "toy"))
    assert edges["toy.sub.c"] == {"toy.a", "toy"}
    assert circles(edges) == [["toy.a", "toy.b", "toy.sub.c", "toy.a"]]
    (pkg / "b.py").write_text("def f():\n    return 1\n")
    assert circles(graph(modules(str(tmp_path), "toy"))) == []
