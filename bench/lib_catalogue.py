"""Model code nobody here wrote, from popular PyTorch libraries other than transformers: x-transformers,
vit-pytorch, tab-transformer-pytorch, perceiver-pytorch, performer-pytorch, local-attention,
x-mlps-pytorch, torch.nn, and nanoGPT's and litgpt's model files, each model family built
tiny (tests/emit_workers/lib_models.py, the `probe` extra), run exactly as bench/hf_catalogue.py runs
the transformers catalogue (its machinery: a forked child per (case, column) from one parent, its own
process group killed at --timeout, named failure classes, a float64 re-run judging any row over the
float32 bar at 1e-9, resumable JSONL):

  cheap   capture with its loss, the unknown ops, a free search, a pinned tp2 search that shards;
  dp2 / pp2 / tp2 / tp2+sp
          sapp's own plan for that layout (sapp search, degrees pinned) trained 3 Adam steps on 2 gloo
          ranks through emit -- the entry `sapp run` steps with, its pre-step checks included -- against
          one process.

Each emission row is one outcome: equal; refused by the search (one line, no plan written); refused by
the run's pre-step checks although the search wrote the plan (must be 0: the search runs those checks
itself, sapp/emit/runnable.py); failed (an error in a step, a timeout); silently wrong (losses differ with
no error, confirmed in float64).

    python -m bench.lib_catalogue [--out FILE.jsonl] [--columns cheap,dp2,pp2,tp2,tp2+sp] [--only a,b]
                                  [--timeout 300] [--workers 1] [--f64 differ|all]
    python -m bench.lib_catalogue --report [--out FILE.jsonl]

What the probe set takes (bench/RESULTS.md §20):
What that takes here: every rank
starts from rank 0's weights (FT-Transformer and TabTransformer draw theirs from Python's `random`);
a module registered under two paths is one module, not a tie (Performer); a lone column split needs
an output width tp divides (FT-Transformer's 1-wide head); fused projections split by pieces; head
counts held by einops layers (x-transformers' `Rearrange(..., h=heads)`) set to a rank's share by the
shape audit.

Fused projections split by pieces: vit-pytorch's ViT, SimpleViT, PiT and T2T-ViT split their fused
`to_qkv` ([64, 64, 64]) by heads with `to_out` row-split, CrossViT its `to_kv`, and PerceiverIO its
GEGLU `net.0` ([256, 256]).  DeepViT and XCiT keep `to_qkv` a gathered column split: their attention
mixes heads (re-attention, cross-covariance), which the layout does not split.  Not shown: scale, GPUs.

Attention split by heads where the model reshapes by sizes of the whole model (nanoGPT's `C // n_head`
with C off the input, litgpt's shared Config): sapp/emit/tp/local_shapes.py; where a per-head bias is
made outside the split block (x-transformers' ALiBi and `rel_pos`, sliced to a rank's heads:
sapp/search/tp_sliced.py), where qk-norm reads the split for its shape only, where key heads are repeated
as `(r kvh)` (sapp/search/tp_regroup.py: queries' rows and the closer's columns in rank order), and in
Performer (FAVOR+'s projection repeated over a rank's heads), and nn.MultiheadAttention by heads
(sapp/search/tp_mha.py), and where a rank holds one key head (xt_llama: 4 heads over 2 key heads at tp=2,
where x-transformers' Attend would take its one-key-head branch) with the repeat done before Attend runs
(sapp/emit/tp/local_shapes.py `repeat_rules`), and where the heads are folded into the data batch for
local windows (LocalTransformer's `(b h) n d`: sapp/search/tp_fold.py).  `--columns tp2,tp2+sp` over the
14 decoders: 14/14 equal in each, self-attention split by heads on 14.  Replicated, the rest of the model
keeping tp and the plan's note saying why: PerceiverIO LM's cross-attentions (one head each).

bench/RESULTS.md §20's run (2026-12-02; the `probe` extra, `pip install --no-deps vit-pytorch`): 33
families: x-transformers 2.31.10 (9), vit-pytorch 1.26.11 (10), tab-transformer-pytorch 0.6.1 (2),
perceiver-pytorch 0.11.0 (2), performer-pytorch 1.1.4 (2), local-attention 1.11.2 (1), x-mlps-pytorch
0.6.9 (1), torch.nn (3), nanoGPT's model.py (1) and litgpt's (2) reproduced in
tests/emit_workers/heads_models.py."""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench import hf_catalogue as H  # noqa: E402

DEFAULT_OUT = os.path.join(ROOT, "bench", "lib_catalogue.jsonl")
OUTCOMES = ("equal", "refused by search", "run refused a searched plan", "failed", "silently wrong")
SILENT = ("losses differ silently", "replicated parameter drifts between ranks silently")


def use_library_models():
    """Point the catalogue's machinery at the library cases (forked children inherit it)."""
    H.MODELS, H.PREFIX = "tests.emit_workers.lib_models", "lib:"
    if H.case_emit is not _emit_noting_gathers:
        global _case_emit
        _case_emit, H.case_emit = H.case_emit, _emit_noting_gathers


_case_emit = None


def _emit_noting_gathers(arch: str, config: str, tmp: str) -> dict:
    """hf_catalogue's emission row, with the blocks the searched plan keeps gathered (replicated on
    every tp rank because they could not run at a rank's shapes: its "tp=2: gathered ..." notes)."""
    import json
    row = _case_emit(arch, config, tmp)
    try:
        with open(os.path.join(tmp, f"{config}.json")) as f:
            notes = json.load(f).get("notes") or []
    except (OSError, ValueError):
        return row
    row["gathered"] = sorted({n.split(" (")[0].split(": gathered ", 1)[1] for n in notes if ": gathered " in n})
    if config.startswith("tp") and row.get("ok"):
        try:
            row["unsplit"] = _unsplit(H.PREFIX + arch, tmp, config)
        except Exception as e:                 # noqa: BLE001 - a report's extra, not the row's outcome
            row["unsplit"] = [f"(not read: {type(e).__name__})"]
    return row


def _unsplit(kind: str, tmp: str, config: str) -> list:
    """The attentions the row's plan keeps replicated, one line each with why (tp_layout.unsplit_attention)."""
    import json
    from sapp.capture import capture
    from sapp.search.tp_layout import unsplit_attention
    from tests.emit_workers import hf_models
    with open(os.path.join(tmp, f"{config}.json")) as f:
        styles = json.load(f).get("tp_modules") or {}
    model, loss_fn = hf_models.build(kind, device="meta")
    x, y = hf_models.batch(kind, 8, 0)
    return unsplit_attention(capture(model, x, loss_fn=loss_fn, target=y), 2, styles)


def outcome(r: dict) -> str:
    """The one outcome of an emission row (OUTCOMES)."""
    if r["ok"]:
        return "equal"
    if r.get("phase") == "search":
        # a SappError is the search's one-line refusal; anything else escaped it
        return "refused by search" if r["reason"].split(":")[0] in _sapp_errors() else "failed"
    if r.get("phase") == "emit":
        return "run refused a searched plan"
    if r.get("phase") == "compare" and H.failure(r) in SILENT:
        return "silently wrong"
    return "failed"


def _sapp_errors() -> set:
    from sapp import errors
    return {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, errors.SappError)}


def report(rows) -> str:
    from tests.emit_workers import lib_models as L
    last = {}
    for r in rows:
        last[(r["arch"], r["column"])] = r
    cases = [c for c in L.CASES if any(k[0] == c for k in last)]
    cols = [c for c in H.EMIT if any(k[1] == c for k in last)]
    lines = [f"cases: {len(cases)} of {len(L.CASES)} over {len({L.CASES[c][0] for c in cases})} libraries", "",
             "| library | case | family | cheap | " + " | ".join(cols) + " |",
             "|---|---|---|---|" + "---|" * len(cols)]
    short = {"equal": "equal", "refused by search": "refused (search)", "run refused a searched plan":
             "REFUSED AT RUN", "failed": "failed", "silently wrong": "SILENTLY WRONG"}
    for c in cases:
        ch = last.get((c, "cheap"))
        cheap = "-" if ch is None else "ok" if ch["ok"] else H.failure(ch)
        cells = []
        for col in cols:
            r = last.get((c, col))
            cells.append("-" if r is None else short[outcome(r)] + ("" if r["ok"] else f" ({H.failure(r)})")
                         + (f" [gathered {', '.join(r['gathered'])}]" if r and r.get("gathered") else "")
                         + (f" [attention replicated: {'; '.join(r['unsplit'])}]" if r and r.get("unsplit") else ""))
        lines.append(f"| {L.CASES[c][0]} | {c} | {L.CASES[c][1]} | {cheap} | " + " | ".join(cells) + " |")
    lines += ["", "| column | run | " + " | ".join(OUTCOMES) + " | equal share |", "|---|---|" + "---|" * 6]
    totals = dict.fromkeys(OUTCOMES, 0)
    for col in cols:
        rs = [r for (a, k), r in last.items() if k == col]
        n = {o: sum(1 for r in rs if outcome(r) == o) for o in OUTCOMES}
        for o in OUTCOMES:
            totals[o] += n[o]
        lines.append(f"| {col} | {len(rs)} | " + " | ".join(str(n[o]) for o in OUTCOMES) +
                     f" | {100 * n['equal'] / len(rs):.0f}% |" if rs else f"| {col} | 0 |")
    for col in ("tp2", "tp2+sp"):
        rs = [r for (a, k), r in last.items() if k == col]
        if rs:
            whole = sum(1 for r in rs if r["ok"] and not r.get("gathered"))
            lines.append(f"{col}: {whole} of {len(rs)} equal with no block the runnable check gathered (a region tp "
                         f"does not split, e.g. an attention the layout cannot carry, is not counted here)")
    lines += ["", f"plans sapp search wrote that the run refused at its pre-step checks: "
                  f"{totals['run refused a searched plan']}",
              f"silently wrong rows (losses differ from one process, float64-confirmed, or a replicated weight "
              f"drifts between ranks, with no error): {totals['silently wrong']}",
              "", "| column | failure class | count | e.g. |", "|---|---|---|---|"]
    for col in H.COLUMNS:
        by = {}
        for (a, k), r in sorted(last.items()):
            if k == col and not r["ok"]:
                for f in H.failure(r).split("; "):
                    by.setdefault(f, []).append(r)
        for f, v in sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            lines.append(f"| {col} | {f} | {len(v)} | {v[0]['arch']}: {v[0]['reason'][:110]} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.lib_catalogue")
    p.add_argument("--out", default=DEFAULT_OUT, help="JSONL results (appended; done cases are skipped)")
    p.add_argument("--columns", default=",".join(H.COLUMNS))
    p.add_argument("--only", help="comma-separated case names")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per case")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--f64", choices=("differ", "all"), default=H.F64,
                   help="re-run in float64 (judged at 1e-9) only the rows over the float32 bar, or every row")
    p.add_argument("--report", action="store_true", help="print the table of --out and exit")
    a = p.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    use_library_models()
    H.F64 = a.f64
    from tests.emit_workers import lib_models as L
    if a.report:
        print(report(H.load(a.out)))
        return 0
    cases = H.chosen(p, list(L.CASES), a.only, "not in the probe set: {bad}; one of {names}")
    cols = H.columns(p, a.columns)
    # imported once in the parent, shared by every forked case
    import sapp.api  # noqa: F401
    import sapp.emit  # noqa: F401
    import sapp.search.joint  # noqa: F401
    from tests.emit_workers import hf_harness, hf_plans  # noqa: F401
    for c in cases:                        # the libraries too (their import is most of a case's start)
        if L.skip_reason(c) is None:
            L.build(c, device="meta")
    H.run(cases, cols, a.out, a.timeout, a.workers, log=lambda s: print(s, flush=True))
    print(report(H.load(a.out)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
