"""Megatron-LM's own training argument parser on sapp's Megatron exports, and Megatron's own memory
estimate of each beside sapp's predicted peak and the device's usable memory.

    python -m bench.megatron_accepts [GIT_DIR] [--tag core_v0.16.1] [--only CASE]

GIT_DIR is a fetched Megatron-LM git directory (default /work/.mirror/NVIDIA+Megatron-LM/repo).
The four exports are the ones tests/test_engines_params.py builds (same models, clusters, pins,
`--target megatron`, fused runtime): GPT-3 175B, Llama-3-70B with cp 2, a Llama-3-8B `--hf-config`
at 32K tokens and Mixtral-8x7B with ep 8.

For each, a child process runs the release's `parse_args()` (argv: the export's arguments) and
`validate_args(args)` with WORLD_SIZE set to the cluster's device count and RANK=0, the way
Megatron's launcher sets them (megatron/training/arguments.py reads both from the environment), and
the variables of the export's `# environment:` line (CUDA_DEVICE_MAX_CONNECTIONS=1, which
validate_args asserts under tp or cp on GPUs before Blackwell).
The release's megatron/ tree is extracted to a temporary folder and run with megatron.training's
package __init__ replaced by an empty module (as bench/megatron_arg_list.py does), so no GPU,
Triton or Transformer Engine is needed; the two device queries validate_args makes
(megatron.training.utils.get_device_arch_version, torch.cuda.get_device_capability) answer with the
compute capability of the cluster's GPU (A100: 8, H100: 9).  For main (`--tag HEAD` of a fetched
repository), which imports Triton kernels while building the parser and uses Python 3.12's
typing.override, megatron modules importing triton at their top are replaced by inert stand-ins when
Triton is absent, and typing.override by a no-op on Python 3.11.  Arguments added that are not about the step:
`--tokenizer-type NullTokenizer` (the export states `--vocab-size`, which only a null tokenizer
reads; a real run names its own tokenizer), `--mock-data` (validate_args asserts exactly one data
source), and `--train-iters 1` (the run length; validate_args derives the schedules from it).
If accepted, the release's own `report_theoretical_memory(args, num_microbatches)` runs on the
validated arguments; `args.padded_vocab_size` is set by the release's `_vocab_size_with_padding` on
the exported vocabulary (what build_tokenizer does for a tokenizer of exactly that many tokens; the
null tokenizer would add one end-of-document token).  Megatron prints MB = MiB; the table is in GiB.
Not in the default test suite: it needs the fetched Megatron-LM.

bench/RESULTS.md §16's run: core_v0.16.1 at commit 55ac7082517c; `--tag HEAD` (main at d98e8a64dd)
accepts all four exports too."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from bench.megatron_arg_list import TRAINING_STUB

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_GIT = "/work/.mirror/NVIDIA+Megatron-LM/repo"
EXTRA = ["--tokenizer-type", "NullTokenizer", "--mock-data", "--train-iters", "1"]

_CHILD = r"""
import argparse, contextlib, io, json, os, sys, types, warnings
warnings.simplefilter("ignore")
root, argv, major = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
import importlib.util, re, torch
if importlib.util.find_spec("triton") is None:     # main imports Triton kernels at parse time; none run here
    class _Any(types.ModuleType):
        __path__ = []
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Any(self.__name__ + "." + name)
        def __call__(self, *a, **k):
            return a[0] if len(a) == 1 and callable(a[0]) and not k else self
    class _Finder:       # a megatron module that imports triton at its top is replaced by a stand-in
        def find_spec(self, name, path=None, target=None):
            if not name.startswith("megatron."):
                return None
            f = os.path.join(root, *name.split(".")) + ".py"
            if os.path.isfile(f) and re.search(r"^(import triton|from triton)", open(f).read(), re.M):
                return importlib.util.spec_from_loader(name, self)
        def create_module(self, spec):
            return _Any(spec.name)
        def exec_module(self, module):
            pass
    sys.meta_path.insert(0, _Finder())
if importlib.util.find_spec("six") is None:        # the release's BERT tokenizer module imports six at its top
    sys.modules["six"] = types.ModuleType("six")   # (read beside _vocab_size_with_padding; nothing here calls it)
import typing
if not hasattr(typing, "override"):                # main uses Python 3.12's typing.override (a no-op marker)
    typing.override = lambda f: f
torch.cuda.get_device_capability = lambda *a, **k: (major, 0)     # no GPU here: the cluster's GPU answers
"""  + TRAINING_STUB + r"""import megatron.training.arguments as margs
from megatron.training.arguments import parse_args, validate_args
margs.get_device_arch_version = lambda: major
out = {"accepted": False}
sys.argv = ["pretrain_gpt.py"] + argv
log = io.StringIO()
try:
    with contextlib.redirect_stdout(log):
        args = parse_args()
        validate_args(args)
    out["accepted"] = True
except SystemExit as e:          # argparse: unknown flag or bad value (message on stderr)
    out["error"] = f"argparse exit {e.code}"
except BaseException as e:
    import traceback; traceback.print_exc()
    f = traceback.extract_tb(e.__traceback__)[-1]
    out["error"] = f"{type(e).__name__}: {e} (at {os.path.relpath(f.filename, root)}:{f.lineno}: {f.line})"
if out["accepted"]:
    out["derived"] = {k: getattr(args, k, None) for k in (
        "world_size", "data_parallel_size", "tensor_model_parallel_size", "pipeline_model_parallel_size",
        "context_parallel_size", "expert_model_parallel_size", "virtual_pipeline_model_parallel_size",
        "sequence_parallel", "recompute_granularity", "recompute_method", "recompute_num_layers",
        "num_query_groups", "ffn_hidden_size", "kv_channels", "grad_reduce_in_bf16", "accumulate_allreduce_grads_in_fp32",
        "moe_token_dispatcher_type", "moe_grouped_gemm", "use_distributed_optimizer", "params_dtype",
        "moe_shared_expert_gate", "moe_router_pre_softmax", "moe_layer_freq", "pipeline_model_parallel_layout",
        "recompute_modules", "expert_tensor_parallel_size")}
    out["derived"] = {k: (str(v) if not isinstance(v, (int, float, str, bool, type(None))) else v)
                      for k, v in out["derived"].items()}
    try:
        try:
            from megatron.training.tokenizer.tokenizer import _vocab_size_with_padding
        except ImportError:      # main moved it
            from megatron.core.tokenizers.utils.build_tokenizer import vocab_size_with_padding as _vocab_size_with_padding
        from megatron.training.theoretical_memory_usage import report_theoretical_memory
        import megatron.training.theoretical_memory_usage as tmu
        tmu.print_rank_0 = lambda *a, **k: None
        with contextlib.redirect_stdout(log):
            args.padded_vocab_size = _vocab_size_with_padding(args.vocab_size, args)
            m = args.global_batch_size // (args.micro_batch_size * args.data_parallel_size)
            w, act, tot = report_theoretical_memory(args, num_microbatches=m)
        out.update(padded_vocab=args.padded_vocab_size, microbatches=m, weights_mib=w, activation_mib=act,
                   total_mib=tot, estimator="release")
    except BaseException as e:
        out["estimate_error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def extract(git_dir: str, tag: str, dest: str) -> str:
    """The release's megatron/ tree under `dest`; returns the commit."""
    commit = subprocess.run(["git", "--git-dir", git_dir, "rev-parse", f"{tag}^{{commit}}"], check=True,
                            capture_output=True, text=True).stdout.strip()
    archive = Path(dest) / "megatron.tar"
    subprocess.run(["git", "--git-dir", git_dir, "archive", "-o", str(archive), commit, "megatron"], check=True)
    with tarfile.open(archive) as t:
        t.extractall(dest, filter="data")
    return commit


def argv_of(text: str) -> list[str]:
    """The export's arguments as a command line: every non-comment line, split on whitespace."""
    out = []
    for ln in text.splitlines():
        ln = ln.strip()
        if ln and not ln.startswith("#"):
            out += ln.split()
    return out


def capability(cluster_name: str) -> int:
    """The compute capability major of the cluster's GPU (validate_args asks the device for it)."""
    for prefix, major in (("a100", 8), ("h100", 9), ("h200", 9), ("b200", 10), ("gb200", 10)):
        if cluster_name.lower().startswith(prefix):
            return major
    raise SystemExit(f"no compute capability known for cluster {cluster_name!r}")


def environment_of(text: str) -> dict:
    """The variables the export's `# environment: K=V ...` line asks the launcher to set."""
    env = {}
    for ln in text.splitlines():
        if ln.startswith("# environment:"):
            env.update(kv.split("=", 1) for kv in ln.split(":", 1)[1].split() if "=" in kv)
    return env


def run_megatron(tree: str, argv: list[str], world: int, major: int, extra_env: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    env.update(extra_env, PYTHONPATH=tree, WORLD_SIZE=str(world), RANK="0")
    r = subprocess.run([sys.executable, "-c", _CHILD, tree, json.dumps(argv), str(major)], env=env, capture_output=True,
                       text=True, cwd=tree, timeout=600)
    try:
        res = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"accepted": False, "error": "child failed: " + r.stderr.strip()[-1500:]}
    if res.get("error", "").startswith("argparse exit"):
        res["error"] += ": " + r.stderr.strip().splitlines()[-1]
    return res


def export(case: str, fit=False):
    """(text, plan, cluster) of tests/test_engines_params.py's case; `fit`: searched with
    --fit-engine-estimate (tests/test_engines_estimate_fit.py)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import test_engines_params as T
    from sapp import api
    if fit:
        import test_engines_estimate_fit as F
        text, plan, _ = F._export(case, fit if isinstance(fit, str) else True)
    else:
        text, plan, _ = T._export(case)
    return text, plan, api.resolve_cluster(T.CASES[case][1])


def fallback_estimate(text: str, world: int, tag: str, completed: bool = False) -> dict:
    from sapp.engines.megatron_estimate import estimate
    from sapp.engines.megatron import tokens
    a = tokens(text)
    e = estimate(a, world_size=world, vocab=int(a["--vocab-size"]), version=tag if tag == "core_v0.16.1" else "main",
                 completed=completed)
    return {"weights_mib": e["weights_mb"], "activation_mib": e["activation_mb"], "total_mib": e["total_mb"],
            "estimator": "sapp/engines/megatron_estimate.py"}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.megatron_accepts", description=__doc__.split("\n")[0])
    p.add_argument("git_dir", nargs="?", default=DEFAULT_GIT)
    p.add_argument("--tag", default="core_v0.16.1")
    p.add_argument("--only", help="cases whose name contains this text")
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--fit-engine-estimate", nargs="?", const="main", choices=("main", "core_v0.16.1"),
                   help="the exports searched with `sapp search --target megatron --fit-engine-estimate [FORMULA]`")
    a = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "tests"))
    import test_engines_params as T
    gib = 1024 ** 3
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        commit = extract(a.git_dir, a.tag, tmp)
        print(f"Megatron-LM {a.tag} ({commit}); added arguments: {' '.join(EXTRA)}")
        print("| export | GPUs | accepted | Megatron estimate GiB, release (weights+optimizer / activations) | "
              "estimate GiB, main's formula (port) | main's formula completed GiB | sapp peak GiB | usable GiB | release estimate fits |")
        print("|---|---|---|---|---|---|---|---|---|")
        for case in T.CASES:
            if a.only and a.only not in case:
                continue
            text, plan, cl = export(case, a.fit_engine_estimate)
            res = run_megatron(tmp, argv_of(text) + EXTRA, cl.devices, capability(cl.name), environment_of(text))
            if res["accepted"] and "total_mib" not in res:
                res.update(fallback_estimate(text, cl.devices, a.tag))
            main_est = fallback_estimate(text, cl.devices, "main")["total_mib"] * 2 ** 20
            done = fallback_estimate(text, cl.devices, "main", completed=True)["total_mib"] * 2 ** 20
            peak = plan["predicted"]["peak_memory_bytes"]
            row = {"case": case, "gpus": cl.devices, "sapp_peak_gib": peak / gib, "usable_gib": cl.usable_memory / gib,
                   "main_port_gib": main_est / gib, "completed_gib": done / gib, **res}
            rows.append(row)
            if res["accepted"]:
                est = res["total_mib"] * 2 ** 20
                e = (f"{est / gib:.1f} ({res['weights_mib'] / 1024:.1f} / {res['activation_mib'] / 1024:.1f})"
                     + ("" if res.get("estimator") == "release" else " [port]"))
                fits = "yes" if est <= cl.usable_memory else "NO"
                acc = "yes"
            else:
                e, fits, acc = "—", "—", f"NO: {res['error']}"
            print(f"| {case} | {cl.devices} | {acc} | {e} | {main_est / gib:.1f} | {done / gib:.1f} | {peak / gib:.1f} | "
                  f"{cl.usable_memory / gib:.1f} | {fits} |")
            if res.get("estimate_error"):
                print(f"  (release estimator failed: {res['estimate_error']}; port used)")
            sys.stdout.flush()
    if a.json:
        Path(a.json).write_text(json.dumps({"tag": a.tag, "commit": commit, "extra": EXTRA, "rows": rows}, indent=1))
    return 0 if all(r["accepted"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
