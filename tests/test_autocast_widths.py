"""Activation widths under bf16 autocast (sapp.costmodel.dtypes): what the pass predicts on a captured
GPT, what it does to saved activations, and that real torch autocast produces those dtypes.
Capture + a tiny CPU forward: a few seconds."""
import pytest

from sapp.cluster import PRESETS
from sapp.costmodel import CostSettings, evaluate_sharding, saved_activations
from sapp.costmodel.dtypes import activation_widths, op_name
from sapp.cluster.mesh import Mesh

import torch  # noqa: E402  (a product test: a broken torch import must fail, not skip)
AUTOCAST = CostSettings()                          # bf16-mixed, autocast_fp32=True (what sapp emits)
MEGATRON = CostSettings(autocast_fp32=False)
FP32 = CostSettings(precision="fp32")


@pytest.fixture(scope="module")
def gpt():
    from sapp.api import capture_graph, resolve_model
    return capture_graph(resolve_model("gpt-tiny")[0])[0]


def _first(g, block, name):
    """The first node of `block` whose aten op is `name`."""
    return next(n for n in g.blocks[block] if op_name(g.nodes[n].target) == name)


def _after(g, block, prev, name):
    names = g.blocks[block]
    return next(n for n in names[names.index(prev) + 1:] if op_name(g.nodes[n].target) == name)


def test_gpt_widths_follow_autocast(gpt):
    g = gpt
    w = activation_widths(g, AUTOCAST)
    sm = _first(g, "layers.0", "softmax")
    drop = _after(g, "layers.0", sm, "dropout")
    bmm = _after(g, "layers.0", drop, "matmul")
    ln = _first(g, "layers.0", "layer_norm")
    lin = _after(g, "layers.0", ln, "linear")
    assert (w[sm], w[drop], w[bmm]) == (4, 4, 2)      # fp32 softmax, dropout of it fp32, bmm back to bf16
    assert (w[ln], w[lin]) == (4, 2)
    emb = next(n for n in g.nodes if g.nodes[n].kind == "embedding")
    assert w[emb] == 4                                # lookup in the fp32 table: autocast leaves it alone
    loss = next(n for n in g.nodes if g.nodes[n].kind == "loss")
    assert w[loss] == 4
    # the residual stream is fp32 (embedding + dropout, then fp32 + bf16 adds promote)
    adds = [n for n in g.blocks["layers.0"] if op_name(g.nodes[n].target) == "add"]
    assert adds and all(w[n] == 4 for n in adds)
    # integer ids and bool masks keep their own width under every setting
    floats = [n for n, node in g.nodes.items() if node.out.dtype == "float32"]
    ints = {n: node.out.dtype for n, node in g.nodes.items() if node.out.dtype != "float32"}
    for st, fw in ((FP32, 4), (MEGATRON, 2)):
        ws = activation_widths(g, st)
        assert all(ws[n] == fw for n in floats)
        assert all(ws[n] == {"int64": 8, "bool": 1}[d] for n, d in ints.items())
    assert all(w[n] == {"int64": 8, "bool": 1}[d] for n, d in ints.items())


def test_saved_activations_exceed_megatron_by_the_fp32_tensors(gpt):
    g = gpt
    cfg = g.meta.get("config", {})
    s, b, h, a = cfg.get("s", 32), g.batch_size, cfg.get("h", 64), cfg.get("a", 4)
    mesh = Mesh.for_devices(PRESETS["a100-80g"], 1)
    layer = set(g.blocks["layers.1"])
    strat = {n: () for n in g.nodes}

    def layer_bytes(st):
        saved = saved_activations(g, strat, mesh, st)
        return sum(bb for bb, savers in saved.values() if savers[0] in layer)

    megatron = s * b * h * (34 + 5 * a * s / h)
    assert layer_bytes(MEGATRON) == pytest.approx(megatron)
    # Autocast keeps, beyond Megatron's all-bf16 count: the softmax output at 4 B instead of 2
    # (+2as^2b); both layer norms save their fp32 residual-stream input (+2sbh each).  The fp32
    # dropout-of-softmax and layer-norm outputs are not saved: the next matmul saves its bf16 copy.
    assert layer_bytes(AUTOCAST) - megatron == pytest.approx(2 * a * s * s * b + 4 * s * b * h)
    cost = evaluate_sharding(g, strat, mesh, PRESETS["a100-80g"], AUTOCAST)
    total = sum(bb for bb, _ in saved_activations(g, strat, mesh, AUTOCAST).values())
    assert cost.activation_bytes == pytest.approx(total)


def test_memoised_costs_tell_fp32_and_bf16_copies_apart(gpt):
    """The embedding dropout (fp32 input) and a block's residual dropout (bf16 input) are the same
    op on the same shape: evaluate_sharding must not price one as the other."""
    g = gpt.rebatch(4096)            # large enough to be memory-bound
    mesh = Mesh.for_devices(PRESETS["a100-80g"], 1)
    w = activation_widths(g, AUTOCAST)
    same = [n for n in g.nodes if op_name(g.nodes[n].target) == "dropout"
            and g.nodes[n].out.shape == g.nodes["dropout"].out.shape]
    fp, bf = [n for n in same if w[n] == 4], [n for n in same if w[n] == 2]
    assert fp and bf
    cost = evaluate_sharding(g, {n: () for n in g.nodes}, mesh, PRESETS["a100-80g"], AUTOCAST)
    f32 = cost.per_node[fp[0]]["fwd_s"]
    b16 = cost.per_node[bf[0]]["fwd_s"]
    assert f32 > b16


# ---- real torch ---------------------------------------------------------------------------------
_CHECK = ("embedding", "add", "dropout", "layer_norm", "linear", "matmul", "mul", "masked_fill", "softmax",
          "gelu", "cross_entropy_loss")
_ALIAS = {"cross_entropy": "cross_entropy_loss"}


def recorded_widths(device: str) -> dict:
    """op name -> [bytes per element of each call's output, in call order] of the zoo gpt-tiny's
    forward + loss under torch.autocast(device, bfloat16), seen at the torch-function level."""
    from torch.overrides import TorchFunctionMode

    import sapp.models as M
    torch.manual_seed(0)
    model = M.get("gpt-tiny", device=device)
    ids, target = M.example_inputs(model, 2), M.example_targets(model, 2)
    rec = {}

    class Record(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = getattr(func, "__name__", "").strip("_")
            name = _ALIAS.get(name, name)
            if name in _CHECK and isinstance(out, torch.Tensor):
                rec.setdefault(name, []).append(out.dtype.itemsize)
            return out

    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16), Record():
        M.token_cross_entropy(model(*ids), target)
    return rec


def predicted_widths(g, device: str) -> dict:
    w = activation_widths(g, AUTOCAST, device=device)
    out = {}
    for n, node in g.nodes.items():
        name = op_name(node.target)
        if name in _CHECK:
            out.setdefault(name, []).append(w[n])
    return out


def test_cpu_autocast_agrees_with_the_pass(gpt):
    # CPU autocast keeps softmax / layer_norm in their input dtype (CUDA runs them in fp32): the
    # pass's CPU table says so; matmuls, losses and type promotion are the same on both devices.
    got, want = recorded_widths("cpu"), predicted_widths(gpt, "cpu")
    assert set(got) == set(_CHECK)
    assert got == want
    assert want["softmax"] == [2, 2] and want["cross_entropy_loss"] == [4]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_autocast_agrees_with_the_pass(gpt):
    got, want = recorded_widths("cuda"), predicted_widths(gpt, "cuda")
    assert got == want
    assert want["softmax"] == [4, 4] and want["layer_norm"] == [4, 4, 4, 4, 4]


def test_setting_is_validated_and_op_names_parsed():
    from sapp.errors import SappError
    with pytest.raises(SappError):
        CostSettings(autocast_fp32="yes")
    assert CostSettings().autocast and not MEGATRON.autocast and not CostSettings(precision="fp32", autocast_fp32=True).autocast
    assert [op_name(t) for t in ("aten.softmax.int", "aten.split.Tensor[1]", "layer_norm")] == \
        ["softmax", "split", "layer_norm"]
