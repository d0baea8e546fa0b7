"""Engine files are data with any values in them: every number typed and bounded before use, and any
value a parser did not expect ends in one line naming it — a zero micro-batch, a string degree, a
batch of 2e21 (divisors() ran for minutes), deep nesting, a number where a table goes."""
import contextlib
import io

import pytest

from sapp.commands.cli import main

CASES = [
    ("megatron", "args", "--num-layers 2 --global-batch-size 2000000000000000000000 --micro-batch-size 1\n", "between 1 and"),
    ("megatron", "args", "--num-layers 2 --global-batch-size 64 --micro-batch-size 0\n", "cannot use"),
    ("megatron", "args", "--num-layers 2 --global-batch-size 64 --expert-tensor-parallel-size abc\n", "must be a whole number"),
    ("torchtitan", "toml", "[training]\nglobal_batch_size = 9200000000000000000\n", "between 1 and"),
    ("torchtitan", "toml", "parallelism = 5\n", ""),
    ("torchtitan", "toml", "parallelism = " + "[" * 100000 + "]" * 100000 + "\n", "nests too deeply"),
    ("torchtitan", "py", "from torchtitan.trainer import Trainer\nfrom torchtitan.config import TrainingConfig\n"
     "def job():\n    return Trainer.Config(training=TrainingConfig(global_batch_size=9200000000000000000))\n",
     "between 1 and"),
    ("torchtitan", "py", "def job():\n    return " + "[" * 100000 + "]" * 100000 + "\n", ""),
    ("deepspeed", "json", '{"train_batch_size": 8, "zero_optimization": 5, "bf16": "yes"}', "cannot use"),
    ("deepspeed", "json", '{"a":' * 100000 + "1" + "}" * 100000, "nests too deeply"),
    ("deepspeed", "json", '{"train_batch_size": 8, "gradient_accumulation_steps": 100000000000000000000}', ""),
]


@pytest.mark.parametrize("engine,ext,text,says", CASES)
def test_one_line_never_a_traceback(tmp_path, engine, ext, text, says):
    path = tmp_path / f"cfg.{ext}"
    path.write_text(text)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["import", "--from", engine, str(path), "--model", "gpt-tiny", "--cluster", "a100-80g:devices=8",
                   "--no-compare"])
    msg = err.getvalue()
    assert rc == 2 and "Traceback" not in msg and len(msg.strip().splitlines()) == 1, msg[-600:]
    assert says in msg, msg


@pytest.mark.parametrize("flag,value,says", [("--seed", "100000000000000000000000", "--seed must be"),
                                              ("--max-restarts", "-5", "--max-restarts must be")])
def test_run_numbers_refused_before_launch(tmp_path, flag, value, says):
    import sapp.models as models
    from tests.emit_workers.plans import make_plan
    make_plan(name="mlp-tiny", params=models.info("mlp-tiny")["params"], global_batch=4).save(tmp_path / "p.json")
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        rc = main(["run", str(tmp_path / "p.json"), "--model", "mlp-tiny", flag, value])
    assert rc == 2 and says in err.getvalue() and "launching" not in out.getvalue(), err.getvalue()


def test_a_py_value_is_a_value_and_list_offload_devices_are_refused():
    from sapp.engines import deepspeed, megatron
    from sapp.engines.mapping import EngineError
    toks = megatron.tokens("torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 2 "
                           "--sequence-parallel --data-path x.py --use-distributed-optimizer")
    assert toks["--tensor-model-parallel-size"] == "2" and toks["--data-path"] == "x.py"
    assert "--sequence-parallel" in toks and "--use-distributed-optimizer" in toks
    with pytest.raises(EngineError, match="as DeepSpeed reads it"):
        deepspeed.parse('{"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_optimizer": '
                        '{"device": ["cpu"]}}}', {"layers": 2}, 8)


def test_explain_and_diff_print_a_plans_escapes_as_text(tmp_path):
    import json
    import sapp.models as models
    from tests.emit_workers.plans import make_plan
    d = make_plan(name="mlp-tiny", params=models.info("mlp-tiny")["params"], global_batch=4).to_dict()
    d["notes"] = ["harmless\x1b[2J\x1b]0;pwned\x07 note"]
    (tmp_path / "p.json").write_text(json.dumps(d))
    for argv in (["explain", str(tmp_path / "p.json")], ["diff", str(tmp_path / "p.json"), str(tmp_path / "p.json")]):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            main(argv)
        assert "\x1b" not in out.getvalue() and "\x07" not in out.getvalue(), argv
