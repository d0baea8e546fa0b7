from sapp.capture.ir import Dim, OpGraph, OpNode, Operand, ParamInfo, TensorSpec


def _graph():
    b = 4
    ids = OpNode("ids", "input", "placeholder", (Dim("a0", b, batch=True), Dim("a1", 8)), (),
                 TensorSpec((b, 8), "int64", ("a0", "a1")))
    emb = OpNode("emb", "embedding", "aten.embedding.default",
                 (Dim("b0", b, batch=True), Dim("b1", 8), Dim("v", 1000), Dim("h", 16)),
                 (Operand((1000, 16), "float32", ("v", "h"), param="tok.weight"),
                  Operand((b, 8), "int64", ("b0", "b1"), producer="ids")),
                 TensorSpec((b, 8, 16), "float32", ("b0", "b1", "h")),
                 flops=0, bytes=b * 8 * 8 + 2 * b * 8 * 16 * 4, saves=("in1",))
    fc = OpNode("fc", "matmul", "aten.linear.default",
                (Dim("b0", b, batch=True), Dim("b1", 8), Dim("n", 32), Dim("k", 16)),
                (Operand((b, 8, 16), "float32", ("b0", "b1", "k"), producer="emb"),
                 Operand((32, 16), "float32", ("n", "k"), param="fc.weight")),
                TensorSpec((b, 8, 32), "float32", ("b0", "b1", "n")),
                flops=2 * b * 8 * 32 * 16, bytes=(b * 8 * 16 + 32 * 16 + b * 8 * 32) * 4, saves=("in0",))
    params = {"tok.weight": ParamInfo("tok.weight", (1000, 16), "float32"),
              "fc.weight": ParamInfo("fc.weight", (32, 16), "float32")}
    return OpGraph("g", {n.name: n for n in (ids, emb, fc)}, params, ("fc",), batch_size=b)


def test_rebatch_scales_activations_not_parameters():
    g = _graph()
    g2 = g.rebatch(8)
    assert g2.nodes["fc"].flops == 2 * g.nodes["fc"].flops
    assert g2.nodes["fc"].bytes == (8 * 8 * 16 + 32 * 16 + 8 * 8 * 32) * 4     # weights once
    assert g2.nodes["emb"].bytes == 2 * g.nodes["emb"].bytes                  # only touched rows move
    assert g.rebatch(1).nodes["emb"].bytes > 0
    assert g2.nodes["emb"].out.shape == (8, 8, 16) and g2.batch_size == 8
    assert g2.fingerprint() == g.fingerprint()


def test_subgraph_and_networkx():
    g = _graph()
    s = g.subgraph(["fc"])
    assert s.nodes["fc"].operands[0].producer is None and list(s.params) == ["fc.weight"]
    nx_g = g.to_networkx()
    assert list(nx_g.edges()) == [("ids", "emb"), ("emb", "fc")]
