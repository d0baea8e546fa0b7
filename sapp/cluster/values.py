"""The cluster file's values read and checked one by one (numbers, booleans, [size, rate] curves,
{name: [a, b]} pairs): one-line ClusterErrors naming the field (sapp/cluster/__init__.py)."""
from __future__ import annotations

import math

from sapp.errors import ClusterError, SappError
from sapp.units import parse_quantity


def _check_curve(name, key, curve):
    if not isinstance(curve, tuple) or not all(isinstance(p, tuple) and len(p) == 2 for p in curve):
        raise ClusterError(f"cluster {name!r}: {key} must be a list of [size, rate] pairs")
    prev = 0.0
    for size, rate in curve:
        if not (isinstance(size, (int, float)) and isinstance(rate, (int, float)) and size > 0 and rate > 0):
            raise ClusterError(f"cluster {name!r}: {key} needs positive [size, rate] pairs, got {[size, rate]!r}")
        if size <= prev:
            raise ClusterError(f"cluster {name!r}: {key} sizes must rise strictly, got {size!r} after {prev!r}")
        prev = size


def _to_curve(v, key):
    if not isinstance(v, (list, tuple)):
        raise ClusterError(f"{key} must be a list of [size, rate] pairs, got {v!r}")
    out = []
    for p in v:
        if not isinstance(p, (list, tuple)) or len(p) != 2:
            raise ClusterError(f"{key} must be a list of [size, rate] pairs, got item {p!r}")
        out.append((_to_float(p[0], key), _to_float(p[1], key)))
    return tuple(out)


def _named_pairs(v, key="op_rates"):
    """{name: [a, b]} -> sorted ((name, a, b), ...) for op_rates and collective_fits."""
    if not isinstance(v, dict):
        raise ClusterError(f"{key} must be an object of name: [number, number], got {v!r}")
    out = []
    for name in sorted(v):
        pair = v[name]
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ClusterError(f"{key}[{name!r}] must be a pair of numbers, got {pair!r}")
        out.append((str(name), _to_float(pair[0], key), _to_float(pair[1], key)))
    return tuple(out)


def _check_named_pairs(name, rates, key="op_rates", allow_zero_first=False):
    if not isinstance(rates, tuple):
        raise ClusterError(f"cluster {name!r}: {key} must map names to pairs of numbers")
    for item in rates:
        ok = isinstance(item, tuple) and len(item) == 3 and isinstance(item[0], str) and all(
            isinstance(r, (int, float)) for r in item[1:])
        if ok:
            first, second = item[1], item[2]
            ok = second > 0 and (first >= 0 if allow_zero_first else first > 0)
        if not ok:
            raise ClusterError(f"cluster {name!r}: {key} entries need positive numbers, got {item!r}")


def _is_number(v) -> bool:
    """A finite int or float; booleans are not numbers here (JSON true must not become 1 FLOP/s)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _to_int(v, key):
    if isinstance(v, bool):
        raise ClusterError(f"{key} must be a whole number, got {v!r}")
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        raise ClusterError(f"{key} must be a whole number, got {v!r}") from None
    if not math.isfinite(f) or f != int(f):
        raise ClusterError(f"{key} must be a whole number, got {v!r}")
    return int(f)


def _to_bool(v, key):
    if isinstance(v, bool):
        return v
    text = str(v).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ClusterError(f"{key} must be true or false, got {v!r}")


def _to_float(v, key):
    try:
        return parse_quantity(v, key)
    except SappError as e:
        raise ClusterError(str(e)) from None
