"""The published JSON Schemas of sapp's files (plan.schema.json, cluster.schema.json; `sapp schema`
prints them) and the validation every load and save runs against them.

The schema checks shape and types; what needs the rest of the document (degrees multiplying to the
device count, splits naming an operator's dims) is checked after it, by Plan and the evaluator.
Errors are one line naming the field by its path, e.g. `pipeline.stages[0].blocks must be an array`."""
from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources

NAMES = ("plan", "cluster")
BASE = "https://sapp.dev/schema/"


def text(name: str) -> str:
    """The schema file as shipped (what `sapp schema NAME` prints)."""
    if name not in NAMES:
        raise ValueError(name)
    return resources.files(__package__).joinpath(f"{name}.schema.json").read_text()


@lru_cache(maxsize=None)
def _validator(name: str):
    import jsonschema
    from referencing import Registry, Resource
    schemas = {n: json.loads(text(n)) for n in NAMES}
    registry = Registry().with_resources(
        (BASE + f"{n}.schema.json", Resource.from_contents(s)) for n, s in schemas.items())
    cls = jsonschema.validators.validator_for(schemas[name])
    # JSON's 16.0 is an integer to jsonschema, and Python's True is not a number to it but is an int to
    # Python: sapp wants counts written as counts, so integers are ints and never booleans
    checker = cls.TYPE_CHECKER.redefine(
        "integer", lambda _, x: isinstance(x, int) and not isinstance(x, bool))
    strict = jsonschema.validators.extend(cls, type_checker=checker)
    return strict(schemas[name], registry=registry)


def path_str(path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _short(x, limit=60) -> str:
    s = json.dumps(x, default=str) if not isinstance(x, str) else json.dumps(x)
    return s if len(s) <= limit else s[:limit - 3] + "..."


_TYPE_WORDS = {"integer": "a whole number", "number": "a number", "string": "a string", "boolean": "true or false",
               "object": "an object", "array": "an array", "null": "null"}


def describe(err) -> str:
    """One line for a jsonschema ValidationError: the field's path, what it must be, what it is."""
    where = path_str(err.absolute_path) or "the document"
    v, got = err.validator, _short(err.instance)
    if v == "type":
        types = err.validator_value if isinstance(err.validator_value, list) else [err.validator_value]
        return f"{where} must be {' or '.join(_TYPE_WORDS.get(t, t) for t in types)}, got {got}"
    if v == "required":
        missing = [k for k in err.validator_value if isinstance(err.instance, dict) and k not in err.instance]
        return f"{where} is missing field {path_str(list(err.absolute_path) + missing[:1]) if missing else '?'}"
    if v in ("enum", "const"):
        allowed = err.validator_value if v == "enum" else [err.validator_value]
        return f"{where} must be one of {', '.join(_short(a) for a in allowed)}, got {got}"
    if v == "minimum":
        return f"{where} must be >= {err.validator_value}, got {got}"
    if v == "exclusiveMinimum":
        return f"{where} must be > {err.validator_value}, got {got}"
    if v == "maximum":
        return f"{where} must be <= {err.validator_value:g}, got {got}"
    if v == "exclusiveMaximum":
        return f"{where} must be < {err.validator_value}, got {got}"
    if v == "additionalProperties":
        known = sorted((err.schema.get("properties") or {}))
        extra = sorted(set(err.instance) - set(known)) if isinstance(err.instance, dict) else []
        return (f"{where} has unknown field(s) {', '.join(map(str, extra[:5]))}"
                + (f"; known: {', '.join(known)}" if known else ""))
    if v == "propertyNames":
        return f"{where} has a key that is not allowed ({err.message[:80]})"
    if v in ("minItems", "maxItems"):
        return f"{where} must have {'at least' if v == 'minItems' else 'at most'} {err.validator_value} items, got {got}"
    from ..errors import clip
    return f"{where}: {clip(err.message, 120)}"


def _rank(err):
    # a value of the wrong kind first (it explains more than a field missing beside it), then the
    # shallowest; anyOf's summary last
    return (err.validator == "required", err.validator in ("anyOf", "oneOf"), len(err.absolute_path))


def first_error(name: str, doc):
    """The one-line description of the most telling schema violation of `doc`, or None."""
    v = _validator(name)
    from .fast import stand_ins
    subs = stand_ins(v.schema, doc)     # large, simply typed sections checked without jsonschema
    errors = list(v.iter_errors({**doc, **subs} if subs else doc))
    if not errors:
        return None
    return describe(min(errors, key=_rank))


def strict_loads(text_: str):
    """json.loads that refuses NaN / Infinity and numbers too large for a float (1e999 -> inf):
    a plan or cluster file holds finite numbers only.  Raises ValueError naming the token."""
    def constant(tok):
        raise ValueError(f"non-finite number {tok}")

    def number(tok):
        x = float(tok)
        if not math.isfinite(x):
            raise ValueError(f"number {tok[:30]} is out of range")
        return x
    return json.loads(text_, parse_constant=constant, parse_float=number)


def plain(x):
    """Tuples as lists, recursively (what a JSON round trip gives): Python callers build
    descriptions with tuples and the schema's arrays are lists."""
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    return x


def non_finite_path(x, path=()):
    """Path of the first NaN/inf float in a nested JSON-like value, or None."""
    if isinstance(x, float) and not math.isfinite(x):
        return path_str(path) or "the value"
    if isinstance(x, dict):
        for k, v in x.items():
            p = non_finite_path(v, path + (k,))
            if p:
                return p
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            p = non_finite_path(v, path + (i,))
            if p:
                return p
    return None


MAX_DEPTH = 32          # a plan nests about 8 deep (placement.predicted.components.embedding.tables.<t>.rows)
MAX_STRING = 4096       # characters in one string or key: module paths and notes are a few hundred at most


def shape_problem(x):
    """A one-line reason `x` is no plan or cluster whatever its fields (nested deeper than MAX_DEPTH,
    or a string or key longer than MAX_STRING characters), or None.  Walked with a stack, not
    recursion: the checks after it recurse (the schema, rounding), and a report, a plot or a title
    that takes a megabyte-long name takes minutes."""
    stack = [(x, ())]
    while stack:
        v, path = stack.pop()
        if len(path) > MAX_DEPTH:
            return f"{path_str(path[:4])}... is nested more than {MAX_DEPTH} levels deep"
        if isinstance(v, str):
            if len(v) > MAX_STRING:
                return f"{path_str(path) or 'the value'} is a string of {len(v)} characters (limit {MAX_STRING})"
        elif isinstance(v, dict):
            for k, w in v.items():
                if isinstance(k, str) and len(k) > MAX_STRING:
                    return f"{path_str(path) or 'the document'} has a key of {len(k)} characters (limit {MAX_STRING})"
                stack.append((w, path + (k,)))
        elif isinstance(v, (list, tuple)):
            stack.extend((w, path + (i,)) for i, w in enumerate(v))
    return None


def document_problem(name: str, doc):
    """The first reason `doc` is no valid `name` document, in one line, or None: its shape (depth,
    string length), a NaN or infinite number (named by its path), then the JSON Schema's first error."""
    bad = shape_problem(doc)
    if bad:
        return bad
    where = non_finite_path(doc)
    if where:
        return f"{where} is not a finite number"
    return first_error(name, plain(doc))

