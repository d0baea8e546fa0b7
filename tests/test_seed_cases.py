"""The seeds' cases reachable as docs/cases.md shows them (issue 55 finding 6)."""
from sapp.commands.cli import main


def test_mlp_takes_a_four_stage_pipeline_with_recompute_and_zero(capsys):
    # the zoo's mlp had 3 blocks, so --pp 4 was refused ("exceeds the model's 3 blocks")
    rc = main(["search", "--model", "mlp", "--cluster", "a100-80g:nodes=1", "--pp", "4", "--recompute", "full",
               "--zero", "1"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "pp=4" in out.out and "ZeRO-1" in out.out and "recompute full" in out.out
    assert "recomputation: full x8" in out.out
