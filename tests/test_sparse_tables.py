"""Embedding tables with sparse gradients kept on the device (sapp/emit/host/sparse.py) run as priced.

Emitted: wide-deep-tiny with both tables pinned to the device, dp=2 at ZeRO 0-3 and dp=2 x tp=2,
trained 3 steps on gloo, equals single-process training with the same optimizers (SparseAdam for the
tables, Adam for the rest) within 1e-5 relative; every rank's measured memory is within 10% of the
plan's prediction and its manifest equals the plan.  Priced: the table is whole at every ZeRO stage
and its gradient is the rows the batch touched, by hand.  Bounded: the gloo job has a timeout."""
import os
import tempfile

import pytest
import torch

from bench import truth_matrix as tm
from tests.emit_workers import joblock

REL_TOL = 1e-5


def _reference(steps=3):
    import sapp.models as models
    from sapp.emit.host import sparse
    torch.manual_seed(0)
    m = models.get("wide-deep-tiny", device="cpu")
    x, y = models.example_inputs(m, tm.GLOBAL_BATCH, "cpu"), models.example_targets(m, tm.GLOBAL_BATCH, "cpu")
    x = x if isinstance(x, tuple) else (x,)
    tables = set(sparse.table_names(m))
    assert tables == {"deep_emb.weight", "wide_emb.weight"}
    named = dict(m.named_parameters())
    opts = [torch.optim.SparseAdam([named[n] for n in sorted(tables)], lr=1e-3),
            torch.optim.Adam([p for n, p in named.items() if n not in tables], lr=1e-3)]
    loss_fn, out = models.loss_fn(m), []
    for _ in range(steps):
        loss = loss_fn(m(*x), y)
        loss.backward()
        for o in opts:
            o.step()
            o.zero_grad()
        out.append(loss.item())
    return out


def test_device_sparse_tables_match_single_process_and_memory():
    cases = [c for c in tm.case_list(models=("wide-deep-tiny",), layouts=("dp", "dpxtp"))
             if not c["id"].endswith("/host")]
    cases = [c for c in cases if c["id"].endswith(("z0/none", "z2/none")) or c["id"] == "wide-deep-tiny/dp/z1/none"
             or c["id"] == "wide-deep-tiny/dp/z3/none"]
    for c in cases:
        c["constraints"]["placement"] = dict(tm.DEVICE, optimizer="device")
    ref = _reference()
    assert ref[0] != ref[2]
    with tempfile.TemporaryDirectory() as tmp:
        tm.search_plans(cases, tmp)
        assert not [c for c in cases if "refused" in c]
        with joblock.held():
            results = tm.run_jobs(cases, tmp, timeout=600, steps=3)
    rows = tm.rows(cases, results)
    assert len(rows) == 2 * 4 + 4 * 2          # dp z0-3 on 2 ranks, dpxtp z0/z2 on 4
    for r in rows:
        assert not r.get("error"), r
        assert r["manifest_ok"], (r["id"], r["diff"])
        assert abs(r["rel_err"]) <= tm.TOL, (r["id"], r["rank"], r["rel_err"])
        for a, b in zip(r["losses"], ref):
            assert abs(a - b) <= REL_TOL * abs(b), (r["id"], r["rank"], r["losses"], ref)
        assert len(r["losses"]) == len(ref) == 3


def test_sparse_table_state_bytes_by_hand():
    from sapp.costmodel import CostSettings, model_state_bytes, sparse_table_state_bytes
    s = CostSettings(precision="fp32")
    # 1000 x 16 table, 4 samples each looking up 26 rows: gradient 104 rows x 16 fp32 + 104 int64 indices
    st = sparse_table_state_bytes(16000, (26 * 16, 26), 4, s)
    assert st == {"params": 64000, "grads": 104 * 16 * 4 + 104 * 8, "optimizer": 128000}
    # never more than the dense gradient
    assert sparse_table_state_bytes(160, (26 * 16, 26), 4, s)["grads"] == 640
    # ZeRO would shard a dense parameter's states; the sparse table's stay whole (it runs outside FSDP)
    assert model_state_bytes(16000, 4, 3, s)["optimizer"] == 32000
