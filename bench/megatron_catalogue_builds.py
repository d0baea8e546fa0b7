"""Megatron-Core builds each catalogue decoder sapp exports to Megatron, with sapp's parameter count.

    python -m bench.megatron_catalogue_builds [GIT_DIR] [--tag core_v0.16.1] [--only a,b]

For every causal-LM model type of transformers' catalogue (tests/emit_workers/hf_catalogue_models.py: its
shrunk default config, as bench/hf_catalogue.py builds it), written as a config.json:
  1. sapp resolves and captures the HF model (its parameter count: graph.meta["params"]);
  2. `sapp search --target megatron` on one H100 (engines.best_plan) and `sapp export` (engines.export_plan)
     write the argument file, or refuse in one line (the row says why);
  3. a child process runs the release's own code on that file: Megatron-LM's parse_args and validate_args,
     core_transformer_config_from_args, and pretrain_gpt's gpt_builder (gpt_builders.py), which builds the
     GPTModel on the meta device (Megatron-Core from the release tree, local layers: no Transformer Engine);
     its parameters are counted.
One row per model type: sapp's count, Megatron-Core's, and whether they are equal.  Arguments added to the
export, as bench/megatron_accepts.py adds them (`--tokenizer-type NullTokenizer --mock-data --train-iters 1`),
`--transformer-impl local`, `--no-rope-fusion`, `--no-persist-layer-norm` and
`--no-gradient-accumulation-fusion` (no Transformer Engine or Apex here:
its kernels, the same parameters); the MoE dispatcher is set to
allgather after validation (the all-to-all one opens a CUDA stream when built; no parameters either way), and
the experts built as SequentialMLP (the grouped GEMM's package is absent; the same weights); the device
the rope tables of multi-latent attention are made on is the CPU (torch.cuda.current_device answers "cpu"),
and MLA's k/v widths are not handed to the local core attention, which takes none (it holds no parameters; in
core_v0.16.1 only Transformer Engine's core attention runs MLA).  A model type
sapp writes no engine model of is refused before capture (sapp/engines/arch_hf.refuse_type).
Not in the test suite: it needs the fetched Megatron-LM (GIT_DIR, default /work/.mirror/NVIDIA+Megatron-LM/repo).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DEFAULT_GIT = "/work/.mirror/NVIDIA+Megatron-LM/repo"
EXTRA = ["--tokenizer-type", "NullTokenizer", "--mock-data", "--train-iters", "1", "--transformer-impl", "local",
         "--no-rope-fusion", "--no-persist-layer-norm", "--no-gradient-accumulation-fusion"]

_CHILD = r"""
import contextlib, io, json, os, sys, types, warnings
warnings.simplefilter("ignore")
root, argv = sys.argv[1], json.loads(sys.argv[2])
import importlib.util, torch
if importlib.util.find_spec("six") is None:        # the release's BERT tokenizer module imports six at its top
    sys.modules["six"] = types.ModuleType("six")   # (beside _vocab_size_with_padding; nothing here calls it)
torch.cuda.get_device_capability = lambda *a, **k: (9, 0)     # no GPU here: an H100 answers
torch.cuda.current_device = lambda: "cpu"    # (MLA's RotaryEmbedding puts its frequency table there)
holder = {}
pkg = types.ModuleType("megatron.training")
pkg.__path__ = [root + "/megatron/training"]
pkg.get_args = lambda: holder["args"]
pkg.get_timers = pkg.get_adlr_autoresume = None
pkg.print_rank_0 = lambda *a, **k: None
sys.modules["megatron.training"] = pkg
import megatron.core
assert megatron.core.__file__.startswith(root), megatron.core.__file__
import megatron.training.arguments as margs
margs.get_device_arch_version = lambda: 9
out = {}
try:
    sys.argv = ["pretrain_gpt.py"] + argv
    with contextlib.redirect_stdout(io.StringIO()):
        args = margs.parse_args()
        margs.validate_args(args)
    from megatron.training.tokenizer.tokenizer import _vocab_size_with_padding
    args.padded_vocab_size = _vocab_size_with_padding(args.vocab_size, args)
    args.use_cpu_initialization, args.perform_initialization = True, False
    args.moe_token_dispatcher_type = "allgather"
    args.moe_grouped_gemm = False     # (SequentialMLP: the grouped GEMM's weights, without its package)
    holder["args"] = args
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    ps.initialize_model_parallel(1, 1)
    # Megatron-Core's local core attention (DotProductAttention) takes no k/v widths, which MLA passes: it holds
    # no parameters and does not run here, so the widths are dropped for the count (Transformer Engine's takes them)
    from megatron.core.transformer import dot_product_attention as dpa
    init = dpa.DotProductAttention.__init__
    def _init(self, *a, k_channels=None, v_channels=None, **k):
        init(self, *a, **k)
    dpa.DotProductAttention.__init__ = _init
    import megatron.core.transformer.multi_latent_attention as mla
    if importlib.util.find_spec("transformer_engine") is None:
        mla.HAVE_TE = False      # (its import of the TE extension module succeeds without TE; TELinear is no class)
    from gpt_builders import gpt_builder
    with torch.device("meta"):
        model = gpt_builder(args, pre_process=True, post_process=True)
    out["total"] = sum(p.numel() for p in model.parameters())
    out["rope"] = type(getattr(model, "rotary_pos_emb", None)).__name__
except BaseException as e:
    import traceback
    f = traceback.extract_tb(e.__traceback__)[-1]
    out["error"] = f"{type(e).__name__}: {str(e)[:300]} (at {os.path.relpath(f.filename, root)}:{f.lineno})"
print(json.dumps(out))
"""


def extract(git_dir: str, tag: str, dest: str) -> str:
    """The release's megatron/ tree and gpt_builders.py under `dest`; returns the commit."""
    commit = subprocess.run(["git", "--git-dir", git_dir, "rev-parse", f"{tag}^{{commit}}"], check=True,
                            capture_output=True, text=True).stdout.strip()
    archive = Path(dest) / "release.tar"
    subprocess.run(["git", "--git-dir", git_dir, "archive", "-o", str(archive), commit, "megatron", "gpt_builders.py"],
                   check=True)
    with tarfile.open(archive) as t:
        t.extractall(dest, filter="data")
    return commit


def build_count(tree: str, text: str) -> dict:
    """Megatron-Core's parameter count of the GPT model pretrain_gpt builds from the argument file `text`."""
    from bench.megatron_accepts import argv_of
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    env.update(PYTHONPATH=tree, WORLD_SIZE="1", RANK="0", CUDA_DEVICE_MAX_CONNECTIONS="1")
    r = subprocess.run([sys.executable, "-c", _CHILD, tree, json.dumps(argv_of(text) + EXTRA)], env=env,
                       capture_output=True, text=True, cwd=tree, timeout=600)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": "child failed: " + r.stderr.strip()[-800:]}


def export(model_type: str, tmp: str) -> tuple:
    """(sapp's parameter count, the Megatron argument file or None, why not) of the shrunk catalogue model."""
    import sapp.engines as E
    from sapp import api
    from sapp.engines.arch_hf import refuse_type
    from tests.emit_workers import hf_catalogue_models as C
    try:
        refuse_type(model_type)
    except E.EngineError as e:
        return None, None, str(e).split(":")[0]
    d = Path(tmp) / model_type
    C._config(model_type).save_pretrained(d)
    path = str(d / "config.json")
    try:
        module = api.resolve_model(path)[0]
        graph = api.capture_graph(module)[0]
    except Exception as e:      # noqa: BLE001 - the row says what failed
        return None, None, f"capture: {type(e).__name__}: {str(e)[:120]}"
    params = graph.meta["params"]
    cl = api.resolve_cluster("h100-80g:devices=1")
    try:
        plan = E.best_plan(graph, cl, "megatron", global_batch=None, model=path, constraints={},
                           settings={"runtime": "fused"})
        text, _, _ = E.export_plan(plan, "megatron", graph=graph, cluster=cl)
    except E.EngineError as e:
        return params, None, str(e).replace(path, "config.json")[:160]
    return params, text, None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.megatron_catalogue_builds", description=__doc__.split("\n")[0])
    p.add_argument("git_dir", nargs="?", default=DEFAULT_GIT)
    p.add_argument("--tag", default="core_v0.16.1")
    p.add_argument("--only", help="model types, comma-separated")
    a = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    from tests.emit_workers import hf_catalogue_models as C
    types_ = [mt for mt, (task, _) in C.catalogue().items() if task == "causal"]
    if a.only:
        types_ = [mt for mt in types_ if mt in a.only.split(",")]
    built = equal = refused = 0
    with tempfile.TemporaryDirectory() as tmp:
        commit = extract(a.git_dir, a.tag, tmp)
        print(f"Megatron-LM {a.tag} ({commit[:12]}); {len(types_)} causal-LM types; added: {' '.join(EXTRA)}")
        print("| model type | sapp params | Megatron-Core params | equal |")
        print("|---|---|---|---|")
        for mt in types_:
            params, text, why = export(mt, tmp)
            if text is None:
                refused += 1
                print(f"| {mt} | {params if params is None else f'{params:,}'} | (export refused: {why}) | — |")
                continue
            got = build_count(tmp, text)
            built += "total" in got
            ok = got.get("total") == params
            equal += ok
            print(f"| {mt} | {params:,} | {got['total']:,} ({got['rope']}) | {'yes' if ok else 'NO'} |" if "total" in got
                  else f"| {mt} | {params:,} | (build failed: {got['error']}) | NO |")
            sys.stdout.flush()
    print(f"exported and built {built}, equal {equal}; export refused {refused} of {len(types_)}")
    return 0 if built == equal else 1


if __name__ == "__main__":
    sys.exit(main())
