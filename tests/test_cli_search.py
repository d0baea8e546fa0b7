"""`sapp search`, `sapp evaluate`, `sapp models` (in-process through sapp.commands.cli.main)."""
import json

from sapp.commands.cli import main


def test_search_prints_summary_and_writes_plan(tmp_path, capsys):
    out = tmp_path / "plan.json"
    rc = main(["search", "--model", "gpt-small", "--cluster", "a100-80g:nodes=1", "--batch", "16",
               "--pp", "2", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    for word in ("parallel", "dp=", "tp=", "pp=2", "predicted step", "MFU", "search", "of 80.00 GB"):
        assert word in text
    d = json.loads(out.read_text())
    assert d["parallel"]["pp"] == 2 and d["model"]["global_batch"] == 16
    rc = main(["evaluate", str(out), "--model", "gpt-small"])
    text = capsys.readouterr().out
    assert rc == 0 and "fits" in text and "plan says" in text


def test_contradictions_are_one_line_errors(capsys):
    rc = main(["search", "--model", "gpt-small", "--cluster", "a100-80g:nodes=1", "--tp", "3"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "tp=3" in err
    rc = main(["search", "--model", "no-such-model", "--cluster", "a100-80g:nodes=1"])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown model" in err and err.count("\n") == 1


def test_evaluate_refuses_other_model(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["search", "--model", "gpt-tiny", "--cluster", "a100-80g:nodes=1", "--batch", "8", "--out", str(out)]) == 0
    capsys.readouterr()
    rc = main(["evaluate", str(out), "--model", "gpt-small"])
    err = capsys.readouterr().err
    assert rc == 2 and "fingerprint" in err and err.count("\n") == 1


def test_models_lists_the_zoo(capsys):
    assert main(["models"]) == 0
    text = capsys.readouterr().out
    assert "gpt3-175b" in text and "resnet50" in text and "bert-large" in text
    assert main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert any(r["name"] == "gpt3-175b" and r["params"] > 1.7e11 for r in rows)


def test_readme_main_command(tmp_path, capsys):
    """`sapp search --model gpt3-175b --cluster a100-80g:nodes=128`: GPT-3's batch of 1536, a plan
    that fits 80 GB (capture on the meta device + search take a few seconds)."""
    out = tmp_path / "p.json"
    assert main(["search", "--model", "gpt3-175b", "--cluster", "a100-80g:nodes=128", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "global batch 1536" in text and "1024 devices" in text
    d = json.loads(out.read_text())
    assert d["predicted"]["peak_memory_bytes"] <= 80e9
    assert d["parallel"]["dp"] * d["parallel"]["tp"] * d["parallel"]["pp"] * d["parallel"].get("cp", 1) == 1024
    assert 0.3 < d["predicted"]["mfu"] < 0.9
