"""A Python job configuration read as data: the file is parsed with `ast` and never executed,
imported or compiled.  What it may hold is what `sapp export --to torchtitan` writes, a hand-written
torchtitan 0.3 job, and torchtitan's own registry files (models/llama3/config_registry.py as 0.3.0
publishes it: several job functions, some built from another):

    from typing import cast                                   # typing / __future__: names, never used
    from torchtitan.config import ParallelismConfig          # imports from torchtitan (or relative ones:
    from . import model_registry                              #   the registry's own torchtitan package)
    def my_job() -> Trainer.Config:                           # job functions: no arguments, no decorators
        spec = model_registry("8B")                           # name = <literal>
        config = Trainer.Config(model_spec=spec, parallelism=ParallelismConfig(tensor_parallel_degree=2))
        config.training.local_batch_size = 2                  # name.field... = <literal>
        return config                                         # return <literal> or a name
    def my_job_tp4() -> Trainer.Config:
        config = my_job()                                     # another job function of the file, read in turn
        config.parallelism.tensor_parallel_degree = 4
        return config

A literal is a constant, a list / tuple / dict of literals, a name bound above, a call of a class or
function the file imported from torchtitan with literal arguments (kept as a `Call`: sapp interprets
the known ones itself), or a call of another job function (its configuration, read afresh).  Anything
else — another statement, an expression, an import from elsewhere, a name imported from typing used as
a value — is refused in one line naming the job function: files are data, never code.  A file of
several job functions is read at the one `job` names (torchtitan's `--config`); functions with
arguments are helpers torchtitan's --config cannot name, never read."""
from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass, field

from ..errors import clip, shown
from .mapping import EngineError

MAX_NODES = 20000          # a job configuration is a few hundred nodes
MAX_TOKENS = 50000         # ... and a few thousand tokens; counted before `ast` builds anything
# a job built from another is read afresh at each call (no object shared between two jobs' results);
# the count bounds what a chain of such calls can make of a 20000-node file
MAX_JOB_CALLS = 16
# modules a registry imports names from for its annotations (`cast`, `annotations`): the names are
# bound to nothing sapp reads, so any use of one in a job is refused like any other unknown call
NAME_ONLY = ("typing", "__future__")


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
                      f"imports from torchtitan and job functions of assignments and a return of constructor calls "
                      f"with literal values")


def _import_names(st: ast.ImportFrom, imported: dict) -> None:
    """The names `st` binds, as data (nothing is imported): torchtitan's (a relative import is the
    registry's own torchtitan package: `from . import model_registry` in models/llama3/config_registry.py)
    into `imported`; typing's / __future__'s unbind the name, as Python's later binding would."""
    module = st.module or ""
    if not st.level and module.split(".")[0] in NAME_ONLY:
        for a in st.names:
            imported.pop(a.asname or a.name, None)
        return
    if not st.level and module.split(".")[0] != "torchtitan":
        _refuse(st, f"an import from {shown(module)}")
    for a in st.names:
        if a.name == "*":
            _refuse(st, "import *")
        imported[a.asname or a.name] = a.name


def _dotted(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


class _Reader:
    """One job function's body.  `top`: the file's imported names; `funcs`: its functions, callable when
    they are job functions; `stack`: the job functions being read (a job calling itself is refused);
    `budget`: the job-function calls left in this whole read, shared by every reader of it."""

    def __init__(self, top: dict, funcs: dict, stack: tuple, budget: list):
        self.top, self.imported, self.funcs, self.stack, self.budget = top, dict(top), funcs, stack, budget
        self.env: dict = {}

    def job_call(self, node):
        """`other_job()`: that function's configuration, read afresh (a registry builds one job from another)."""
        fn = self.funcs[node.func.id]
        if not _is_job(fn) or node.args or node.keywords:
            _refuse(node, f"a call of {_name(fn.name)} with arguments (sapp reads job functions of none)")
        if fn.name in self.stack:
            _refuse(node, f"job {_name(fn.name)} calls itself (through {clip(' -> '.join(self.stack), 120)})")
        self.budget[0] -= 1
        if self.budget[0] < 0:
            _refuse(node, f"more than {MAX_JOB_CALLS} calls of job functions")
        return _read_job(fn, self.top, self.funcs, self.stack, self.budget)

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
            if isinstance(node.func, ast.Name) and name in self.funcs and name not in self.imported \
                    and name not in self.env:       # (a local name or import shadows the function)
                return self.job_call(node)
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
        elif isinstance(st, ast.ImportFrom):            # a job's own import (the LoRA job's): names only
            _import_names(st, self.imported)
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


def _is_job(fn) -> bool:
    a = fn.args
    return not (a.args or a.posonlyargs or a.kwonlyargs or a.vararg or a.kwarg)


def _read_job(fn, top: dict, funcs: dict, stack: tuple, budget: list) -> Call:
    """The configuration job function `fn` returns; an error names the innermost job it is in."""
    reader = _Reader(top, funcs, stack + (fn.name,), budget)
    try:
        *body, last = fn.body
        for st in body:
            reader.statement(st)
        if not isinstance(last, ast.Return) or last.value is None:
            _refuse(last, "the function does not end in `return <configuration>`")
        out = reader.value(last.value)
        if not isinstance(out, Call):
            _refuse(last, "the function returns no configuration")
    except EngineError as e:
        text = str(e)
        raise EngineError(text if text.startswith("job ") else f"job {_name(fn.name)}, {text}") from None
    return out


def _top_level(tree: ast.Module) -> tuple[dict, dict]:
    """(the names the file imports, its functions by name), the later binding of a name winning as in Python;
    anything else at the top level (code torchtitan would run on import) is refused."""
    imported, funcs = {}, {}
    for st in tree.body:
        if isinstance(st, ast.ImportFrom):
            _import_names(st, imported)
            for a in st.names:
                funcs.pop(a.asname or a.name, None)
        elif isinstance(st, ast.FunctionDef):
            if st.decorator_list:
                _refuse(st, f"function {_name(st.name)} has decorators (torchtitan runs them on import)")
            imported.pop(st.name, None)
            funcs.pop(st.name, None)        # a redefinition replaces, in the file's order
            funcs[st.name] = st
        elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant) and isinstance(st.value.value, str):
            continue
        else:
            _refuse(st, f"a {type(st).__name__} statement at the top level")
    return imported, funcs


def _listing(names) -> str:
    return clip(", ".join(names), 600) + (f" ({len(names)} in all)" if len(names) > 3 else "")


def _pick(funcs: dict, job):
    """(the job function to read, how many the file has): the one `job` names, else the file's only one."""
    jobs = [n for n, f in funcs.items() if _is_job(f)]
    if job is not None:
        if job in jobs:
            return funcs[job], len(jobs)
        what = "takes arguments (torchtitan's --config names a function of none)" if job in funcs else \
            "is not a function of the file"
        raise EngineError(f"--job {shown(job)} {what}; its job functions: {_listing(jobs) or 'none'}")
    if len(jobs) == 1:
        return funcs[jobs[0]], 1
    if not jobs:
        raise EngineError("the file defines no job function (a function of no arguments returning the configuration, "
                          "which torchtitan's --config names)")
    raise EngineError(f"the file defines {len(jobs)} job functions; pass --job NAME to pick one: {_listing(jobs)}")


def read(text: str, tree: ast.Module | None = None, job: str | None = None) -> tuple[Call, str, int]:
    """(the configuration job function `job` returns, that function's name, how many job functions the
    file defines); without `job`, the file's only one.  `tree`: the file already parsed by `parse`."""
    tree = parse(text) if tree is None else tree
    imported, funcs = _top_level(tree)
    fn, count = _pick(funcs, job)
    return _read_job(fn, imported, funcs, (), [MAX_JOB_CALLS]), fn.name, count
