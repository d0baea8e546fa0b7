"""sapp/engines: plans exported to and imported from Megatron-LM arguments, torchtitan 0.2.2 TOML and DeepSpeed
JSON, and `sapp search --target`.  A Megatron export of GPT-3 175B (1024 A100, fused runtime) read back
is the same configuration at the same price; Narayanan et al. 2021 Table 2's runs written as argument
files price as bench/published.py's pinned rows; what an engine cannot state is refused in one line or
conformed with a note and re-priced as exported.  The engines' own validation of the exports is in
tests/test_engines_validation.py."""
import json

import pytest

import sapp.engines as E
from sapp import api
from sapp.commands.cli import main
from sapp.errors import SappError
from sapp.engines import EngineError, torchtitan
from sapp.engines.mapping import changes, comparison, from_plan
from sapp.engines.megatron import tokens

CLUSTER = "a100-80g:nodes=128"
SMALL = "a100-80g:devices=8"


@pytest.fixture(scope="module")
def gpt175():
    cl = api.resolve_cluster(CLUSTER)
    graph, _ = api.capture_graph(api.resolve_model("gpt3-175b")[0])
    plan = api.search("gpt3-175b", cl, graph=graph, constraints={"target": "megatron"}, runtime="fused")
    return graph, cl, plan


def test_megatron_export_reads_back_as_the_same_configuration(gpt175):
    graph, cl, plan = gpt175
    text, exported, notes = E.export_plan(plan, "megatron", graph=graph, cluster=cl)
    back = E.import_config(text, "megatron", graph, cl, "gpt3-175b")
    for k in ("dp", "tp", "pp"):
        assert back["parallel"][k] == plan["parallel"][k]
    assert bool(back["parallel"].get("sp")) == bool(plan["parallel"].get("sp"))
    for k in ("schedule", "micro_batches", "micro_batch_size", "virtual_chunks"):
        assert back["pipeline"][k] == plan["pipeline"][k], k
    assert back["zero"] == plan["zero"] and back["settings"]["runtime"] == "fused"
    # as exported (re-priced where the engine runs something else) and read back: within 1%
    assert back["predicted"]["step_time_s"] == pytest.approx(exported["predicted"]["step_time_s"], rel=0.01)
    assert exported["predicted"]["step_time_s"] == pytest.approx(plan["predicted"]["step_time_s"], rel=0.01)
    # and `sapp evaluate` re-scores the imported plan to its own figure
    res = api.evaluate("gpt3-175b", cl, back, graph=graph)
    assert res["step_time_s"] == pytest.approx(back["predicted"]["step_time_s"], rel=1e-3)
    a = tokens(text)
    assert int(a["--tensor-model-parallel-size"]) == plan["parallel"]["tp"]
    assert int(a["--global-batch-size"]) == 1536 and a["--bf16"] is True
    # what was changed is said, in the file too
    for n in notes:
        assert f"NOTE: {n}" in text


def test_target_megatron_searches_only_what_megatron_states(gpt175):
    _, _, plan = gpt175
    assert plan["zero"] in (0, 1) and plan["pipeline"]["schedule"] != "gpipe"
    assert plan["settings"]["runtime"] == "fused"
    assert (plan["placement"].get("predicted") or {}).get("option", "device") == "device"


def test_search_targets_restrict_the_space():
    cl = api.resolve_cluster(SMALL)
    graph, _ = api.capture_graph(api.resolve_model("gpt3-350m")[0])
    ds = api.search("gpt3-350m", cl, graph=graph, constraints={"target": "deepspeed"})
    assert (ds["parallel"]["tp"], ds["parallel"]["pp"]) == (1, 1)
    assert set(ds["recompute"]["blocks"].values()) | {ds["recompute"]["default"]} <= {"none", "full"}
    tt = api.search("gpt3-350m", cl, graph=graph, constraints={"target": "torchtitan@0.2.2", "tp": 2})
    assert tt["zero"] != 1 and tt["parallel"]["sp"] is True
    if tt["zero"] > 1:          # FSDP2 sharding: not Megatron's distributed optimizer
        with pytest.raises(EngineError, match="ZeRO-1"):
            E.export_plan(tt, "megatron", graph=graph, cluster=cl)


def test_target_pins_that_contradict_it_are_refused():
    from sapp.search.constraints import Constraints
    from sapp.errors import ConstraintError
    for bad in ({"target": "deepspeed", "tp": 2}, {"target": "megatron", "zero": 3},
                {"target": "megatron", "schedule": "gpipe"}, {"target": "torchtitan", "zero": 1}, {"target": "nemo"}):
        with pytest.raises(ConstraintError):
            Constraints.from_dict(bad)


ARGS_175B = """# a Megatron-LM launch line, as users keep them
torchrun --nproc_per_node 8 pretrain_gpt.py \\
  --num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 \\
  --tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 \\
  --micro-batch-size 1 --global-batch-size 1536 --bf16 --lr 6e-5 --train-iters 1000 \\
  --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 \\
  --data-path /data/my_text_document
"""


def test_megatron_import_of_a_launch_line(gpt175):
    graph, cl, best = gpt175
    plan = E.import_config(ARGS_175B, "megatron", graph, cl, "gpt3-175b")
    assert (plan["parallel"]["tp"], plan["parallel"]["pp"], plan["parallel"]["dp"]) == (8, 16, 8)
    assert plan["pipeline"]["schedule"] == "1f1b" and plan["pipeline"]["micro_batches"] == 192
    assert plan["recompute"]["default"] == "full" and plan["zero"] == 0
    notes = " ".join(plan["notes"])
    assert "--lr" in notes and "--overlap-grad-reduce" in notes       # not read, and the overlap assumed: said
    line = comparison(plan, best)
    assert line.startswith(f"your configuration {plan['predicted']['step_time_s']:.3f} s/step, best found")
    assert "tp 8 \u2192" in line or "pp 16 \u2192" in line
    assert best["predicted"]["step_time_s"] < plan["predicted"]["step_time_s"]


@pytest.mark.parametrize("text, what", [
    ("--num-layers 96 --fp8-format hybrid", "FP8"),
    ("--num-layers 95", "--num-layers 95 but the model has 96"),
    ("--num-layers 96 --tensor-model-parallel-size 3", "does not divide"),
    ("--num-layers 96 --global-batch-size 1000 --micro-batch-size 3", "not a multiple"),
    ("--num-layers 96 --pipeline-model-parallel-size 16 --num-layers-per-virtual-pipeline-stage 5", "equal size"),
    ("--num-layers 96 --recompute-granularity partial", "use full or selective"),
    ("oops --num-layers 96", "unexpected 'oops'"),
])
def test_megatron_import_refuses_in_one_line(gpt175, text, what):
    graph, cl, _ = gpt175
    with pytest.raises(SappError) as e:
        E.import_config(text, "megatron", graph, cl, "gpt3-175b")
    assert what in str(e.value) and "\n" not in str(e.value)


def test_block_recompute_is_read_per_stage():
    from sapp.engines import megatron
    names = [f"layers.{i}" for i in range(8)]
    facts = {"layers": 8, "names": names}
    e = megatron.parse("--num-layers 8 --pipeline-model-parallel-size 2 --recompute-granularity full "
                       "--recompute-method block --recompute-num-layers 1", facts, 2)
    assert e.device_blocks == [4, 4]
    assert [e.recompute[b] for b in names] == ["full", "none", "none", "none"] * 2
    e = megatron.parse("--num-layers 8 --pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 3",
                       facts, 2)
    assert e.device_blocks == [3, 5]
    # Llama 3's layout: the embedding and the loss count as a layer each, one layer per virtual stage
    e = megatron.parse("--num-layers 8 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 "
                       "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split", facts, 2)
    assert (e.schedule, e.v, e.chunk_blocks) == ("interleaved", 5, [0, 1, 1, 1, 1, 1, 1, 1, 1, 0])


def test_torchtitan_stage_split_by_hand():
    # torchtitan's own docstring example: 3 layers, 2 stages, embedding and output weighing 2 each
    assert torchtitan.stage_layers(3, 2, 2, 2) == [2, 1]
    # Llama 3 405B: 126 layers + embedding + output over 16 x 8 virtual stages, one layer each
    ch = torchtitan.stage_layers(126, 128)
    assert ch[0] == 0 and ch[-1] == 0 and set(ch[1:-1]) == {1}
    assert torchtitan.stage_layers(32, 4) == [8, 9, 8, 7]     # 34 over 4: 9, 9, 8, 8 less the ends


def test_torchtitan_roundtrip_and_refusals(gpt175):
    graph, cl, _ = gpt175
    toml = """[parallelism]
tensor_parallel_degree = 8
pipeline_parallel_degree = 8
data_parallel_shard_degree = -1
fsdp_reshard_after_forward = "never"
pipeline_parallel_schedule = "Interleaved1F1B"
pipeline_parallel_microbatch_size = 1
[training]
local_batch_size = 96
global_batch_size = 1536
seq_len = 2048
[activation_checkpoint]
mode = "full"
"""
    plan = E.import_config(toml, "torchtitan@0.2.2", graph, cl, "gpt3-175b")
    assert (plan["parallel"]["tp"], plan["parallel"]["pp"], plan["parallel"]["dp"], plan["zero"]) == (8, 8, 16, 2)
    assert plan["pipeline"]["virtual_chunks"] == 2 and plan["parallel"]["sp"] is True
    assert plan["settings"]["runtime"] == "torchtitan-0.2.2"      # (costmodel/settings.py: the release's engine profile)
    text, exported, notes = E.export_plan(plan, "torchtitan@0.2.2", graph=graph, cluster=cl)
    assert not notes
    again = E.import_config(text, "torchtitan@0.2.2", graph, cl, "gpt3-175b")
    assert again["predicted"]["step_time_s"] == pytest.approx(plan["predicted"]["step_time_s"], rel=1e-6)
    for bad, what in (("[parallelism]\ndata_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 64\n"
                       "tensor_parallel_degree = 8\nexpert_parallel_degree = 2\n", "HSDP"),
                      ("[parallelism\n", "not a TOML file"),
                      ("[training]\nseq_len = 4096\n", "seq_len 4096"),
                      ("[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = \"ZBVZeroBubble\"\n"
                       "[training]\nlocal_batch_size = 2\nglobal_batch_size = 1024\n", "not priced")):
        with pytest.raises(EngineError) as e:
            E.import_config(bad, "torchtitan@0.2.2", graph, cl, "gpt3-175b")
        assert what in str(e.value), str(e.value)


def test_deepspeed_roundtrip_and_refusals():
    cl = api.resolve_cluster(SMALL)
    graph, _ = api.capture_graph(api.resolve_model("gpt3-350m")[0])
    cfg = {"train_batch_size": 512, "train_micro_batch_size_per_gpu": 4, "zero_optimization": {
        "stage": 2, "offload_optimizer": {"device": "cpu"}}, "bf16": {"enabled": True}}
    plan = E.import_config(json.dumps(cfg), "deepspeed", graph, cl, "gpt3-350m")
    assert (plan["parallel"]["dp"], plan["zero"], plan["pipeline"]["micro_batches"]) == (8, 2, 16)
    assert plan["placement"]["predicted"]["option"] == "optimizer-host"
    text, _, notes = E.export_plan(plan, "deepspeed", graph=graph, cluster=cl)
    out = json.loads(text)
    assert out["zero_optimization"] == {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    assert (out["train_batch_size"], out["train_micro_batch_size_per_gpu"], out["gradient_accumulation_steps"]) == (512, 4, 16)
    for bad, what in (({"train_batch_size": 500, "train_micro_batch_size_per_gpu": 4}, "500"),
                      ({"train_batch_size": 512, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}},
                       "offload_param"),
                      ({"train_batch_size": "auto"}, "give train_batch_size")):
        with pytest.raises(EngineError) as e:
            E.import_config(json.dumps(bad), "deepspeed", graph, cl, "gpt3-350m")
        assert what in str(e.value)
    with pytest.raises(EngineError, match="states data parallelism only"):
        mp = api.search("gpt3-350m", cl, graph=graph, constraints={"tp": 2, "pp": 1})
        E.export_plan(mp, "deepspeed", graph=graph, cluster=cl)


def test_a_deepspeed_export_with_full_recomputation_says_what_the_script_must_call():
    # DeepSpeed's engine never applies activation_checkpointing itself (deepspeed.checkpointing reads it):
    # the file states the calls the training script must make, and reads back at the same price
    cl = api.resolve_cluster(SMALL)
    graph, _ = api.capture_graph(api.resolve_model("gpt3-350m")[0])
    base = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 1}}
    for ac, says in ((True, True), (False, False)):
        cfg = {**base, **({"activation_checkpointing": {}} if ac else {})}
        plan = E.import_config(json.dumps(cfg), "deepspeed", graph, cl, "gpt3-350m")
        text, exported, _ = E.export_plan(plan, "deepspeed", graph=graph, cluster=cl)
        out = json.loads(text)
        assert ("activation_checkpointing" in out) is ac
        comment = out.get("_comment", "")
        assert (("deepspeed.checkpointing.checkpoint(block" in comment and
                 "deepspeed.checkpointing.configure(None, deepspeed_config=" in comment) is says), comment
        back = E.import_config(text, "deepspeed", graph, cl, "gpt3-350m")
        assert back["recompute"] == exported["recompute"] and back["predicted"] == exported["predicted"]


def test_a_mix_an_engine_cannot_state_is_conformed_and_repriced(gpt175):
    graph, cl, _ = gpt175
    # Megatron states full recomputation on the first N layers of every stage, one N: stages 0 and 1
    # recomputing 3 and 1 of their 6 layers are exported as 3 on both, and priced so
    plan = E.import_config("--num-layers 96 --tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 "
                           "--global-batch-size 1536 --bf16", "megatron", graph, cl, "gpt3-175b")
    d = plan.to_dict()
    names = [f"layers.{i}" for i in range(96)]
    d["recompute"] = {"default": "none", "blocks": {"layers.0": "full", "layers.1": "full", "layers.2": "full",
                                                   "layers.6": "full"}}
    mixed = type(plan)(d)
    e = from_plan(mixed, "megatron")
    assert e.recompute["layers.2"] == "full" and e.recompute["layers.7"] == "none"
    text, exported, notes = E.export_plan(mixed, "megatron", graph=graph, cluster=cl)
    assert len(notes) == 1 and "full on the first 3 layer(s) of every stage" in notes[0]
    a = tokens(text)
    assert (a["--recompute-method"], a["--recompute-num-layers"]) == ("block", "3")
    rc = {b: "full" if int(b.split(".")[1]) % 6 < 3 else "none" for b in names}
    assert {b for b, p in rc.items() if p == "full"} == {
        b for b in names if (exported["recompute"]["blocks"].get(b) or exported["recompute"]["default"]) == "full"}
    back = E.import_config(text, "megatron", graph, cl, "gpt3-175b")
    assert back["predicted"]["step_time_s"] == pytest.approx(exported["predicted"]["step_time_s"], rel=1e-6)


def test_changes_name_what_differs(gpt175):
    graph, cl, best = gpt175
    mine = E.import_config(ARGS_175B, "megatron", graph, cl, "gpt3-175b")
    ch = changes(mine, best)
    assert f"tp 8 \u2192 {best['parallel']['tp']}" in ch or best["parallel"]["tp"] == 8
    assert changes(best, best) == []


def test_cli_export_import_and_diff(tmp_path, capsys):
    plan_path, args_path, mine, best = (str(tmp_path / n) for n in ("p.json", "p.args", "mine.json", "best.json"))
    assert main(["search", "--model", "gpt3-350m", "--cluster", SMALL, "--target", "megatron", "--tp", "2",
                 "--out", plan_path]) == 0
    assert main(["export", plan_path, "--to", "megatron", "--out", args_path]) == 0
    assert "--tensor-model-parallel-size" in open(args_path).read()
    capsys.readouterr()
    assert main(["import", "--from", "megatron", args_path, "--model", "gpt3-350m", "--cluster", SMALL,
                 "--out", mine, "--best-out", best]) == 0
    out = capsys.readouterr().out
    assert "your configuration" in out and "(fused runtime)" in out
    assert main(["diff", mine, best]) == 0
    assert main(["evaluate", mine]) == 0
    assert main(["export", plan_path, "--to", "deepspeed"]) in (0, 2)
    assert main(["import", "--from", "torchtitan@0.2.2", args_path, "--model", "gpt3-350m", "--cluster", SMALL]) == 2
    assert "not a TOML file" in capsys.readouterr().err
    assert main(["import", "--from", "torchtitan", args_path, "--model", "gpt3-350m", "--cluster", SMALL]) == 2
    assert "not a Python configuration" in capsys.readouterr().err


def test_table2_argument_files_price_as_the_pinned_rows(tmp_path, capsys):
    """bench/megatron_args: Narayanan et al. 2021 Table 2's GPT 175B (1536 GPUs) and 530B (2240 GPUs)
    as Megatron-LM argument files price what bench/published.py's pinned rows price; `sapp diff`
    against sapp's best Megatron plan says what changes and by how much."""
    from bench import published
    from sapp.cluster import Cluster
    from sapp.costmodel import CostSettings
    from sapp.plan import Plan
    cache, st = {}, CostSettings(precision="bf16-mixed", runtime="fused")
    for name, path in (("GPT 175B 1536 GPUs t8 p12", "bench/megatron_args/gpt_175b_1536gpus.args"),
                       ("GPT 530B 2240 GPUs t8 p35", "bench/megatron_args/gpt_530b_2240gpus.args")):
        row = next(r for r in published.ROWS if r.name == name)
        pinned = published.price(row, st, cache)
        graph, cl = published._graph(row, cache), Cluster.parse(row.cluster)
        mine = E.import_config(open(path).read(), "megatron", graph, cl, "gpt3-175b")
        assert mine["predicted"]["step_time_s"] == pytest.approx(pinned.step_s, rel=1e-4), name
        assert mine["pipeline"]["schedule"] == "interleaved" and f"v={mine['pipeline']['virtual_chunks']}" in pinned.config
    # the 530B run beside sapp's best Megatron configuration for the same model, cluster and batch
    best = api.search(graph, cl, graph=graph, global_batch=row.global_batch, constraints={"target": "megatron"},
                      runtime="fused")
    _, best, _ = E.export_plan(best, "megatron", graph=graph, cluster=cl)
    line = comparison(mine, best)
    assert "best found" in line and best["predicted"]["step_time_s"] < mine["predicted"]["step_time_s"]
    a, b = str(tmp_path / "table2.json"), str(tmp_path / "best.json")
    mine.save(a)
    best.save(b)
    capsys.readouterr()
    assert main(["diff", a, b]) == 0
    out = capsys.readouterr().out
    assert "step_time_s" in out or "step" in out
    assert Plan.load(a)["predicted"]["step_time_s"] == mine["predicted"]["step_time_s"]
