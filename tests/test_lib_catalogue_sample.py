"""CI's fixed sample of the probe set (bench/lib_catalogue.py): model code from libraries other than
transformers, built tiny, searched by sapp with dp2 or pp2 pinned and trained 3 Adam steps on 2 gloo
ranks, each case in its own child process killed at its timeout (the bench's own machinery), equal to
one process.  One family per library: x-transformers' Llama-style decoder (rotary, GQA, GLU),
vit-pytorch's ViT, tab-transformer-pytorch's FT-Transformer (two inputs: categories and numbers),
perceiver-pytorch's PerceiverIO LM (cross-attention into latents) and performer-pytorch's causal FAVOR+
LM (a buffer-held random projection)."""
import importlib.util

import pytest

# installed, not imported: vit_pytorch's own __init__ needs torchvision (lib_models.py enters it without)
for _lib in ("x_transformers", "vit_pytorch", "tab_transformer_pytorch", "perceiver_pytorch", "performer_pytorch"):
    if importlib.util.find_spec(_lib) is None:
        pytest.skip(f"{_lib} is not installed (the probe extra)", allow_module_level=True)

from bench import hf_catalogue as H  # noqa: E402
from bench import lib_catalogue as B  # noqa: E402

SAMPLE = (("xt_llama", "pp2"), ("vit", "pp2"), ("ft_transformer", "pp2"),
          ("perceiver_lm", "pp2"), ("performer_lm", "dp2"))


@pytest.mark.slow       # a sample of bench.lib_catalogue's matrix (RESULTS §20), ~60 s: `pytest -m slow`
def test_probe_sample_equals_one_process(tmp_path):
    # the bench's own command in a process of its own: the catalogue machinery forks a child per case,
    # and a fork of an xdist worker (whose execnet threads may hold a lock) can hang on that lock
    import os
    import subprocess
    import sys
    from tests.emit_workers import joblock
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = str(tmp_path / "rows.jsonl")
    by_column = {}
    for case, col in SAMPLE:
        by_column.setdefault(col, []).append(case)
    for col, cases in sorted(by_column.items()):      # each case a child killed at 150 s
        proc = joblock.run([sys.executable, "-m", "bench.lib_catalogue", "--out", out, "--only", ",".join(cases),
                            "--columns", col, "--timeout", "150"], cwd=root, env=env, capture_output=True,
                           text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {(r["arch"], r["column"]): r for r in H.load(out)}
    assert set(rows) == set(SAMPLE)
    for key, r in rows.items():
        assert B.outcome(r) == "equal", f"{key}: {r.get('failure')}: {r.get('reason')}"
        assert r["rel"] <= H.TOL and r["parallel"][key[1][:2]] == 2


def test_each_row_has_one_outcome():
    """A search's one-line SappError is a refusal, an error from emit after the search wrote the plan is
    the count that must stay 0, equal losses with no error over the bar are silently wrong."""
    rows = [({"ok": True, "phase": "compare", "reason": ""}, "equal"),
            ({"ok": False, "phase": "search", "reason": "ConstraintError: the pinned tp=2 cannot run this model"},
             "refused by search"),
            ({"ok": False, "phase": "search", "reason": "KeyError: 'x'"}, "failed"),
            ({"ok": False, "phase": "emit", "reason": "PlanError: stage 1 cannot run"}, "run refused a searched plan"),
            ({"ok": False, "phase": "step", "reason": "step 0: RuntimeError: boom"}, "failed"),
            ({"ok": False, "phase": "compare", "reason": "losses differ from one process in float64 (max rel 1e-3; "
              "float32 1e-3) with no error"}, "silently wrong")]
    for r, want in rows:
        assert B.outcome(r) == want, r
