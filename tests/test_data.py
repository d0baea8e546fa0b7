"""Data sources for `sapp run`: one global sample order whatever the plan (dp ranks' rows concatenate to
the global batch), map-style == iterable, files cycle as before, shuffling is seeded per epoch, and bad
factories are one-line errors."""
import pytest
import torch

from sapp.emit.runtime import data
from tests.emit_workers import datasets


def _global(b, step, dp):
    parts = [b.local(step, r, dp) for r in range(dp)]
    return tuple(torch.cat([p[0][i] for p in parts]) for i in range(len(parts[0][0]))), torch.cat([p[1] for p in parts])


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_same_global_batches_whatever_dp(dp):
    ref = data.Batches(8, dataset=datasets.tokens())
    rows = datasets._rows()
    for step in range(8):                 # 48 samples = 6 batches of 8: crosses an epoch
        (x,), y = _global(data.Batches(8, dataset=datasets.tokens()), step, dp)
        k = step % 6
        assert torch.equal(x, rows[k * 8:(k + 1) * 8, :-1]) and torch.equal(y, rows[k * 8:(k + 1) * 8, 1:])
        (x0,), _ = ref(step)
        assert torch.equal(x, x0)


def test_iterable_matches_map_style_and_resumes_mid_stream():
    m, s = data.Batches(8, dataset=datasets.tokens()), data.Batches(8, dataset=datasets.token_stream())
    for step in range(7):                  # the stream restarts after 48 samples
        for r in range(2):
            a, b = m.local(step, r, 2), s.local(step, r, 2)
            assert torch.equal(a[0][0], b[0][0]) and torch.equal(a[1], b[1])
    late = data.Batches(8, dataset=datasets.token_stream())       # a resumed run: starts at step 4
    assert torch.equal(late.local(4, 1, 2)[1], m.local(4, 1, 2)[1])
    assert m.position(4) == 32


def test_file_data_cycles_in_order_dropping_the_remainder():
    x, y = torch.arange(10).float()[:, None], torch.arange(10)
    b = data.Batches(4, data=((x,), y))
    assert [b(i)[1].tolist() for i in range(3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]]


def test_shuffle_is_a_seeded_permutation_per_epoch():
    a = data.Batches(8, dataset=datasets.tokens(), shuffle=True, seed=3)
    b = data.Batches(8, dataset=datasets.tokens(), shuffle=True, seed=3)
    e0 = torch.cat([a(i)[1] for i in range(6)])
    assert torch.equal(e0, torch.cat([b.local(i, 0, 1)[1] for i in range(6)]))
    assert sorted(map(tuple, e0.tolist())) == sorted(map(tuple, datasets._rows()[:, 1:].tolist()))
    assert not torch.equal(e0, datasets._rows()[:, 1:])
    assert not torch.equal(a(6)[1], a(0)[1])          # epoch 1: another permutation


def test_factory_errors_are_one_line():
    assert data.is_factory("tests.emit_workers.datasets:tokens") and not data.is_factory("data/train.pt")
    with pytest.raises(data.DataError, match="cannot import"):
        data.make_dataset("no_such_pkg.x:make")
    with pytest.raises(data.DataError, match="has no callable"):
        data.make_dataset("tests.emit_workers.datasets:nope")
    with pytest.raises(data.DataError, match="map-style dataset"):
        data.make_dataset("tests.emit_workers.datasets:not_a_dataset")
    with pytest.raises(data.DataError, match="does not divide"):
        data.Batches(8, dataset=datasets.tokens()).local(0, 0, 3)


def test_factory_in_the_current_directory_imports_like_model(tmp_path, monkeypatch):
    """`--data mypkg.data:make_dataset` typed in the folder holding mypkg: the console script does not
    put that folder on sys.path (`python -m` does); --data adds it as --model does."""
    pkg = tmp_path / "friction_datapkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "data.py").write_text("import torch\n\ndef make_dataset():\n"
                                 "    return [(torch.full((4,), float(i)), i % 2) for i in range(6)]\n")
    import os
    import sys
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd(), str(tmp_path))])
    ds = data.make_dataset("friction_datapkg.data:make_dataset")
    assert len(ds) == 6 and float(ds[5][0][0]) == 5.0
    assert str(tmp_path) in sys.path
    sys.modules.pop("friction_datapkg.data", None)
    sys.modules.pop("friction_datapkg", None)
