"""torchtitan 0.3 (`--to torchtitan` / `--from torchtitan`): plans exported as the typed Python job
configuration 0.3 launches (`-m torchtitan.train --module M --config F`) and read back with `ast`,
never executed; the same configuration at the same price both ways; every field of 0.3.0's own
config dataclasses (bench/torchtitan_fields/v0.3.0.json, read off them by bench/torchtitan_fields/
extract.py) classified; anything but literal constructor calls refused in one line."""
import inspect
import json
import os

import pytest

import sapp.engines as E
from sapp import api
from sapp.engines import EngineError, torchtitan_py
from sapp.engines.mapping import EngineConfig, price
from sapp.engines.torchtitan_py_fields import CLASSES, FIELDS
from sapp.models.registry import NAMED

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STORED = os.path.join(HERE, "bench", "torchtitan_fields", "v0.3.0.json")
MAIN_NAMES = {("training", "num_tokens_per_microbatch_per_dp_rank"), ("training", "num_tokens_per_train_step"),
              ("training", "max_context_length"), ("parallelism", "num_pp_microbatches")}
CL = "a100-80g:devices=8"


def _stored():
    with open(STORED) as f:
        return json.load(f)


def test_every_torchtitan_03_field_is_classified():
    doc = _stored()
    assert doc["torchtitan"] == "0.3.0" and "release/0.3" in doc["source"]
    listed = {(s, k): v for s, body in doc["sections"].items() for k, v in body["fields"].items()}
    missing = sorted(f"{s}.{k}" for s, k in listed if (s, k) not in FIELDS)
    assert not missing, f"torchtitan 0.3 fields sapp's importer does not classify: {missing}"
    stale = sorted(f"{s}.{k}" for s, k in FIELDS if (s, k) not in listed and (s, k) not in MAIN_NAMES)
    assert not stale, f"classified but not fields of torchtitan 0.3: {stale}"
    src = inspect.getsource(torchtitan_py) + inspect.getsource(E.torchtitan)
    for (s, k), kind in FIELDS.items():
        if kind == "priced":
            assert f'"{k}"' in src, f"{s}.{k} is listed as priced but the parsers never read it"
        elif kind[0] == "refused":
            assert kind[1] == listed[(s, k)], f"{s}.{k}: torchtitan's default {listed[(s, k)]!r}, the table {kind[1]!r}"
        else:
            assert kind[0] == "irrelevant" and len(kind[1]) > 10, (s, k)
    for sec, names in CLASSES.items():
        assert set(names) <= set(doc["sections"][sec]["classes"]), sec


@pytest.fixture(scope="module")
def tiny():
    """gpt3-350m (captured in ~7 s): large enough that tp 2 shards its layers and sp applies."""
    return api.capture_graph(api.resolve_model("gpt3-350m")[0])[0], api.resolve_cluster(CL)


@pytest.mark.parametrize("kw", [
    dict(tp=2, pp=2, dp=2, sp=True, schedule="1f1b", mbs=1, m=4, zero=2, recompute="selective", global_batch=8),
    dict(tp=2, dp=4, sp=False, mbs=2, m=2, zero=3, recompute="full", global_batch=16),
    dict(dp=8, zero=0, mbs=1, m=1, recompute="none", global_batch=8),
    dict(tp=2, dp=2, cp=2, sp=True, zero=3, mbs=1, m=1, recompute="none", global_batch=2),
])
def test_export_reads_back_as_the_same_configuration(tiny, kw):
    graph, cl = tiny
    plan = price(graph, cl, EngineConfig(engine="torchtitan", runtime="torchtitan", **kw), name="gpt3-350m")
    text, exported, notes = E.export_plan(plan, "torchtitan", graph=graph, cluster=cl)
    assert not notes and "def sapp_job() -> Trainer.Config:" in text and "[parallelism]" not in text
    assert f"enable_sequence_parallel={bool(kw.get('sp'))}" in text       # stated, never implied by tp
    back = E.import_config(text, "torchtitan", graph, cl, "gpt3-350m")
    for k in ("tp", "pp", "dp", "cp", "sp"):
        assert back["parallel"].get(k) == plan["parallel"].get(k), k
    for k in ("schedule", "micro_batches", "micro_batch_size"):
        assert back["pipeline"][k] == plan["pipeline"][k], k
    assert (back["zero"], back["recompute"], back["settings"]) == (plan["zero"], plan["recompute"], plan["settings"])
    assert back["predicted"] == plan["predicted"]


def test_a_per_block_mix_is_exported_as_one_policy_and_repriced(tiny):
    graph, cl = tiny
    mix = {f"layers.{i}": "full" if i % 3 == 0 else "none" for i in range(24)}
    plan = price(graph, cl, EngineConfig(engine="torchtitan", runtime="torchtitan", tp=2, dp=4, sp=True, zero=3,
                                         recompute=mix, mbs=2, global_batch=8), name="gpt3-350m")
    assert plan["recompute"]["blocks"]
    text, exported, notes = E.export_plan(plan, "torchtitan", graph=graph, cluster=cl)
    assert any("exported as full on every layer" in n for n in notes)
    assert "activation_checkpoint=FullAC.Config()" in text
    back = E.import_config(text, "torchtitan", graph, cl, "gpt3-350m")
    assert back["recompute"] == exported["recompute"] and back["predicted"] == exported["predicted"]


def test_older_target_keeps_the_toml_and_a_toml_given_as_torchtitan_is_read_as_022(tiny):
    graph, cl = tiny
    plan = price(graph, cl, EngineConfig(engine="torchtitan", runtime="torchtitan", dp=8, zero=3, global_batch=8),
                 name="gpt3-350m")
    toml, _, _ = E.export_plan(plan, "torchtitan@0.2.2", graph=graph, cluster=cl)
    assert "[parallelism]" in toml and "def " not in toml
    back = E.import_config(toml, "torchtitan", graph, cl, "gpt3-350m")
    assert any("torchtitan 0.2.2" in n for n in back["notes"])
    assert back["predicted"] == E.import_config(toml, "torchtitan@0.2.2", graph, cl, "gpt3-350m")["predicted"]


def _job(body, imports=""):
    return ("from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig\n"
            "from torchtitan.distributed.activation_checkpoint import FullAC, MemoryBudgetAC, SelectiveAC\n"
            "from torchtitan.models.llama3 import model_registry\nfrom torchtitan.trainer import Trainer\n" + imports
            + "\n\ndef job() -> Trainer.Config:\n" + "".join(f"    {line}\n" for line in body.splitlines()))


REFUSED = [
    (_job("return Trainer.Config()", imports="import os\n"), "Import statement"),
    (_job("return Trainer.Config()", imports="from os import system\n"), "import from 'os'"),
    (_job("open('/tmp/sapp-executed', 'w')\nreturn Trainer.Config()"), "Expr statement"),
    (_job("return Trainer.Config(training=TrainingConfig(local_batch_size=2 * 4))"), "not a literal"),
    (_job("return Trainer.Config(training=TrainingConfig(local_batch_size=len('ab')))"), "not of a name imported"),
    (_job("return Trainer.Config(training=TrainingConfig(enable_cpu_offload=True))"), "CPU offload"),
    (_job("return Trainer.Config(training=TrainingConfig(bogus=1))"), "training.bogus is not a field"),
    (_job("return Trainer.Config(activation_checkpoint=MemoryBudgetAC.Config())"), "memory-budget"),
    (_job("return Trainer.Config(model_spec=model_registry('70B'))"), "another model"),
    (_job("return Trainer.Config(parallelism=ParallelismConfig(pipeline_parallel_degree=2))"), "CUDA graphs"),
    (_job("return Trainer.Config(training=TrainingConfig(seq_len=32, max_context_length=32))"), "use one release"),
    (_job("c = Trainer.Config()\nfor i in []:\n    pass\nreturn c"), "For statement"),
    ("def a():\n    pass\ndef b():\n    pass\n", "2 job functions; pass --job NAME to pick one: a, b"),
    (_job("return Trainer.Config(parallelism=ParallelismConfig(pipeline_parallel_schedule='1F1B\\n[x]'))"),
     "not a value sapp reads"),
    ("[parallelism\n", "not a Python configuration"),
]


@pytest.mark.parametrize("text,says", REFUSED)
def test_anything_but_literal_constructor_calls_is_refused_in_one_line(tiny, text, says, tmp_path):
    graph, cl = tiny
    with pytest.raises(EngineError) as e:
        E.import_config(text, "torchtitan", graph, cl, "gpt3-350m")
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not os.path.exists("/tmp/sapp-executed")


def _facts(name):
    kind, cfg = NAMED[name]
    meta = {"kind": kind, "config": cfg, "seq": cfg["s"]}
    names = [f"layers.{i}" for i in range(cfg["l"])]
    return {**E.model_facts(meta, names), **E.arch_facts(name, meta, len(names))}


# torchtitan 0.3.0's own llama3_8b job (models/llama3/config_registry.py), as a user's file holds it
PUBLISHED_8B = '''from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.components.optimizer import default_adamw
from torchtitan.components.validate import Validator
from torchtitan.config import TrainingConfig
from torchtitan.distributed.activation_checkpoint import SelectiveAC
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
from torchtitan.models.common.config_utils import decoder_vocab_size
from torchtitan.models.llama3 import model_registry
from torchtitan.tools.profiler import Profiler
from torchtitan.trainer import Trainer


def llama3_8b() -> Trainer.Config:
    model_spec = model_registry("8B")
    return Trainer.Config(
        loss=ChunkedLossWrapper.Config(
            loss_fn=CrossEntropyLoss.Config(
                global_vocab_size=decoder_vocab_size(model_spec),
            ),
        ),
        hf_assets_path="./assets/hf/Llama-3.1-8B",
        profiler=Profiler.Config(
            enable_profiling=True,
            profile_freq=100,
        ),
        metrics=MetricsProcessor.Config(
            enable_tensorboard=True,
        ),
        model_spec=model_spec,
        optimizer=default_adamw(lr=3e-4),
        training=TrainingConfig(
            local_batch_size=1,
            seq_len=8192,
            steps=1000,
        ),
        dataloader=HuggingFaceTextDataLoader.Config(
            dataset="c4",
        ),
        checkpoint=CheckpointManager.Config(interval=500),
        activation_checkpoint=SelectiveAC.Config(),
        validator=Validator.Config(
            freq=500,
            steps=1200,
        ),
    )
'''


def test_published_03_job_reads_and_main_batch_names_read_the_same():
    facts = _facts("llama3-8b")
    ecfg = torchtitan_py.parse(PUBLISHED_8B, facts, 64)
    assert (ecfg.dp, ecfg.tp, ecfg.zero, ecfg.recompute, ecfg.mbs, ecfg.m, ecfg.global_batch) == (
        64, 1, 3, "selective", 1, 1, 64)
    assert any("ChunkedLossWrapper" in n for n in ecfg.notes)
    main = PUBLISHED_8B.replace("local_batch_size=1,", "num_tokens_per_microbatch_per_dp_rank=8192,").replace(
        "seq_len=8192,", "max_context_length=8192,")
    again = torchtitan_py.parse(main, facts, 64)
    assert again.describe() == ecfg.describe() and again.global_batch == ecfg.global_batch
    with pytest.raises(EngineError, match="another model"):
        torchtitan_py.parse(PUBLISHED_8B.replace('"8B"', '"70B"'), facts, 64)


def _registry(call, train=""):
    """PUBLISHED_8B with its model_registry call (and training fields) replaced."""
    return PUBLISHED_8B.replace('model_registry("8B")', call).replace(
        "steps=1000,", "steps=1000," + train).replace(
        "from torchtitan.trainer import Trainer",
        "from torchtitan.trainer import Trainer\nfrom torchtitan.components.quantization import Float8LinearConverter")


@pytest.mark.parametrize("call,train,says", [
    ('model_registry("8B", converters=[Float8LinearConverter.Config()])', "", "rowwise only"),
    ('model_registry("8B", bogus=1)', "", "takes no 'bogus'"),
    ('model_registry("8B", attn_backend="sdpa")', "", "attn_backend='sdpa'"),
    ('model_registry("8B", attn_backend="varlen")', "", "CUDA graphs"),
    ('model_registry("8B", tp_gemm_backend="fused")', "", "'default' or 'dist_gemm'"),
])
def test_model_registry_arguments_that_change_the_step_are_refused_in_one_line(call, train, says):
    with pytest.raises(EngineError) as e:
        torchtitan_py.parse(_registry(call, train), _facts("llama3-8b"), 64)
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_the_attention_kernel_and_cuda_graphs_of_a_job_are_read_and_said():
    facts = _facts("llama3-8b")
    flex = torchtitan_py.parse(PUBLISHED_8B, facts, 64)                   # torchtitan's defaults
    assert any("FlexAttention" in n and "the default" in n for n in flex.notes)
    assert any("CUDA graph" in n for n in flex.notes)
    varlen = torchtitan_py.parse(_registry('model_registry("8B", attn_backend="varlen")', "disable_cuda_graphs=True,"),
                                 facts, 64)
    assert any("FlashAttention (attn_backend='varlen'" in n for n in varlen.notes)
    assert not any("FlexAttention" in n or "CUDA graph" in n for n in varlen.notes)
    assert varlen.describe() == flex.describe()          # the same degrees and policies: only the kernels differ
    # async TP over symmetric memory changes nothing without tensor parallelism (torchtitan runs the stock
    # projections then); with it, it is refused
    assert torchtitan_py.parse(_registry('model_registry("8B", tp_gemm_backend="dist_gemm")'), facts, 64).tp == 1
    tp2 = _registry('model_registry("8B", tp_gemm_backend="dist_gemm")').replace(
        "from torchtitan.config import TrainingConfig", "from torchtitan.config import ParallelismConfig, TrainingConfig"
    ).replace("        model_spec=model_spec,", "        model_spec=model_spec,\n"
              "        parallelism=ParallelismConfig(tensor_parallel_degree=2),")
    with pytest.raises(EngineError, match="folded into their GEMMs"):
        torchtitan_py.parse(tp2, facts, 64)


def test_an_export_runs_flash_attention_eagerly_as_priced(tiny):
    graph, cl = tiny
    plan = price(graph, cl, EngineConfig(engine="torchtitan", runtime="torchtitan", dp=8, zero=3, global_batch=8),
                 name="gpt3-350m")
    text, _, _ = E.export_plan(plan, "torchtitan", graph=graph, cluster=cl)
    assert "disable_cuda_graphs=True" in text           # without pipelining too
    facts = _facts("llama3-8b")
    ecfg = torchtitan_py.parse(PUBLISHED_8B, facts, 8)
    ecfg.notes = []
    out = torchtitan_py.export(ecfg, facts, [f"layers.{i}" for i in range(32)])
    assert "model_spec=model_registry('8B', attn_backend='varlen')" in out and "disable_cuda_graphs=True" in out
    back = torchtitan_py.parse(out, facts, 8)
    assert back.describe() == ecfg.describe() and any("FlashAttention (attn_backend='varlen'" in n for n in back.notes)


def test_model_registry_arguments_bind_as_its_signature_orders_them():
    facts = _facts("llama3-8b")
    graphs_off = "disable_cuda_graphs=True,"
    by_position = torchtitan_py.parse(_registry('model_registry("8B", "varlen")', graphs_off), facts, 64)
    assert any("attn_backend='varlen'" in n for n in by_position.notes)
    by_name = torchtitan_py.parse(_registry('model_registry(flavor="8B")'), facts, 64)
    assert any("FlexAttention" in n for n in by_name.notes)
    for call, says in (('model_registry("8B", "varlen", attn_backend="flex")', "given twice"),
                       ('model_registry("8B", "varlen", "default", None, 1)', "takes 4 arguments"),
                       ('model_registry(attn_backend="varlen")', "names no flavor"),
                       ('model_registry("8B", attn_backend="' + "x" * 300 + '")', "attn_backend='xxx")):
        with pytest.raises(EngineError) as e:
            torchtitan_py.parse(_registry(call, graphs_off), facts, 64)
        assert says in str(e.value) and "\n" not in str(e.value) and len(str(e.value)) < 300, str(e.value)


def test_each_torchtitan_file_is_compared_within_its_own_release(tiny, tmp_path):
    # a 0.2.2 TOML given as --from torchtitan is priced as 0.2.2, and sapp's best plan beside it is 0.2.2's
    # (same profile), not 0.3's with another attention kernel
    graph, cl = tiny
    assert E.target_of("torchtitan", "torchtitan-0.2.2") == "torchtitan@0.2.2"
    assert E.target_of("torchtitan", "torchtitan") == "torchtitan"
    assert E.target_of("megatron", "fused") == "megatron"
    plan = price(graph, cl, EngineConfig(engine="torchtitan", runtime="torchtitan-0.2.2", dp=8, zero=3, global_batch=8),
                 name="gpt3-350m")
    toml, _, _ = E.export_plan(plan, "torchtitan@0.2.2", graph=graph, cluster=cl)
    mine = E.import_config(toml, "torchtitan", graph, cl, "gpt3-350m")
    st = mine["settings"]
    assert st["runtime"] == "torchtitan-0.2.2"
    best = E.best_plan(graph, cl, E.target_of("torchtitan", st["runtime"]), global_batch=8, model=graph,
                       settings={"runtime": st["runtime"], "precision": st["precision"]})
    assert best["settings"]["runtime"] == "torchtitan-0.2.2"
    assert not any("priced for the" in n for n in best["notes"])
    # the command does the same: `sapp import --from torchtitan` of that TOML compares within 0.2.2
    from sapp.commands.cli import main
    path = tmp_path / "job.toml"
    path.write_text(toml)
    best_path = tmp_path / "best.json"
    assert main(["import", "--from", "torchtitan", str(path), "--model", "gpt3-350m", "--cluster", CL,
                 "--best-out", str(best_path)]) == 0
    best_file = json.loads(best_path.read_text())
    assert best_file["settings"]["runtime"] == "torchtitan-0.2.2"
    assert not any("priced for the" in n for n in best_file["notes"])
    # a search pinned to a target prices what its engine runs: another profile is refused in one line
    with pytest.raises(api.SappError, match="target torchtitan@0.2.2 runs the torchtitan-0.2.2") as e:
        api.search(graph, cl, global_batch=8, constraints={"target": "torchtitan@0.2.2"}, runtime="torchtitan")
    assert "\n" not in str(e.value)


def test_a_022_plan_saved_under_the_old_profile_name_replans_as_022(tiny):
    from sapp.plan import Plan
    from sapp.api.replan import replan
    graph, cl = tiny
    plan = api.search(graph, cl, global_batch=8, constraints={"target": "torchtitan@0.2.2"},
                      runtime="torchtitan-0.2.2")
    old = plan.to_dict()
    old["settings"]["runtime"] = "torchtitan"          # "torchtitan" named 0.2.2's profile then
    r = replan(graph, Plan(old), cl, exact=True)
    assert r.plan["settings"]["runtime"] == "torchtitan-0.2.2"
    assert r.plan["predicted"]["step_time_s"] == plan["predicted"]["step_time_s"]



def test_a_target_plan_priced_eager_replans_with_its_target_and_pins(tiny):
    # api.search's default runtime under a target is eager (sapp's emitter's); replan keeps it, and the
    # target and pins with it
    from sapp.api.replan import replan
    graph, cl = tiny
    plan = api.search(graph, cl, global_batch=8, constraints={"target": "megatron", "tp": 2, "zero": 1})
    assert plan["settings"]["runtime"] == "eager"
    r = replan(graph, plan, cl, exact=True)
    assert r.dropped_pins == [] and r.plan["parallel"]["tp"] == 2
    assert r.plan["predicted"]["step_time_s"] == plan["predicted"]["step_time_s"]


# torchtitan 0.3.0's own registry, as published (the PyPI wheel's torchtitan/models/llama3/config_registry.py,
# identical to branch release/0.3 at 4f9e9a47d): 14 job functions, imports from typing and relative ones,
# jobs built from other jobs (issue 52, finding 8)
REGISTRY = os.path.join(HERE, "tests", "data", "torchtitan_0.3.0_llama3_config_registry.py")
# what each job is read as: its --model and degrees, or the reason it is refused
REGISTRY_JOBS = {
    "llama3_debugmodel": "model_registry('debugmodel')", "llama3_debugmodel_varlen_attn": "model_registry('debugmodel')",
    "llama3_debugmodel_dist_gemm": "model_registry('debugmodel')",
    "llama3_debugmodel_float8": "boolop", "llama3_debugmodel_nvfp4": "boolop",       # `x.enable and "model" in ...`
    "llama3_debugmodel_first_85_pct_layers_nvfp4": "Assert statement",
    "llama3_debugmodel_float8_emulate_lora": "model_registry('debugmodel')",          # (its own import read)
    "llama3_debugmodel_ce_loss": "Assert statement",
    "llama3_8b": ("llama3-8b", dict(tp=1, dp=64, zero=3, recompute="selective", global_batch=64)),
    "llama3_8b_first_85_pct_layers_nvfp4": "Assert statement", "llama3_8b_mxfp8": "MX / NVFP4 linear layers",
    "llama3_70b": ("llama3-70b", dict(tp=8, dp=8, sp=True, zero=3, recompute="full", global_batch=64)),
    "llama3_405b": "boolop", "sft_debugmodel": "FunctionDef statement",              # a nested sample processor
}


def _published_registry():
    with open(REGISTRY) as f:
        text = f.read()
    assert text.startswith("# Copyright (c) Meta Platforms") and "BSD-style license" in text
    return text


def test_the_published_registry_reads_each_job_it_names():
    import ast
    text = _published_registry()
    names = [st.name for st in ast.parse(text).body if isinstance(st, ast.FunctionDef)]
    assert names == list(REGISTRY_JOBS)
    for job, want in REGISTRY_JOBS.items():
        model = want[0] if isinstance(want, tuple) else "llama3-8b"
        if isinstance(want, str):
            with pytest.raises(EngineError) as e:
                torchtitan_py.parse(text, _facts(model), 64, job=job)
            msg = str(e.value)
            assert msg.startswith(f"job {job}") and want in msg and "\n" not in msg, msg
            continue
        ecfg = torchtitan_py.parse(text, _facts(model), 64, job=job)
        assert {k: getattr(ecfg, k) for k in want[1]} == want[1], job
        assert f"read job function {job}, one of the file's 14" in ecfg.notes
    # the registry's llama3_8b is the job copied alone into a file (PUBLISHED_8B): the same configuration
    alone = torchtitan_py.parse(PUBLISHED_8B, _facts("llama3-8b"), 64)
    assert torchtitan_py.parse(text, _facts("llama3-8b"), 64, job="llama3_8b").describe() == alone.describe()


def test_the_registry_without_a_job_lists_them_and_the_command_picks_one(tmp_path, capsys):
    from sapp.commands.cli import main
    text = _published_registry()
    with pytest.raises(EngineError) as e:
        torchtitan_py.parse(text, _facts("llama3-8b"), 64)
    msg = str(e.value)
    assert "14 job functions; pass --job NAME" in msg and all(j in msg for j in REGISTRY_JOBS) and "\n" not in msg
    with pytest.raises(EngineError, match=r"--job 'llama3_9b' is not a function of the file; its job functions"):
        torchtitan_py.parse(text, _facts("llama3-8b"), 64, job="llama3_9b")
    cmd = ["import", "--from", "torchtitan", REGISTRY, "--model", "llama3-8b", "--cluster", "h100-80g:nodes=8",
           "--no-compare"]
    assert main(cmd + ["--job", "llama3_8b"]) == 0                       # fits: 36 GB of 77.6
    assert "read job function llama3_8b" in capsys.readouterr().out
    assert main(cmd) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "pass --job NAME" in err and "Traceback" not in err, err
    toml = tmp_path / "job.toml"
    toml.write_text("[training]\nseq_len = 8192\n")
    assert main(cmd[:3] + [str(toml)] + cmd[4:] + ["--job", "llama3_8b"]) == 2
    assert "this is a torchtitan 0.2.2 TOML, which has none" in capsys.readouterr().err
    assert main(["import", "--from", "deepspeed", REGISTRY, "--model", "gpt-tiny", "--cluster", CL, "--job", "a"]) == 2
    assert "--from deepspeed has none" in capsys.readouterr().err


def _hostile(mark):
    """A registry of several jobs, some planting code that would leave `mark` behind if it ran."""
    evil = f"__import__('os').system('touch {mark}')"
    return (f"from typing import cast\nfrom torchtitan.config import TrainingConfig\nfrom torchtitan.trainer import "
            f"Trainer\nfrom . import model_registry\n\n\n"
            f"def evil() -> Trainer.Config:\n    {evil}\n    return Trainer.Config()\n\n\n"
            f"def good() -> Trainer.Config:\n    return Trainer.Config(model_spec=model_registry('8B'), "
            f"training=TrainingConfig(local_batch_size=2, seq_len=8192))\n\n\n"
            f"def derived() -> Trainer.Config:\n    config = good()\n    config.training.local_batch_size = 4\n"
            f"    return config\n\n\ndef via_evil() -> Trainer.Config:\n    config = evil()\n    return config\n\n\n"
            f"def casts() -> Trainer.Config:\n    return cast(Trainer.Config, good())\n\n\n"
            f"def side() -> Trainer.Config:\n    x = {evil}\n    return good()\n\n\n"
            f"def loop_a():\n    return loop_b()\n\n\ndef loop_b():\n    return loop_a()\n\n\n"
            f"def helper(n):\n    {evil}\n\n\ndef calls_helper():\n    return helper(1)\n")


@pytest.mark.parametrize("job,says", [
    ("evil", "job evil, line 8: a Expr statement"), ("via_evil", "job evil, line 8: a Expr statement"),
    ("casts", "a call of 'cast', not of a name imported from torchtitan"),
    ("side", "job side, line 32: a call of \"__import__('os').system\""),
    ("loop_a", "job loop_a calls itself (through loop_a -> loop_b)"),
    ("helper", "--job 'helper' takes arguments"), ("calls_helper", "a call of helper with arguments"),
])
def test_a_registry_is_read_as_data_job_by_job(tmp_path, job, says):
    mark = tmp_path / "executed"
    text, facts = _hostile(mark), _facts("llama3-8b")
    with pytest.raises(EngineError) as e:
        torchtitan_py.parse(text, facts, 64, job=job)
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)
    # the clean jobs beside them read; a job built from another gets its own copy of it
    derived, good = (torchtitan_py.parse(text, facts, 64, job=j) for j in ("derived", "good"))
    assert (derived.mbs * derived.m, good.mbs * good.m, derived.global_batch) == (4, 2, 256)
    assert not mark.exists()


def test_code_a_registry_would_run_on_import_is_refused_whichever_job_is_named(tmp_path):
    mark = tmp_path / "executed"
    text = _hostile(mark)
    for planted, says in ((f"__import__('os').system('touch {mark}')\n", "Expr statement at the top level"),
                          (f"@__import__('os').system('touch {mark}')\ndef deco():\n    pass\n", "has decorators"),
                          ("import os\n", "Import statement"), ("from os import path\n", "import from 'os'")):
        with pytest.raises(EngineError) as e:
            torchtitan_py.parse(planted + text, _facts("llama3-8b"), 64, job="good")
        assert says in str(e.value) and "\n" not in str(e.value), str(e.value)
    chain = "".join(f"def j{i}() -> Trainer.Config:\n    return j{i - 1}()\n\n\n" for i in range(1, 20))
    with pytest.raises(EngineError, match="more than 16 calls of job functions"):
        torchtitan_py.parse(text + "\n\ndef j0():\n    return good()\n\n\n" + chain, _facts("llama3-8b"), 64, job="j19")
    assert not mark.exists()
