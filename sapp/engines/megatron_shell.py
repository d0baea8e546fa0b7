"""The words of a shell script as bash expands them, for sapp/engines/megatron_script.py: quoting,
`$NAME`, `${NAME}`, `${NAME:-default}` / `${NAME-default}` / `${NAME:=default}`, `${X[@]}`, `$((...))`
of whole numbers; a variable never set (or `$(...)`) a placeholder word `<unset:$NAME>`.  Text only:
nothing is run."""
from __future__ import annotations

import ast
import re

from .mapping import EngineError

MAX_TOKENS = 200_000
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
UNSET = re.compile(r"<unset:\$([^>\s]*)>")


# ---- words -----------------------------------------------------------------------------------------
def _balanced(text, i, open_="(", close=")"):
    """Index just past the `close` that balances the `open_` at text[i]."""
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    raise EngineError("the shell script has an unclosed parenthesis; give Megatron's arguments as a file of flags")


def _dollar(text, i):
    """(part, next index) of the expansion at text[i] == "$"."""
    nxt = text[i + 1:i + 2]
    if text.startswith("$((", i):
        j = _balanced(text, i + 1)
        return ("arith", text[i + 3:j - 2]), j
    if nxt == "(":
        j = _balanced(text, i + 1)
        return ("cmd", text[i + 2:j - 1]), j
    if nxt == "{":
        j = _balanced(text, i + 1, "{", "}")
        return ("brace", text[i + 2:j - 1]), j
    m = NAME_RE.match(text, i + 1)
    if m:
        return ("var", m.group(0)), m.end()
    if nxt.isdigit() or nxt in "@*#?$!":
        return ("var", nxt), i + 2
    return ("lit", "$"), i + 1


def lex(text: str) -> list:
    """Tokens: ("word", [(kind, value, quoted), ...]), ("nl",), ("(",), (")",), (";",)."""
    text = text.replace("\\\n", " ")
    out, parts, i, n = [], [], 0, len(text)

    def end_word():
        nonlocal parts
        if parts:
            out.append(("word", parts))
            parts = []
    while i < n:
        if len(out) > MAX_TOKENS:
            raise EngineError("the shell script is too long to be a launch script")
        c = text[i]
        if c in " \t\r":
            end_word()
            i += 1
        elif c == "\n" or c == ";" or c == "(" or c == ")":
            end_word()
            out.append(("nl",) if c in "\n;" else (c,))
            i += 1
        elif c == "#" and not parts:
            while i < n and text[i] != "\n":
                i += 1
        elif c == "\\":
            parts.append(("lit", text[i + 1:i + 2], True))
            i += 2
        elif c == "'":
            j = text.find("'", i + 1)
            if j < 0:
                raise EngineError("the shell script has an unclosed ' quote")
            parts.append(("lit", text[i + 1:j], True))
            i = j + 1
        elif c == '"':
            i = _double(text, i + 1, parts)
        elif c == "$":
            (kind, v), i = _dollar(text, i)
            parts.append((kind, v, False))
        elif c == "`":
            j = text.find("`", i + 1)
            parts.append(("cmd", text[i + 1:j if j > 0 else n], False))
            i = j + 1 if j > 0 else n
        else:
            parts.append(("lit", c, False))
            i += 1
    end_word()
    return out


def _double(text, i, parts):
    """Reads a double-quoted string from text[i] (after the quote) into parts; returns the index after it."""
    buf = []
    while i < len(text) and text[i] != '"':
        if text[i] == "\\" and text[i + 1:i + 2] in ('"', "\\", "$", "`"):
            buf.append(text[i + 1])
            i += 2
        elif text[i] == "$":
            if buf:
                parts.append(("lit", "".join(buf), True))
                buf = []
            (kind, v), i = _dollar(text, i)
            parts.append((kind, v, True))
        else:
            buf.append(text[i])
            i += 1
    if i >= len(text):
        raise EngineError('the shell script has an unclosed " quote')
    if buf or not parts:
        parts.append(("lit", "".join(buf), True))
    return i + 1


# ---- expansion -------------------------------------------------------------------------------------
class State:
    """One way through the script: its scalars, arrays, launch lines and whether it exited."""

    def __init__(self):
        self.vars, self.arrays, self.launches, self.done = {}, {}, [], False

    def copy(self):
        s = State()
        s.vars, s.arrays, s.launches, s.done = dict(self.vars), {k: list(v) for k, v in self.arrays.items()}, \
            list(self.launches), self.done
        return s


def placeholder(name):
    return f"<unset:${name}>"


def _value(st, part):
    """(text, is a list of words already) of one expansion part."""
    kind, v, _ = part
    if kind == "lit":
        return v, False
    if kind == "var":
        if v in st.arrays:
            return " ".join(st.arrays[v][:1]), False
        return st.vars.get(v, placeholder(v)), False
    if kind == "arith":
        return _arith(st, v), False
    if kind == "cmd":
        return placeholder("(" + "_".join(v.split())[:40] + ")"), False
    return _brace(st, v)


def _brace(st, v):
    m = re.fullmatch(r"([A-Za-z_]\w*|\d+)\[([@*])\]", v)
    if m:
        return st.arrays.get(m.group(1), []), True
    m = re.fullmatch(r"([A-Za-z_]\w*|\d+)(?:(:?[-=])(.*))?", v, re.S)
    if not m:
        return placeholder("_".join(v.split())[:40]), False
    name, op, default = m.group(1), m.group(2), m.group(3)
    cur = st.vars.get(name)
    if name in st.arrays:
        cur = " ".join(st.arrays[name][:1])
    if op and (cur is None or (op.startswith(":") and cur == "")):
        val = " ".join(expand(st, t) for t in lex(default) if t[0] == "word")
        if op.endswith("="):
            st.vars[name] = val
        return val, False
    return (cur if cur is not None else placeholder(name)), False


def _arith(st, expr):
    names = []

    def sub(m):
        val = st.vars.get(m.group(1).lstrip("$"))
        if val is None or not re.fullmatch(r"-?\d+", val):
            names.append(m.group(1).lstrip("$"))
            return "0"
        return val
    e = re.sub(r"\$?([A-Za-z_]\w*)", sub, expr)
    e = re.sub(r"\$\{([A-Za-z_]\w*)\}", sub, e)
    if names or not re.fullmatch(r"[\d\s+\-*/%()]*", e) or len(e) > 200:
        return placeholder(names[0] if names else "((" + "".join(expr.split())[:40] + "))")
    try:
        tree = ast.parse(e.strip().replace("/", "//"), mode="eval")
        if any(not isinstance(n, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.operator, ast.unaryop))
               for n in ast.walk(tree)):
            raise ValueError
        return str(_eval(tree.body))
    except (ValueError, ZeroDivisionError, SyntaxError, OverflowError):
        return placeholder("((" + "".join(expr.split())[:40] + "))")


def _eval(n):
    """Whole-number arithmetic of a parsed $((...)): + - * // % and signs, nothing else."""
    if isinstance(n, ast.Constant) and isinstance(n.value, int):
        return n.value
    if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd)):
        return -_eval(n.operand) if isinstance(n.op, ast.USub) else _eval(n.operand)
    if isinstance(n, ast.BinOp):
        a, b = _eval(n.left), _eval(n.right)
        if max(abs(a), abs(b)) > 1 << 62:
            raise OverflowError
        ops = {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}
        if type(n.op) in ops:
            return ops[type(n.op)]
        if isinstance(n.op, (ast.FloorDiv, ast.Mod)):
            return a // b if isinstance(n.op, ast.FloorDiv) else a % b
    raise ValueError


def expand(st, word, split=False):
    """A word's text (split=False: one string, quotes kept together) or its words (split=True: an
    unquoted expansion split on whitespace, an array's elements one word each)."""
    words, cur, has = [], [], False
    for part in word[1]:
        val, many = _value(st, part)
        quoted = part[2]
        if many:
            items = val if quoted else [w for x in val for w in x.split()]
            if items:
                cur.append(items[0])
                if len(items) > 1:
                    words.append("".join(cur))
                    words += items[1:-1]
                    cur = [items[-1]]
                has = True
            continue
        if quoted or part[0] == "lit" or not split:
            cur.append(val)
            has = True
            continue
        pieces = val.split()
        if val[:1].isspace() and cur:
            words.append("".join(cur))
            cur = []
        for k, p in enumerate(pieces):
            cur.append(p)
            has = True
            if k < len(pieces) - 1:
                words.append("".join(cur))
                cur = []
        if val[-1:].isspace() and cur:
            words.append("".join(cur))
            cur = []
    if cur or (has and not words and any(p[2] for p in word[1])):
        words.append("".join(cur))
    return words if split else " ".join(words)
