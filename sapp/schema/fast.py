"""Schema checks of large, simply typed sections without jsonschema (sapp/schema/__init__.first_error).

A 175B plan's `operators` map holds 2,600 entries, 83% of its bytes: jsonschema's walk over it took
~0.1 CPU-s of every load.  A section whose subschema uses only `type`, `properties`,
`additionalProperties`, `items` and annotations is checked here with the same type rules as the
strict validator (an integer is an int and never a bool; a number is no bool either); where it passes,
first_error validates the document with an empty stand-in for it (valid under such a subschema,
and the document-level keywords read the keys only); where it fails, the full validation runs, so
the message is the one jsonschema gives."""
from __future__ import annotations

import numbers

SIMPLE = {"type", "properties", "additionalProperties", "items", "description", "title"}
_TYPES = {
    "object": lambda x: isinstance(x, dict),
    "array": lambda x: isinstance(x, list),
    "string": lambda x: isinstance(x, str),
    "integer": lambda x: isinstance(x, int) and not isinstance(x, bool),
    "number": lambda x: isinstance(x, numbers.Number) and not isinstance(x, bool),
    "boolean": lambda x: isinstance(x, bool),
    "null": lambda x: x is None,
}


def simple(schema) -> bool:
    """Whether `schema` uses only the keywords `valid` checks, all the way down."""
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict) or set(schema) - SIMPLE:
        return False
    types = schema.get("type", [])
    if not all(t in _TYPES for t in (types if isinstance(types, list) else [types])):
        return False
    subs = list((schema.get("properties") or {}).values())
    subs += [schema[k] for k in ("additionalProperties", "items") if k in schema]
    return all(simple(s) for s in subs)


def valid(schema, x) -> bool:
    """`x` against a `simple` schema."""
    if schema is True:
        return True
    if schema is False:
        return False
    t = schema.get("type")
    if t is not None and not any(_TYPES[k](x) for k in (t if isinstance(t, list) else [t])):
        return False
    if isinstance(x, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties", True)
        for k, v in x.items():
            sub = props.get(k, extra)
            if sub is not True and not valid(sub, v):
                return False
    elif isinstance(x, list) and "items" in schema:
        sub = schema["items"]
        if sub is not True and not all(valid(sub, v) for v in x):
            return False
    return True


def stand_ins(schema, doc, least=256):
    """{top-level key: an empty stand-in} for the sections of `doc` with at least `least` entries whose
    subschema is simple and which pass it; None where such a section fails (the full validation
    then names the error)."""
    out = {}
    if not isinstance(doc, dict) or not isinstance(schema, dict):
        return out
    for k, sub in (schema.get("properties") or {}).items():
        v = doc.get(k)
        if not isinstance(v, (dict, list)) or len(v) < least or not simple(sub):
            continue
        if not valid(sub, v):
            return None
        out[k] = type(v)()
    return out
