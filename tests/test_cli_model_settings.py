"""What a newcomer types: the sequence a search plans for (`--seq`, `--model-arg`), said on the first
line and recorded in the plan; `sapp run plan.json` building the model the plan names with the
settings it was searched with; a GPU plan refused before launching on a machine without the GPUs."""
import json
import subprocess
import sys
import time

import pytest

from sapp.commands.cli import main


def _llama_config(tmp_path, context):
    cfg = json.load(open("tests/data/llama.json"))
    cfg["max_position_embeddings"] = context
    path = tmp_path / "llama-128k.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_search_plans_the_sequence_given_and_says_so(tmp_path, capsys):
    cfg = _llama_config(tmp_path, 131072)
    out = tmp_path / "p.json"
    assert main(["search", "--hf-config", cfg, "--cluster", "h100-80g:nodes=1", "--seq", "8192", "--no-cache",
                 "--out", str(out)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "sequence 8,192 tokens (--seq)" in first
    plan = json.loads(out.read_text())
    assert plan["model"]["meta"]["seq"] == 8192 and plan["model"]["args"] == {"seq": 8192}
    # without --seq the config's context is planned, and the line names the field it came from
    assert main(["search", "--hf-config", cfg, "--cluster", "h100-80g:nodes=1", "--no-cache"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "sequence 131,072 tokens (the config's max_position_embeddings" in first


def test_zoo_seq_and_model_arg_are_recorded_and_checked(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["search", "--model", "gpt-tiny", "--cluster", "cpu:nodes=1", "--seq", "64",
                 "--model-arg", "dropout=0", "--out", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert plan["model"]["args"] == {"dropout": 0, "s": 64} and plan["model"]["meta"]["seq"] == 64
    assert plan["model"]["meta"]["config"]["s"] == 64
    capsys.readouterr()
    for argv, why in ((["--model", "mlp-tiny", "--seq", "64"], "mlp-tiny takes no sequence"),
                      (["--model", "gpt-tiny", "--model-arg", "nope=1"], "gpt-tiny has no setting 'nope'"),
                      (["--model", "gpt-tiny", "--seq", "0"], "--seq must be from 1"),
                      (["--model", "gpt-tiny", "--seq", "64", "--model-arg", "s=32"], "disagree")):
        assert main(["search", *argv, "--cluster", "cpu:nodes=1"]) == 2
        err = capsys.readouterr().err.strip()
        assert why in err and len(err.splitlines()) == 1, err


def test_a_learned_position_table_shorter_than_seq_is_refused(tmp_path, capsys):
    path = tmp_path / "gpt2.json"
    path.write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 32,
                                "n_layer": 1, "n_head": 4, "vocab_size": 128, "n_positions": 64,
                                "bos_token_id": 0, "eos_token_id": 0}))
    assert main(["search", "--hf-config", str(path), "--cluster", "cpu:nodes=1", "--seq", "128", "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert "longer than the learned position table transformer.wpe (64 rows); pass --seq 64 or less" in err


def test_run_builds_the_model_the_plan_names_with_its_settings(tmp_path):
    import argparse
    from sapp.commands import run as run_cmd
    out = tmp_path / "p.json"
    assert main(["search", "--model", "gpt-tiny", "--cluster", "cpu:nodes=1", "--seq", "48", "--out", str(out)]) == 0
    p = argparse.ArgumentParser()
    run_cmd.add_arguments(p)
    args = p.parse_args([str(out)])
    run_cmd.precheck(args)            # no --model: the plan's zoo name, built at its searched s=48
    assert args.model == "gpt-tiny" and args.model_arg == ["s=48"]
    assert "--model-arg" in run_cmd.command(args, 2) and "s=48" in run_cmd.command(args, 2)
    # the user's own setting wins over the plan's, and then the model is checked against the plan
    args = p.parse_args([str(out), "--model-arg", "s=32"])
    from sapp.errors import SappError
    with pytest.raises(SappError, match="parameters but this model has|search a new plan"):
        run_cmd.precheck(args)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_run_of_a_gpu_plan_on_a_cpu_machine_is_refused_at_once(tmp_path):
    out = tmp_path / "a100.json"
    assert main(["search", "--model", "gpt-tiny", "--cluster", "a100-80g:nodes=1", "--out", str(out)]) == 0
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "sapp.commands.cli", "run", str(out)], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert r.returncode != 0 and took < 5, (r.returncode, took)
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "no GPU" in err and "--allow-device-mismatch" in err, err
    assert "launching" not in r.stdout
