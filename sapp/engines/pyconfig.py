"""A Python job configuration read as data: the file is parsed with `ast` and never executed,
imported or compiled.  What it may hold is what `sapp export --to torchtitan` writes and what a
hand-written torchtitan 0.3 job looks like at its plainest:

    from torchtitan.config import ParallelismConfig          # imports from torchtitan only
    def my_job() -> Trainer.Config:                           # one function, no arguments
        spec = model_registry("8B")                           # name = <literal>
        config = Trainer.Config(model_spec=spec, parallelism=ParallelismConfig(tensor_parallel_degree=2))
        config.training.local_batch_size = 2                  # name.field... = <literal>
        return config                                         # return <literal> or a name

A literal is a constant, a list / tuple / dict of literals, a name bound above, or a call of a
class or function the file imported from torchtitan with literal arguments (kept as a `Call`: sapp
interprets the known ones itself).  Anything else — another statement, an expression, an import
from elsewhere — is refused in one line: files are data, never code."""
from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass, field

from ..errors import shown
from .mapping import EngineError

MAX_NODES = 20000          # a job configuration is a few hundred nodes
MAX_TOKENS = 50000         # ... and a few thousand tokens; counted before `ast` builds anything


@dataclass
class Call:
    """`name(*args, **kwargs)` as written (name dotted, e.g. "SelectiveAC.Config"); `line` for messages."""
    name: str
    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)
    line: int = 0


def _name(text: str) -> str:
    """A name from the file, as messages write it: a name of a megabyte is cut and its length said."""
    return text if len(text) <= 60 else shown(text)


def _refuse(node, what: str):
    raise EngineError(f"line {getattr(node, 'lineno', '?')}: {what}; files are data, never code: sapp reads only "
                      f"imports from torchtitan, one function of assignments and a return of constructor calls "
                      f"with literal values")


def _dotted(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


class _Reader:
    def __init__(self, imported: dict):
        self.imported = imported
        self.env: dict = {}

    def value(self, node):
        if isinstance(node, ast.Constant) and not isinstance(node.value, bytes) and node.value is not Ellipsis:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
                and type(node.operand.value) in (int, float):
            return -node.operand.value
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self.value(e) for e in node.elts]
        if isinstance(node, ast.Dict):
            if any(k is None for k in node.keys):
                _refuse(node, "a ** inside a dict")
            keys = [self.value(k) for k in node.keys]
            if not all(isinstance(k, (str, int, float, bool)) or k is None for k in keys):
                _refuse(node, "a dict key that is not a constant")
            return dict(zip(keys, (self.value(v) for v in node.values)))
        if isinstance(node, ast.Name):
            if node.id not in self.env:
                _refuse(node, f"{shown(node.id)} is not bound by an assignment above")
            return self.env[node.id]
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name is None or name.split(".")[0] not in self.imported:
                _refuse(node, f"a call of {ast.unparse(node.func)[:60]!r}, not of a name imported from torchtitan")
            if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
                _refuse(node, "* or ** arguments")
            root, _, rest = name.partition(".")
            name = self.imported[root] + ("." + rest if rest else "")      # an `as` name read as the original
            return Call(name, [self.value(a) for a in node.args], {k.arg: self.value(k.value) for k in node.keywords},
                        node.lineno)
        _refuse(node, f"{type(node).__name__.lower()} {ast.unparse(node)[:60]!r} is not a literal")

    def statement(self, st):
        if isinstance(st, ast.Assign) and len(st.targets) == 1:
            target, value = st.targets[0], self.value(st.value)
        elif isinstance(st, ast.AnnAssign) and st.value is not None and st.simple:
            target, value = st.target, self.value(st.value)
        elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant) and isinstance(st.value.value, str):
            return None                                     # a docstring
        elif isinstance(st, ast.Pass):
            return None
        else:
            _refuse(st, f"a {type(st).__name__} statement")
        if isinstance(target, ast.Name):
            self.env[target.id] = value
            return None
        path = _dotted(target)
        if path is None or "." not in path:
            _refuse(st, "an assignment to something other than a name or name.field")
        root, *attrs = path.split(".")
        obj = self.env.get(root)
        for a in attrs[:-1]:
            if not isinstance(obj, Call):
                _refuse(st, f"{_name(path)}: {shown(a)} is not in a configuration the file built above")
            obj = obj.kwargs.setdefault(a, Call("", line=st.lineno))   # "": the section's default class
        if not isinstance(obj, Call):
            _refuse(st, f"{_name(path)} assigns into something that is not a configuration")
        obj.kwargs[attrs[-1]] = value
        return None


def _count_tokens(text: str) -> None:
    """Refuse a file of more than MAX_TOKENS tokens, reading them one at a time: `ast.parse` of a 4 MB
    file holding a 2-million-element tuple took 2.3 GB and 12 CPU-s before the node count refused it."""
    n, tokens = 0, tokenize.generate_tokens(io.StringIO(text).readline)
    try:
        for n, _ in enumerate(tokens):
            if n >= MAX_TOKENS:
                break
    except (tokenize.TokenError, SyntaxError, ValueError):
        return            # `ast.parse` says what is wrong, in its words
    if n >= MAX_TOKENS:
        raise EngineError(f"the configuration has more than {MAX_TOKENS} tokens ({len(text)} characters); "
                          "not a job configuration")


def parse(text: str) -> ast.Module:
    """The file's syntax tree, its size bounded before the tree is built; parsed once per read."""
    _count_tokens(text)
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        raise EngineError(f"not a Python configuration (line {e.lineno}: {str(e.msg)[:120]})") from None
    except (ValueError, RecursionError, MemoryError):
        raise EngineError("not a Python configuration sapp can read (null bytes or nesting too deep)") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise EngineError(f"the configuration has more than {MAX_NODES} syntax nodes; not a job configuration")
    return tree


def read(text: str, tree: ast.Module | None = None) -> tuple[Call, str]:
    """(the configuration the file's one function returns, that function's name); `tree`: the file
    already parsed by `parse`."""
    tree = parse(text) if tree is None else tree
    imported, funcs = {}, []
    for st in tree.body:
        if isinstance(st, ast.ImportFrom):
            if st.level or not st.module or st.module.split(".")[0] != "torchtitan":
                _refuse(st, f"an import from {shown(('.' * st.level) + (st.module or ''))}")
            for a in st.names:
                if a.name == "*":
                    _refuse(st, "import *")
                imported[a.asname or a.name] = a.name
        elif isinstance(st, ast.FunctionDef):
            a = st.args
            if st.decorator_list or a.args or a.posonlyargs or a.kwonlyargs or a.vararg or a.kwarg:
                _refuse(st, f"function {_name(st.name)} has decorators or arguments")
            funcs.append(st)
        elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant) and isinstance(st.value.value, str):
            continue
        else:
            _refuse(st, f"a {type(st).__name__} statement at the top level")
    if len(funcs) != 1:
        raise EngineError(f"the file defines {len(funcs)} functions; sapp reads a file with exactly one (the job "
                          f"function torchtitan's --config names)")
    fn = funcs[0]
    reader = _Reader(imported)
    *body, last = fn.body
    for st in body:
        reader.statement(st)
    if not isinstance(last, ast.Return) or last.value is None:
        _refuse(last, f"function {_name(fn.name)} does not end in `return <configuration>`")
    out = reader.value(last.value)
    if not isinstance(out, Call):
        _refuse(last, f"function {_name(fn.name)} returns no configuration")
    return out, fn.name
