"""Every flag of Megatron-LM's training argument parser at one release, with its default, stored as
test data (tests/data/megatron_<tag>_args.json) for tests/test_engines_megatron_fields.py: the
training arguments live in megatron/training/arguments.py, which the megatron-core package does not
ship, so the list is taken from a fetched Megatron-LM git directory.

    python -m bench.megatron_arg_list GIT_DIR [TAG]      (TAG: core_v0.16.1)

Half of the flags are not `add_argument` calls in arguments.py: ArgumentGroupFactory turns the fields
of TransformerConfig, TrainingConfig, LoggerConfig and other dataclasses into flags (a bool field
whose default is True becomes --no-X and --disable-X), so reading the source's `add_argument` calls
misses them.  The list is therefore the parser Megatron itself builds: the release's megatron/ tree is
extracted to a temporary folder and `add_megatron_arguments` (the function `parse_args` calls) runs
there in a child process, with megatron.training's package __init__ (which imports the whole training
loop and Triton kernels) replaced by an empty module, so it runs on a CPU-only machine.
pretrain_gpt.py adds flags only when NVIDIA ModelOpt is installed (add_modelopt_args); those are not
in the list, and sapp refuses them as unknown."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

# megatron.training's package __init__ starts a training run's globals: an empty package of the same
# path lets its arguments module import alone, from the release tree `root` (both child scripts)
TRAINING_STUB = r"""
pkg = types.ModuleType("megatron.training")
pkg.__path__ = [root + "/megatron/training"]
for name in ("get_args", "get_timers", "get_adlr_autoresume"):   # what megatron/training/utils.py imports
    setattr(pkg, name, None)
sys.modules["megatron.training"] = pkg
import megatron.core
assert megatron.core.__file__.startswith(root), megatron.core.__file__
"""

_CHILD = r"""
import argparse, enum, json, sys, types, warnings
warnings.simplefilter("ignore")
root = sys.argv[1]
"""  + TRAINING_STUB + r"""from megatron.training.arguments import add_megatron_arguments
parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))

def plain(v):
    if isinstance(v, enum.Enum):
        return v.name
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)

out = []
for group in parser._action_groups:
    for a in group._group_actions:
        if not a.option_strings or a.dest == "help":
            continue
        nargs = 0 if a.nargs == 0 else 1 if a.nargs is None else a.nargs
        out.append({"flags": list(a.option_strings), "dest": a.dest, "default": plain(a.default),
                    "nargs": nargs, "choices": plain(list(a.choices)) if a.choices is not None else None,
                    "group": group.title})
print(json.dumps(out))
"""


def extract(git_dir: str, tag: str) -> dict:
    """{"version", "commit", "source", "flags": [...]}: the parser's flags at `tag`."""
    commit = subprocess.run(["git", "--git-dir", git_dir, "rev-parse", f"{tag}^{{commit}}"], check=True,
                            capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "megatron.tar"
        subprocess.run(["git", "--git-dir", git_dir, "archive", "-o", str(archive), commit, "megatron"], check=True)
        with tarfile.open(archive) as t:
            t.extractall(tmp, filter="data")
        env = dict(os.environ, PYTHONPATH=tmp)
        res = subprocess.run([sys.executable, "-c", _CHILD, tmp], env=env, capture_output=True, text=True, cwd=tmp)
        if res.returncode:
            raise SystemExit(f"building Megatron-LM's parser failed:\n{res.stderr[-3000:]}")
        flags = json.loads(res.stdout.strip().splitlines()[-1])
    return {"version": tag, "commit": commit,
            "source": "megatron/training/arguments.py add_megatron_arguments (the parser parse_args builds)",
            "regenerate": f"python -m bench.megatron_arg_list <Megatron-LM git dir> {tag}", "flags": flags}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        raise SystemExit(__doc__.split("\n\n")[1])
    tag = argv[1] if len(argv) > 1 else "core_v0.16.1"
    data = extract(argv[0], tag)
    out = Path(__file__).resolve().parent.parent / "tests" / "data" / f"megatron_{tag}_args.json"
    head = {k: v for k, v in data.items() if k != "flags"}
    body = ",\n".join("  " + json.dumps(f) for f in data["flags"])      # one argument per line
    out.write_text(json.dumps(head, indent=1)[:-2] + ',\n "flags": [\n' + body + "\n ]\n}\n")
    n = sum(len(f["flags"]) for f in data["flags"])
    print(f"{len(data['flags'])} arguments ({n} flag spellings) of Megatron-LM {tag} ({data['commit'][:12]}) -> {out}")


if __name__ == "__main__":
    main()
