"""Ops the transformers catalogue (bench/hf_catalogue.py) found unknown, now with rules: `x @ W.T`
(Falcon's FalconLinear, aten.numpy_T) captured as the linear it is, stack, repeat_interleave, expm1.
Each checked against hand counts (FLOPs, bytes) and the dims a split may use; none is flagged unknown."""
import torch

from sapp.capture import capture
from sapp.search import tp_layout

B, S, K, N = 4, 6, 8, 12


def _only(g, kind=None, target=None):
    nodes = [n for n in g.nodes.values() if (kind is None or n.kind == kind) and (target is None or target in n.target)]
    assert len(nodes) == 1, [(n.name, n.kind, n.target) for n in g.nodes.values()]
    return nodes[0]


class TLinear(torch.nn.Linear):
    """Falcon's FalconLinear: the weight applied as `x @ W.T` (or another spelling of the transpose)."""

    def __init__(self, k, n, how):
        super().__init__(k, n, bias=False)
        self.how = how

    def forward(self, x):
        w = {"T": lambda w: w.T, "t": lambda w: w.t(), "transpose": lambda w: w.transpose(0, 1),
             "permute": lambda w: w.permute(1, 0)}[self.how](self.weight)
        return x @ w


class TwoLinears(torch.nn.Module):
    def __init__(self, how):
        super().__init__()
        self.up, self.down = TLinear(K, N, how), TLinear(N, K, how)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def test_x_at_weight_transposed_is_a_linear_the_tp_search_can_split():
    for how in ("T", "t", "transpose", "permute"):
        g = capture(TwoLinears(how), (torch.randn(B, S, K),))
        assert not g.meta["unknown_ops"], (how, g.meta["unknown_ops"])
        mms = [n for n in g.nodes.values() if n.kind == "matmul"]
        assert len(mms) == 2 and not any("numpy_T" in n.target or n.target.endswith(".t.default")
                                         for n in g.nodes.values() if n.kind == "view"), how
        up = next(n for n in mms if n.module == "up")
        # F.linear's own count: 2 FLOPs per multiply-add over B*S rows, N outputs, K inputs
        assert up.flops == 2 * B * S * N * K
        w = next(o for o in up.operands if o.param == "up.weight")
        assert w.dims == ("n", "k") and w.shape == (N, K)
        assert up.dim("n").size == N and up.dim("k").size == K and up.dim("n").splittable
        # both are linears the tp layout may open / close a region with (column-split up, row-split down)
        assert sorted(g.nodes[n].module for n in tp_layout.linears(g)) == ["down", "up"]


def test_transpose_of_an_activation_stays_a_view():
    class M(torch.nn.Module):
        def forward(self, x):                # numpy_T of an activation: a permute, moving no bytes
            return (x * 2).T.contiguous()
    g = capture(M(), (torch.randn(B, K),))
    assert not g.meta["unknown_ops"]
    t = _only(g, target="numpy_T")
    assert t.kind == "view" and t.bytes == 0 and t.flops == 0
    assert t.operands[0].dims == ("a1", "a0")


def test_stack_keeps_the_new_axis_whole_and_maps_the_rest():
    class M(torch.nn.Module):
        def forward(self, a, b):
            return torch.stack([a * 1, b * 1], dim=1)
    g = capture(M(), (torch.randn(B, S, K), torch.randn(B, S, K)))
    assert not g.meta["unknown_ops"]
    st = _only(g, target="stack")
    assert st.out.shape == (B, 2, S, K) and st.flops == 0
    assert [d.splittable for d in st.dims] == [True, False, True, True]
    assert all(o.dims == ("a0", "a2", "a3") for o in st.operands)
    assert st.bytes == 2 * (2 * B * S * K * 4)           # reads both inputs, writes the stacked copy


def test_repeat_interleave_links_groups_of_rows_to_the_input_rows():
    class M(torch.nn.Module):
        def forward(self, kv):                 # key/value heads repeated to the query heads (GQA)
            return (kv * 1).repeat_interleave(3, dim=1)
    g = capture(M(), (torch.randn(B, 2, S, K),))
    assert not g.meta["unknown_ops"]
    ri = _only(g, target="repeat_interleave")
    assert ri.out.shape == (B, 6, S, K) and ri.flops == 0
    # the head dim takes the kv head count: a split must divide the heads before repeating
    assert ri.dim("a1").size == 2 and ri.dim("a1").splittable
    assert ri.operands[0].dims == ("a0", "a1", "a2", "a3") and ri.out.dims[1] == "a1"
    assert ri.bytes == (1 + 3) * B * 2 * S * K * 4

    class Flat(torch.nn.Module):
        def forward(self, x):                  # no dim: flattened first, the output kept whole
            return (x * 1).repeat_interleave(2)
    g = capture(Flat(), (torch.randn(B, K),))
    assert not g.meta["unknown_ops"]
    ri = _only(g, target="repeat_interleave")
    assert ri.out.shape == (2 * B * K,) and not ri.dims[0].splittable and ri.operands[0].dims == (None, None)


def test_expm1_is_elementwise_and_saves_its_output():
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.expm1(x * 1)
    g = capture(M(), (torch.randn(B, S),))
    assert not g.meta["unknown_ops"]
    e = _only(g, target="expm1")
    assert e.kind == "elementwise" and e.flops == B * S and e.saves == ("out",)
    assert all(d.splittable for d in e.dims)


def test_pad_keeps_the_padded_axis_whole():
    class M(torch.nn.Module):
        def forward(self, x):                  # Bailing's chunked linear attention pads the sequence
            return torch.nn.functional.pad(x * 1, (0, 0, 1, 2))
    g = capture(M(), (torch.randn(B, S, K),))
    assert not g.meta["unknown_ops"]
    p = _only(g, target="pad")
    assert p.out.shape == (B, S + 3, K) and p.flops == 0
    assert [d.splittable for d in p.dims] == [True, False, True] and p.operands[0].dims == ("a0", None, "a2")
    assert p.bytes == (B * S * K + B * (S + 3) * K) * 4


def test_eye_is_a_creation():
    class M(torch.nn.Module):
        def forward(self, x):
            return x @ torch.eye(K, dtype=x.dtype)
    g = capture(M(), (torch.randn(B, K),))
    assert not g.meta["unknown_ops"]
    e = _only(g, target="eye")
    assert e.flops == 0 and e.out.shape == (K, K) and not e.operands


def test_einsum_contraction_counts_like_the_matmul_it_is():
    H, Q, D = 2, 5, 3

    class M(torch.nn.Module):
        def forward(self, q, k):              # CvT's attention scores
            return torch.einsum("bhqd,bhkd->bhqk", q * 1, k * 1)
    g = capture(M(), (torch.randn(B, H, Q, D), torch.randn(B, H, S, D)))
    assert not g.meta["unknown_ops"]
    e = _only(g, target="einsum")
    assert e.kind == "matmul" and e.flops == 2 * B * H * Q * S * D
    assert e.out.dims == ("a0", "a1", "a2", "a3") and e.dim("k").size == D and e.dim("k").splittable
    assert [o.dims for o in e.operands] == [("a0", "a1", "a2", "k"), ("a0", "a1", "a3", "k")]
    assert e.saves == ("in0", "in1")

    class Ell(torch.nn.Module):
        def forward(self, x, w):              # an ellipsis and a weight: x[..., d] w[e, d]
            return torch.einsum("...d,ed->...e", x * 1, w)
    g = capture(Ell(), (torch.randn(B, S, D), torch.randn(K, D)))
    e = _only(g, target="einsum")
    assert not g.meta["unknown_ops"] and e.flops == 2 * B * S * K * D and e.out.shape == (B, S, K)
    assert [o.dims for o in e.operands] == [("a0", "a1", "k"), ("a2", "k")]


def test_im2col_rows_follow_the_channels():
    class M(torch.nn.Module):                 # ConvBERT's span convolution unfolds the sequence
        def forward(self, x):
            return torch.nn.functional.unfold(x * 1, kernel_size=(3, 1), padding=(1, 0))
    C = 4
    g = capture(M(), (torch.randn(B, C, S, 1),))
    assert not g.meta["unknown_ops"]
    u = _only(g, target="im2col")
    assert u.out.shape == (B, C * 3, S) and u.flops == 0
    assert u.dim("a1").size == C and [d.splittable for d in u.dims] == [True, True, False]
    assert u.operands[0].dims == ("a0", "a1", None, None)


def test_multiply_is_mul():
    class M(torch.nn.Module):
        def forward(self, a, b):
            return torch.multiply(a * 1, b * 1)
    g = capture(M(), (torch.randn(B, S), torch.randn(B, S)))
    assert not g.meta["unknown_ops"]
    m = _only(g, target="multiply")
    assert m.kind == "elementwise" and m.flops == B * S and m.saves == ("in0", "in1")


def test_fft_keeps_the_transformed_axes_whole():
    import math

    class M(torch.nn.Module):                 # FNet's token mixing: a 2-D FFT over sequence and hidden
        def forward(self, x):
            return torch.fft.fftn(x * 1, dim=(1, 2)).real
    g = capture(M(), (torch.randn(B, S, K),))
    assert not g.meta["unknown_ops"]
    f = _only(g, target="fft")
    assert f.flops == 5 * B * S * K * math.log2(S * K)
    assert [d.splittable for d in f.dims] == [True, False, False] and f.operands[0].dims == ("a0", None, None)
    r = _only(g, target="real")
    assert r.kind == "view" and r.flops == 0 and r.operands[0].dims == ("a0", "a1", "a2")


def test_vector_norm_reduces_the_dim_after_its_order():
    class M(torch.nn.Module):                 # Swin v2's cosine attention: F.normalize(x, dim=-1)
        def forward(self, x):
            return torch.linalg.vector_norm(x * 1, 2, dim=1, keepdim=True)
    g = capture(M(), (torch.randn(B, S, K),))
    assert not g.meta["unknown_ops"]
    n = _only(g, target="vector_norm")
    # the reduced axis is 1 (not axis `ord` = 2 read as a dim: that reduced the hidden axis)
    assert n.out.shape == (B, 1, K) and n.out.dims == ("a0", None, "a2") and n.flops == B * S * K
    assert n.operands[0].dims == ("a0", "a1", "a2") and n.dim("a1").size == S


def test_acos_is_elementwise():
    class M(torch.nn.Module):                 # YOSO's angular hashing
        def forward(self, x):
            return torch.acos(x * 0.5)
    g = capture(M(), (torch.randn(B, S),))
    assert not g.meta["unknown_ops"]
    a = _only(g, target="acos")
    assert a.kind == "elementwise" and a.flops == B * S and a.saves == ("in0",)


def test_bilinear_upsample_keeps_space_whole_and_counts_four_taps():
    class M(torch.nn.Module):                 # PVT's position embeddings resized to the patch grid
        def forward(self, x):
            return torch.nn.functional.interpolate(x * 1, size=(6, 6), mode="bilinear")
    C = 3
    g = capture(M(), (torch.randn(B, C, 4, 4),))
    assert not g.meta["unknown_ops"]
    u = _only(g, target="upsample")
    assert u.out.shape == (B, C, 6, 6) and u.flops == 2 * 4 * B * C * 36
    assert [d.splittable for d in u.dims] == [True, True, False, False]
    assert u.operands[0].dims == ("a0", "a1", None, None)


def test_random_fills_are_elementwise():
    class M(torch.nn.Module):                 # PhiMoE's router samples with exponential_ / uniform_
        def forward(self, x):
            return x * torch.empty_like(x).exponential_() + torch.empty_like(x).uniform_()
    g = capture(M(), (torch.randn(B, S),))
    assert not g.meta["unknown_ops"]
    for op in ("exponential", "uniform"):
        e = _only(g, target=op)
        assert e.kind == "elementwise" and e.flops == B * S and e.saves == ()


def test_log_sigmoid_is_elementwise():
    class M(torch.nn.Module):                 # Inkling's gates
        def forward(self, x):
            return torch.nn.functional.logsigmoid(x * 1)
    g = capture(M(), (torch.randn(B, S),))
    assert not g.meta["unknown_ops"]
    e = _only(g, target="log_sigmoid")
    assert e.kind == "elementwise" and e.flops == B * S and e.saves == ("in0",)


def test_complex_rotary_counts_a_complex_tensor_as_its_real_pairs():
    H, D = 2, 8                               # Llama 4's rotary embedding: polar, view_as_complex/real

    class M(torch.nn.Module):
        def forward(self, q, angle):
            freqs = torch.polar(torch.ones_like(angle), angle)            # [S, D/2] complex64
            qc = torch.view_as_complex((q * 1).reshape(B, S, H, D // 2, 2))
            return torch.view_as_real(qc * freqs[:, None, :]).flatten(3)
    g = capture(M(), (torch.randn(B, S, H, D), torch.randn(S, D // 2)))
    assert not g.meta["unknown_ops"], g.meta["unknown_ops"]
    p = _only(g, target="polar")
    # one FLOP per real component of the complex output; complex64 = 8 bytes = two float32
    assert p.kind == "elementwise" and p.flops == 2 * S * (D // 2) and p.out.nbytes == S * (D // 2) * 8
    vc = _only(g, target="view_as_complex")
    assert vc.kind == "view" and vc.bytes == 0 and vc.flops == 0 and vc.out.shape == (B, S, H, D // 2)
    assert vc.operands[0].dims == ("a0", "a1", "a2", "a3", None) and all(d.splittable for d in vc.dims)
    vr = _only(g, target="view_as_real")
    assert vr.kind == "view" and vr.bytes == 0 and vr.out.shape == (B, S, H, D // 2, 2)
    assert vr.operands[0].dims == ("a0", "a1", "a2", "a3")
    assert [d.splittable for d in vr.dims] == [True, True, True, True, False]     # the pair stays whole
    mul = next(n for n in g.nodes.values() if n.target.endswith("mul.Tensor") and n.out.dtype == "complex64")
    # (a+bi)(c+di): 4 multiplies + 2 adds per complex element
    assert mul.flops == 6 * B * S * H * (D // 2)
    assert mul.bytes == (2 * B * S * H * (D // 2) + S * (D // 2)) * 8


def test_col2im_folds_rows_back_to_channels_and_adds_each_column_once():
    C, P = 4, 2                               # MobileViTv2 folds 2x2 patches back to the image

    class M(torch.nn.Module):
        def forward(self, cols):
            return torch.nn.functional.fold(cols * 1, output_size=(4, 4), kernel_size=P, stride=P)
    g = capture(M(), (torch.randn(B, C * P * P, 4),))
    assert not g.meta["unknown_ops"]
    f = _only(g, target="col2im")
    assert f.out.shape == (B, C, 4, 4) and f.flops == B * C * P * P * 4
    assert f.dim("a1").size == C and [d.splittable for d in f.dims] == [True, True, False, False]
    assert f.operands[0].dims == ("a0", "a1", None)
    assert f.bytes == 2 * B * C * 16 * 4                 # reads the columns, writes the image (same count here)


def test_vmap_is_lowered_to_batched_ops():
    class M(torch.nn.Module):                 # T5Gemma2 builds its masks with torch.vmap
        def forward(self, x):
            return torch.vmap(lambda r: torch.exp(r) + r.sum())(x * 1)
    g = capture(M(), (torch.randn(B, S),))
    assert not g.meta["unknown_ops"], g.meta["unknown_ops"]
    e = _only(g, target="exp")
    assert e.out.shape == (B, S) and e.flops == B * S and e.dim("a0").batch     # every sample, not one
    s = _only(g, kind="reduction")
    assert s.flops == B * S and s.operands[0].dims == ("a0", "a1")
