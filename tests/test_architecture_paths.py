"""Every repository path docs/ARCHITECTURE.md names exists, so the map does not rot as files move."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH = re.compile(r"(?<![\w/.-])((?:sapp|bench|tests|docs)/[\w./-]*\w)")


def named_paths(text):
    """The paths under sapp/, bench/, tests/ and docs/ a text names.  A template names its folder
    (`sapp/costmodel/<name>.py`: sapp/costmodel); a name cut by a placeholder (`ops_<family>.py`) is skipped."""
    out = set()
    for m in PATH.finditer(text):
        if text[m.end():m.end() + 1] == "<":
            continue
        out.add(m.group(1).rstrip("."))
    return out


def test_named_paths_reads_paths_and_skips_templates():
    text = "see `sapp/emit/recipe.py`, `sapp/emit/steps/`, `sapp/costmodel/<name>.py`, `sapp/capture/ops_<f>.py`; bench/run.py."
    assert named_paths(text) == {"sapp/emit/recipe.py", "sapp/emit/steps", "sapp/costmodel", "bench/run.py"}


def test_every_path_in_the_architecture_map_exists():
    with open(os.path.join(ROOT, "docs", "ARCHITECTURE.md")) as f:
        paths = named_paths(f.read())
    assert len(paths) > 50
    missing = sorted(p for p in paths if not os.path.exists(os.path.join(ROOT, p)))
    assert not missing, f"docs/ARCHITECTURE.md names paths that do not exist: {missing}"
