import pytest

from sapp import Cluster
from sapp.costmodel import CostSettings
from sapp.costmodel.optimizer import optimizer_step_time, update_bytes_per_param


def test_adam_update_is_memory_bound_28_bytes_per_param():
    c = Cluster.parse("a100-80g:nodes=1")
    s = CostSettings()
    assert update_bytes_per_param(s) == 28
    assert update_bytes_per_param(CostSettings(precision="fp32")) == 28
    n = 1e9                                              # 1B params, states held locally (12 B each)
    t = optimizer_step_time(12 * n, 2 * n, c, s)
    assert t == pytest.approx(28e9 / (2.0e12 * 0.8))
    # ZeRO-1 over 8: the state held (and so the update) shrinks 8x
    assert optimizer_step_time(12 * n / 8, 2 * n, c, s) == pytest.approx(t / 8)


def test_joint_search_charges_the_update_and_zero_shrinks_it():
    from sapp.api import search
    dense = search("wide-deep-1m", "a100-80g:nodes=1,gpus=2", global_batch=4096,
                   constraints={"dp": 2, "zero": 0})
    z1 = search("wide-deep-1m", "a100-80g:nodes=1,gpus=2", global_batch=4096,
                constraints={"dp": 2, "zero": 1})
    o0, o1 = dense.predicted["optimizer_s"], z1.predicted["optimizer_s"]
    # 84M parameters x 28 B at 1.6 TB/s ~ 1.5 ms; ZeRO-1 over 2 halves it
    assert 1e-3 < o0 < 2e-3 and o1 == pytest.approx(o0 / 2, rel=0.02)
    assert dense.predicted["compute_s"] >= o0
