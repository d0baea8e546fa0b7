"""Zoo models built on meta skip their initialisers (sapp/models/meta.py) and come out exactly as
built without skipping: same parameters, shapes, dtypes, requires_grad, buffers and tied weights."""
import torch

import sapp.models as M
from sapp.models import zoo
from sapp.models.meta import skip_init


def _layout(model):
    return ([(n, tuple(p.shape), p.dtype, p.requires_grad, p.device.type) for n, p in model.named_parameters()],
            [(n, tuple(b.shape), b.dtype) for n, b in model.named_buffers()])


def test_meta_build_skips_initialisers_only():
    for name, kw in (("gpt-small", {"tie_embeddings": True}), ("llama-tiny", {}), ("moe-tiny", {"dense": 1}),
                     ("bert-tiny", {}), ("resnet-tiny", {})):
        fast = M.get(name, **kw)
        kind, cfg = zoo._config(name, kw)
        with torch.device("meta"):               # the same constructor with every initialiser run
            slow = M.BUILDERS[kind][0](**zoo._ctor_args(kind, cfg))
        assert _layout(fast) == _layout(slow), name
    g = M.get("gpt-small", tie_embeddings=True)
    assert g.head.weight is g.embed.tok.weight


def test_skip_init_leaves_real_tensors_alone():
    with skip_init():
        m = torch.empty(4, 4, device="meta")
        assert torch.nn.init.normal_(m) is m and m.normal_() is m and torch.nn.init.zeros_(tensor=m) is m
        torch.manual_seed(0)
        c = torch.zeros(4, 4)
        torch.nn.init.normal_(c)                 # a CPU tensor is initialised as usual
        assert c.abs().sum() > 0
        t = torch.empty(4, 4, device="meta").t_()  # shape-changing in-place ops are not skipped
        assert t.shape == (4, 4)
