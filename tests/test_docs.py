"""The documents run as shown.  Every fenced command of README.md and docs/*.md is run, page by page in
its own directory, and must exit 0 with the output the page shows; docs/cli.md must be what
`python -m sapp.commands.cli_reference` writes today.

How a page shows a command (the reader sees a terminal session):
  - in a fenced block, a line `$ COMMAND` is a command (a trailing backslash continues it on the next
    line); the lines after it, up to the next `$ `, are its output.  A shown line must match a line of
    the real output, in order; `...` on a line of its own stands for any number of lines, and `...`
    inside a line for any text (a timing, a path).  A command the page shows without `$` (a template
    with placeholders, a multi-node line) is a line starting with `sapp ` in a fenced block;
  - a ```python block of `>>>` examples runs as a doctest (ELLIPSIS, NORMALIZE_WHITESPACE).
A command that is not run here is listed in NOT_RUN with the reason; one that trains for long or
searches for long is in SLOW and runs under `pytest -m slow`.  A listed command that no page shows any
more fails the test, so the lists cannot go stale."""
import doctest
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted("docs/" + f for f in os.listdir(os.path.join(ROOT, "docs"))
                               if f.endswith(".md") and f != "cli.md")

# commands a page shows that this test does not run, and why
NOT_RUN = {
    "pytest": "the suite itself",
    "sapp calibrate --out me.json": "times this machine's kernels and collectives for about a minute; "
                                    "tests/test_calibrate.py covers it",
    "sapp calibrate --quick --out me.json": "micro-benchmarks whose numbers are this machine's; tests/test_calibrate.py",
}
# templates: a page shows them with placeholders (NODE0, mypkg, your own files) or for several machines
TEMPLATE_MARKERS = ("NODE0", "mypkg", "NODE_RANK", "...")

# commands run only under `pytest -m slow` (each over ~10 s on 2 cores)
SLOW = {
    "sapp run tiny.json --steps 6 --checkpoint-dir ckpt --resume": "a second training run (resume)",
    "sapp run tiny-pp2.json --steps 6 --checkpoint-dir ckpt2 --resume ckpt/step-00000004": "a third training run",
    "PYTHONPATH=docs/examples sapp run mine.json --model mymodel:build --steps 2": "a training run (README runs one)",
    "sapp import --from megatron bench/megatron_args/gpt_175b_1536gpus.args --model gpt3-175b "
    "--cluster a100-80g:devices=1536 --out mine.json --best-out best.json":
        "the comparison searches GPT-3 175B on 1536 GPUs (about a minute)",
}


# ---- reading the pages ---------------------------------------------------------------------------

def _blocks(text):
    """(language, [lines]) of each fenced block."""
    out, lang, lines = [], None, None
    for line in text.splitlines():
        if line.startswith("```"):
            if lines is None:
                lang, lines = line[3:].strip(), []
            else:
                out.append((lang, lines))
                lines = None
        elif lines is not None:
            lines.append(line)
    return out


def _join(lines, i):
    """The command starting at lines[i] with its backslash continuations, and the next index."""
    cmd = lines[i]
    while cmd.endswith("\\") and i + 1 < len(lines):
        i += 1
        cmd = cmd[:-1].rstrip() + " " + lines[i].strip()
    return cmd, i + 1


def steps(text):
    """A page's steps in order: ("shell", command, expected lines), ("shown", command) or
    ("python", source)."""
    out = []
    for lang, lines in _blocks(text):
        if lang == "python":
            if any(line.lstrip().startswith(">>>") for line in lines):
                out.append(("python", "\n".join(lines) + "\n"))
            continue
        if any(line.startswith("$ ") for line in lines):
            i = 0
            while i < len(lines):
                if lines[i].startswith("$ "):
                    cmd, i = _join(lines, i)
                    expected = []
                    while i < len(lines) and not lines[i].startswith("$ "):
                        expected.append(lines[i].rstrip())
                        i += 1
                    out.append(("shell", cmd[2:].strip(), expected))
                else:
                    i += 1
            continue
        i = 0
        while i < len(lines):
            if lines[i].startswith("sapp "):
                cmd, i = _join(lines, i)
                out.append(("shown", cmd.split("  #")[0].strip()))
            else:
                i += 1
    return out


def _read(page):
    with open(os.path.join(ROOT, page)) as f:
        return f.read()


def _pattern(line):
    return re.compile(".*".join(re.escape(part) for part in line.split("...")))


# a loss printed to 6 decimals differs in its last digit across CPUs (float32 kernels chosen by the
# instruction set): shown figures of 6+ decimals match within one part in a million
_FINE = re.compile(r"-?\d+\.\d{6,}")


def _matches(want, got):
    if _pattern(want).fullmatch(got):
        return True
    shown = [float(x) for x in _FINE.findall(want)]
    if not shown:
        return False
    parts = _FINE.split(want)
    pat = re.compile(r"(-?\d+\.\d+)".join(".*".join(re.escape(p) for p in part.split("...")) for part in parts))
    m = pat.fullmatch(got)
    return bool(m) and all(abs(float(g) - w) <= 1e-6 * max(abs(w), 1.0) for g, w in zip(m.groups(), shown))


def check_output(expected, actual):
    """None when every shown line matches a real line, in order; else what is missing."""
    lines = [line.rstrip() for line in actual.splitlines()]
    pos = 0
    for want in expected:
        if not want.strip() or want.strip() == "...":
            continue
        while pos < len(lines) and not _matches(want, lines[pos]):
            pos += 1
        if pos == len(lines):
            return want
        pos += 1
    return None


# ---- running them --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("sapp-cache"))


def _env(cache_dir):
    bin_dir = os.path.dirname(sys.executable)
    return dict(os.environ, SAPP_CACHE_DIR=cache_dir, COLUMNS="100", PYTHONPATH=ROOT,
                PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))


def _workdir(tmp_path):
    for name in ("tests", "bench", "docs", "constraints.txt"):
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    return str(tmp_path)


def _run_shell(cmd, cwd, env):
    if cmd.startswith("pip install ") and " && " in cmd:
        cmd = cmd.split(" && ", 1)[1]          # the package is installed: run what the install line then runs
    proc = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)
    return proc.returncode, proc.stdout


def _run_python(source, cwd, globs, page):
    old = os.getcwd()
    os.chdir(cwd)
    try:
        test = doctest.DocTestParser().get_doctest(source, globs, page, page, 0)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        out = []
        runner.run(test, out=out.append, clear_globs=False)
        globs.update(test.globs)              # DocTest copies its globals: the page's next block sees these
        return runner.failures, "".join(out)
    finally:
        os.chdir(old)


def _run_page(page, tmp_path, cache_dir, slow):
    cwd, env, globs, ran = _workdir(tmp_path), _env(cache_dir), {}, 0
    for step in steps(_read(page)):
        if step[0] == "python":
            failures, report = _run_python(step[1], cwd, globs, page)
            assert failures == 0, f"{page}: a Python example fails:\n{report}"
            ran += 1
            continue
        cmd = step[1]
        if step[0] == "shown" or cmd in NOT_RUN or any(m in cmd for m in TEMPLATE_MARKERS):
            continue
        if cmd in SLOW and not slow:
            continue
        rc, out = _run_shell(cmd, cwd, env)
        assert rc == 0, f"{page}: `{cmd}` exited {rc}:\n{out[-3000:]}"
        missing = check_output(step[2], out)
        assert missing is None, (f"{page}: `{cmd}` no longer prints the line the page shows:\n  {missing}\n"
                                 f"its output:\n{out[-4000:]}")
        ran += 1
    return ran


@pytest.mark.parametrize("page", PAGES)
def test_page_runs_as_shown(page, tmp_path, cache_dir):
    _run_page(page, tmp_path, cache_dir, slow=False)


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_page_runs_as_shown_with_slow_commands(page, tmp_path, cache_dir):
    _run_page(page, tmp_path, cache_dir, slow=True)


def test_every_shown_command_is_run_or_listed():
    shown = set()
    for page in PAGES:
        for step in steps(_read(page)):
            if step[0] == "python":
                continue
            cmd = step[1]
            shown.add(cmd)
            if step[0] == "shown":
                assert cmd in NOT_RUN or any(m in cmd for m in TEMPLATE_MARKERS), (
                    f"{page}: `{cmd}` is shown without `$ ` and its output: run it and show what it prints, "
                    "or list it in NOT_RUN with the reason")
    stale = sorted(c for c in list(NOT_RUN) + list(SLOW) if c not in shown)
    assert not stale, f"listed in tests/test_docs.py but shown on no page: {stale}"


def test_cli_reference_is_current():
    from sapp.commands.cli_reference import reference
    with open(os.path.join(ROOT, "docs", "cli.md")) as f:
        checked_in = f.read()
    assert checked_in == reference(), ("docs/cli.md differs from the parser's `--help`; regenerate it with\n"
                                       "    python -m sapp.commands.cli_reference > docs/cli.md")


def test_the_matcher_finds_lines_in_order_with_ellipses():
    out = "model gpt-tiny (135 K params)\ntime capture 0.01 s\npredicted step 14.76 ms\n"
    assert check_output(["model gpt-tiny ...", "...", "predicted step 14.76 ms"], out) is None
    assert check_output(["predicted step 14.76 ms", "model gpt-tiny ..."], out) == "model gpt-tiny ..."
    assert check_output(["predicted step 9.99 ms"], out) == "predicted step 9.99 ms"
    loss = "[rank 0] step 1 loss 5.439894 (28.5 ms)\n"
    assert check_output(["[rank 0] step 1 loss 5.439893 (...)"], loss) is None      # last digit of a float32
    assert check_output(["[rank 0] step 1 loss 5.439793 (...)"], loss) == "[rank 0] step 1 loss 5.439793 (...)"
    assert check_output(["[rank 1] step 1 loss 5.439894 (...)"], loss) is not None
    assert steps("```console\n$ sapp a \\\n  --b 1\nout\n$ sapp c\n```\n") == [
        ("shell", "sapp a --b 1", ["out"]), ("shell", "sapp c", [])]


def test_readme_is_a_quick_start():
    assert len(_read("README.md").splitlines()) <= 80
