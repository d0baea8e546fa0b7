"""Parsing and printing of quantities with units (bytes, bytes/s, FLOP/s, seconds)."""
import math
import re

from .errors import SappError

_SI = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BIN = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_NUM = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z/]*)\s*$")


def parse_quantity(text, what="value"):
    """'80GB' -> 8e10, '300GB/s' -> 3e11, '5us' -> 5e-6, '312T' -> 3.12e14, '1e9' -> 1e9.
    Bits ('Gb/s') are converted to bytes.  Raises SappError naming `what` on anything else, including
    true/false, NaN, infinities and values too large for a float."""
    if isinstance(text, bool) or not isinstance(text, (int, float, str)):
        raise SappError(f"cannot read {what}={text!r}: write a number with an optional unit, e.g. 80GB, 300GB/s, 5us")
    if isinstance(text, (int, float)):
        try:
            value = float(text)
        except OverflowError:
            value = math.inf
        return _finite(value, what, text)
    m = _NUM.match(text[:200])
    if not m:
        raise SappError(f"cannot read {what}={text!r}: write a number with an optional unit, e.g. 80GB, 300GB/s, 5us")
    value, unit = float(m.group(1)), m.group(2)
    if unit in _TIME:
        return _finite(value * _TIME[unit], what, text)
    unit = unit.replace("/s", "").replace("FLOPS", "").replace("FLOP", "").replace("flops", "")
    bits = unit.endswith("b") and not unit.endswith("B")
    unit = unit.rstrip("Bb")
    if unit in _BIN:
        scale = _BIN[unit]
    elif unit in _SI:
        scale = _SI[unit]
    else:
        raise SappError(f"cannot read {what}={text!r}: unknown unit {m.group(2)!r} (use k/M/G/T, B or b, /s, s/ms/us)")
    return _finite(value * scale / (8.0 if bits else 1.0), what, text)


def _finite(value, what, text):
    if not math.isfinite(value):
        raise SappError(f"cannot read {what}={text!r}: it is not a finite number; write a real value")
    return value


def fmt_bytes(n):
    n = float(n)
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_time(t):
    t = float(t)
    if t >= 1:
        return f"{t:.3f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.1f} us"


def _scaled(x, units, digits=3):
    """x in the largest of `units` ((suffix, scale), largest first) it reaches, to `digits` significant
    figures; below the smallest scale, as is."""
    x = float(x)
    for suffix, scale in units:
        if abs(x) >= scale:
            return f"{x / scale:.{digits}g} {suffix}".rstrip()
    return f"{x:.{digits}g}"


def fmt_flops(f):
    """8.5e9 -> '8.5 GFLOP/s', 3.12e14 -> '312 TFLOP/s' (a CPU's rate is not '0 TFLOP/s')."""
    return _scaled(f, (("PFLOP/s", 1e15), ("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6))) \
        if abs(float(f)) >= 1e6 else f"{float(f):.0f} FLOP/s"


def fmt_count(n):
    """A parameter (or any) count: 135 -> '135', 1.35e5 -> '135 K', 1.3e6 -> '1.3 M', 1.75e11 -> '175 B'."""
    return _scaled(n, (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)))


def printable(text) -> str:
    """`text` as one printable line: control characters (a terminal's escape sequences), line and
    paragraph separators and other non-printables written as Python escapes (\\n, \\x1b, \\u2028).
    For what sapp prints or writes from a file: a plan's names reach terminals and other tools'
    configuration files, where a newline would start a flag or a table."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def plural(n, word: str, many: str = "") -> str:
    """'1 node', '2 nodes' (`many`: an irregular plural)."""
    return f"{n:,} {word}" if n == 1 else f"{n:,} {many or word + 's'}"
