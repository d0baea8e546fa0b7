"""Megatron-LM's example shell scripts (examples/*/train_*.sh) read as text, never run: the arguments
their launch line (`torchrun ... pretrain_gpt.py ${MODEL_ARGS[@]} ...`) passes to Megatron.

What is read, as bash would expand it: assignments (`NAME=value`, `export NAME=value`), bash arrays
(`X=( --flag v ... )`, `X+=( ... )`, over several lines, `#` comments inside), `$NAME`, `${NAME}`,
`${NAME:-default}` / `${NAME-default}` / `${NAME:=default}`, `${X[@]}` / `${X[*]}`, `$((...))` of whole
numbers, positional parameters (`$1`: unset, so its default applies), quoting (an unquoted expansion
is split into words, a quoted one is not), line continuations and `if / elif / else / fi` whose test
compares strings (`[[ "$A" == "b" ]]`, `[ -n "$X" ]`, `||`, `&&`, `!`).  Anything else a line does
(`mkdir`, `echo`, `set`, `exit` inside a branch) runs nothing here and changes no argument.

A variable the script never sets (a data path from `$1`, `$(dirname ...)`, an environment variable)
becomes a placeholder word `<unset:$NAME>`: fine where no priced flag reads it (megatron.parse refuses
a priced flag whose value holds one, naming the variable).  A test that reads such a variable is
followed both ways, each way to its own launch line (at most MAX_WAYS): the caller compares what
each launch states.  Loops, functions, `case`, `source` and a script without a launch line are
refused in one line."""
from __future__ import annotations

import re

from .mapping import EngineError
from .megatron_shell import NAME_RE, UNSET, State, placeholder, expand, lex

MAX_WAYS = 16
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=")
_REFUSED = {"for", "while", "until", "case", "function", "select", "source", "."}
_LAUNCHERS = ("torchrun", "python", "python3", "srun", "deepspeed", "mpirun")


def is_script(text: str) -> bool:
    """Whether `text` is a shell script rather than a file of flags (an array, a launch line with
    expansions, an assignment or a `#!` line)."""
    return bool(text.startswith("#!") or re.search(r"^\s*(export\s+)?[A-Za-z_]\w*\+?=", text, re.M)
                or "${" in text or re.search(r"^\s*(for|while|until|if|case|function|source|select)\s", text, re.M))


# ---- statements ------------------------------------------------------------------------------------
def _lines(toks):
    """Split the token stream into statements: (words and parentheses up to a newline / `;`), an
    array's parentheses spanning lines kept in one."""
    out, cur, depth = [], [], 0
    for t in toks:
        if t[0] == "(":
            depth += 1
        elif t[0] == ")":
            depth -= 1
        if t[0] == "nl" and depth <= 0:
            if cur:
                out.append(cur)
            cur, depth = [], 0
            continue
        if t[0] != "nl":
            cur.append(t)
    if cur:
        out.append(cur)
    return out


def _head(stmt):
    """The first word's text when it is plain (a keyword or command name), else ""."""
    w = stmt[0]
    return "".join(p[1] for p in w[1]) if w[0] == "word" and all(p[0] == "lit" for p in w[1]) else ""


def _split_keywords(stmts):
    """`then cmd ...` / `else cmd ...` as two statements, so each keyword stands alone."""
    out = []
    for st in stmts:
        if len(st) > 1 and _head(st) in ("then", "else", "do"):
            out += [st[:1], st[1:]]
        else:
            out.append(st)
    return out


def _refuse_unsupported(st, h):
    if h in _REFUSED or (len(st) > 2 and st[1][0] == "(" and st[2][0] == ")" and NAME_RE.fullmatch(h)):
        what = "a function" if h not in _REFUSED else f"`{h}`"
        raise EngineError(f"the shell script uses {what}, which sapp does not follow; give Megatron's arguments "
                          f"as a file of flags (or the launch line with its arrays)")


def _blocks(stmts, i=0, stop=("fi", "else", "elif")):
    """[stmt or ("if", [(cond, body), ...], else_body)] from stmts[i:] up to a stop word; (list, next i)."""
    out = []
    while i < len(stmts):
        st = stmts[i]
        h = _head(st)
        if h in stop:
            return out, i
        _refuse_unsupported(st, h)
        if h != "if":
            out.append(st)
            i += 1
            continue
        arms, els, cond = [], [], st[1:]
        i += 1
        while True:
            if i < len(stmts) and _head(stmts[i]) == "then":
                i += 1
            body, i = _blocks(stmts, i)
            arms.append((cond, body))
            if i >= len(stmts):
                raise EngineError("the shell script has an `if` without its `fi`")
            h2 = _head(stmts[i])
            i += 1
            if h2 == "elif":
                cond = stmts[i - 1][1:]
                continue
            if h2 == "else":
                els, i = _blocks(stmts, i, ("fi",))
                if i >= len(stmts):
                    raise EngineError("the shell script has an `if` without its `fi`")
                i += 1
            break
        out.append(("if", arms, els))
    return out, i


# ---- tests and execution ---------------------------------------------------------------------------
def _compare(ws):
    """True / False / None (unknown) of one `[ ... ]` / `[[ ... ]]` test's inner words."""
    if any(UNSET.search(w) for w in ws):
        return None
    if len(ws) == 1:
        return ws[0] != ""
    if len(ws) == 2 and ws[0] in ("-n", "-z"):
        return (ws[1] != "") == (ws[0] == "-n")
    if len(ws) == 3 and ws[1] in ("==", "=", "!="):
        return (ws[0] == ws[2]) == (ws[1] != "!=")
    return None


def _test(st, cond):
    """True / False / None of an `if` test (string comparisons joined by || / &&), and the unset
    variables it reads."""
    words = [expand(st, t) for t in cond if t[0] == "word"]
    unset = sorted({m for w in words for m in UNSET.findall(w)})
    result, op, group = None, None, []

    def close(res, op, group):
        neg = bool(group) and group[0] == "!"
        g = group[1:] if neg else group
        if len(g) >= 2 and (g[0], g[-1]) in (("[", "]"), ("[[", "]]")):
            v = _compare(g[1:-1])
        else:
            v = None                    # a command's exit status: not run here
        if v is not None and neg:
            v = not v
        if op is None:
            return v
        if op == "&&":
            return False if res is False or v is False else (None if res is None or v is None else True)
        return True if res is True or v is True else (None if res is None or v is None else False)
    for w in words + ["||"]:
        if w in ("||", "&&"):
            result, op, group = close(result, op, group), w, []
        else:
            group.append(w)
    return result, unset


def _assign(st, stmt):
    """Runs the assignments at the start of `stmt`; returns the words left (a command, or [])."""
    k = 0
    while k < len(stmt) and stmt[k][0] == "word":
        w = stmt[k][1]
        lead = ""
        for p in w:
            if p[0] != "lit" or p[2]:
                break
            lead += p[1]
        m = _ASSIGN.match(lead)
        if not m or m.end() > len(lead) or not lead[:m.end()].endswith("="):
            break
        name, add = m.group(1), m.group(2) == "+"
        rest = ("word", w[m.end():])
        if not rest[1] and k + 1 < len(stmt) and stmt[k + 1][0] == "(":
            j = k + 2
            items = []
            while j < len(stmt) and stmt[j][0] != ")":
                if stmt[j][0] == "word":
                    items += expand(st, stmt[j], split=True)
                j += 1
            st.arrays[name] = (st.arrays.get(name, []) if add else []) + items
            st.vars.pop(name, None)
            k = j + 1
            continue
        val = expand(st, rest) if rest[1] else ""
        m = UNSET.fullmatch(val)
        if m and not NAME_RE.fullmatch(m.group(1)):
            val = placeholder(name)        # named for the variable a flag reads (DATA_PATH=$5, X=$(cmd))
        st.vars[name] = (st.vars.get(name, "") + val) if add else val
        st.arrays.pop(name, None)
        k += 1
    return stmt[k:]


def _command(st, stmt):
    while stmt and _head(stmt) in ("export", "declare", "local", "readonly", "typeset"):
        stmt = [t for t in stmt[1:] if not (t[0] == "word" and _head([t]).startswith("-"))]
    rest = _assign(st, stmt)
    if not rest:
        return
    if _head(rest) == "exit":
        st.done = True
        return
    words = [w for t in rest if t[0] == "word" for w in expand(st, t, split=True)]
    py = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
    if py is not None and (py == 0 or words[0].rsplit("/", 1)[-1] in _LAUNCHERS):
        st.launches.append((words[:py + 1], words[py + 1:]))


def _run(blocks, states):
    out = []
    for st in states:
        ways = [st]
        for item in blocks:
            nxt = []
            for s in ways:
                if s.done:
                    nxt.append(s)
                elif isinstance(item, tuple) and item[0] == "if":
                    nxt += _run_if(item, s)
                else:
                    _command(s, item)
                    nxt.append(s)
            if len(nxt) > MAX_WAYS:
                raise EngineError(f"the shell script branches more than {MAX_WAYS} ways on variables it never sets; "
                                  f"set them in the script or give Megatron's arguments as a file of flags")
            ways = nxt
        out += ways
    return out


def _run_if(item, st):
    _, arms, els = item
    ways, pending = [], [st]
    for cond, body in arms:
        left = []
        for s in pending:
            v, unset = _test(s, cond)
            if v is None:
                taken = s.copy()
                taken.why = getattr(s, "why", []) + unset
                s.why = taken.why
                ways += _run(body, [taken])
                left.append(s)
            elif v:
                ways += _run(body, [s])
            else:
                left.append(s)
        pending = left
    return ways + _run(els, pending)


def launch_args(text: str) -> list:
    """[(launcher words, Megatron's argument words, unset variables its tests read)] for each way
    through the script that reaches its launch line (one, unless a test reads an unset variable)."""
    stmts = _split_keywords(_lines(lex(text)))
    blocks, i = _blocks(stmts, 0, ())
    states = _run(blocks, [State()])
    got = []
    for s in states:
        if len(s.launches) > 1:
            raise EngineError(f"the shell script launches a .py {len(s.launches)} times; sapp prices one "
                              f"pretrain_gpt.py launch")
        if s.launches:
            got.append((*s.launches[0], sorted(set(getattr(s, "why", [])))))
    if not got:
        raise EngineError("the shell script has no launch line (`torchrun ... pretrain_gpt.py ...`) that sapp can "
                          "read; give Megatron's arguments as a file of flags")
    return got
