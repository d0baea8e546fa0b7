"""`sapp search` flags for the constraints the API takes beyond the degrees (issue 55 item 4):
placement of tables (--place) and optimizer state (--optimizer-on), stage splits (--split-before),
per-block recomputation (--recompute-block)."""
import json

from sapp.commands.cli import main


def _search(tmp_path, capsys, *argv):
    out = tmp_path / "plan.json"
    rc = main(["search", *argv, "--out", str(out)])
    cap = capsys.readouterr()
    return rc, cap, (json.loads(out.read_text()) if rc == 0 else None)


def test_place_pins_tables_where_told(tmp_path, capsys):
    # unpinned, wide-deep-100m's tables go to the host (docs/cases.md); pinned on the device they stay
    rc, cap, host = _search(tmp_path, capsys, "--model", "wide-deep-100m", "--cluster", "a100-80g:nodes=1",
                            "--place", "deep_emb.*=host", "--place", "wide_emb.*=host")
    assert rc == 0, cap.err
    assert "embedding" in host["placement"]["predicted"]["option"]
    rc, cap, dev = _search(tmp_path, capsys, "--model", "wide-deep", "--cluster", "a100-80g:nodes=1", "--batch", "16384",
                           "--place", "deep_emb.*=host")
    assert rc == 0, cap.err
    assert "embedding" in dev["placement"]["predicted"]["option"]       # unpinned, wide-deep keeps them on the device
    rc = main(["search", "--model", "wide-deep", "--cluster", "a100-80g:nodes=1", "--place", "deep.0.*=host"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "optimizer" in err        # a dense layer: says what can move


def test_optimizer_on_host(tmp_path, capsys):
    rc, cap, plan = _search(tmp_path, capsys, "--model", "gpt-small", "--cluster", "a100-80g:nodes=1", "--batch", "16",
                            "--optimizer-on", "host", "--dp", "8")
    assert rc == 0, cap.err
    assert plan["placement"]["predicted"]["option"] == "optimizer-host"


def test_split_before_pins_the_stages(tmp_path, capsys):
    rc, cap, plan = _search(tmp_path, capsys, "--model", "gpt-small", "--cluster", "a100-80g:nodes=1", "--batch", "16",
                            "--split-before", "layers.1")
    assert rc == 0, cap.err
    stages = sorted(plan["pipeline"]["stages"], key=lambda s: s["index"])
    assert plan["parallel"]["pp"] == 2 and stages[0]["blocks"] == ["layers.0"]
    assert stages[1]["blocks"] == ["layers.1", "layers.2", "layers.3"]
    rc = main(["search", "--model", "gpt-small", "--cluster", "a100-80g:nodes=1", "--split-before", "layers.0,layers.2"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "leave layers.0 out" in err
    rc = main(["search", "--model", "gpt-small", "--cluster", "a100-80g:nodes=1", "--split-before", "layers.2", "--pp", "3"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--pp is 3" in err


def test_recompute_block_mixes_policies(tmp_path, capsys):
    rc, cap, plan = _search(tmp_path, capsys, "--model", "gpt-small", "--cluster", "a100-80g:nodes=1", "--batch", "16",
                            "--recompute", "none", "--recompute-block", "layers.0=full",
                            "--recompute-block", "layers.1*=selective")
    assert rc == 0, cap.err
    rc_ = plan["recompute"]
    assert rc_["default"] == "none" and rc_["blocks"] == {"layers.0": "full", "layers.1": "selective"}
    rc = main(["search", "--model", "gpt-small", "--cluster", "a100-80g:nodes=1", "--recompute-block", "layers.0=most"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "most" in err


def test_each_flag_has_an_example_in_help(capsys, monkeypatch):
    import contextlib
    monkeypatch.setenv("COLUMNS", "400")         # argparse wraps at hyphens: one line per flag
    with contextlib.suppress(SystemExit):
        main(["search", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for example in ("--place 'deep_emb.*=host'", "--optimizer-on host", "--split-before 'h.12,h.24'",
                    "--recompute-block 'h.0=full'"):
        assert example in text


def test_etp_keeps_experts_whole_beside_tp(tmp_path, capsys):
    argv = ("--model", "mixtral-8x7b", "--cluster", "h100-80g:devices=64", "--batch", "256", "--target", "megatron",
            "--tp", "2", "--pp", "4", "--ep", "4", "--zero", "1")
    rc, cap, whole = _search(tmp_path, capsys, *argv, "--etp", "1")
    assert rc == 0, cap.err
    rc, cap, split = _search(tmp_path, capsys, *argv, "--etp", "0")
    assert rc == 0, cap.err
    assert whole["parallel"]["etp"] == 1 and split["parallel"].get("etp", 0) != 1
    # the same bytes (E/(ep tp) whole experts or E/ep halves) in another layout: no row exchange over tp
    assert whole["predicted"]["memory"]["params"] == split["predicted"]["memory"]["params"]
    assert whole["predicted"]["step_time_s"] != split["predicted"]["step_time_s"]
    rc = main(["search", *argv[:6], *argv[8:], "--etp", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "megatron" in err
