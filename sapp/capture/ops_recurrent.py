"""Recurrent layers (aten.lstm / gru / rnn_tanh / rnn_relu) as one priced unit each.

Per token, per layer and direction, a cell computes G gate pre-activations from the input and the
previous hidden state: 2·G·H·(I + H) FLOPs (G = 4 for LSTM, 3 for GRU, 1 for a plain RNN; I = the
layer's input width: the model's input for layer 0, H·directions above it), plus a few element-wise
ops per gate (not counted, as flop_counter).  Only the batch axis splits: time is a dependence
chain and the hidden width couples every gate."""
from __future__ import annotations

from .opspec import Spec, _arg

GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


def recurrent(c):
    x = c.ins[0]
    out = c.out_shape
    # lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
    # gru / rnn_*(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
    layers = int(_arg(c, 4, "num_layers", 1))
    bidir = bool(_arg(c, 7, "bidirectional", False))
    batch_first = bool(_arg(c, 8, "batch_first", False))
    dirs = 2 if bidir else 1
    if len(x.shape) == 3:
        B, T = (x.shape[0], x.shape[1]) if batch_first else (x.shape[1], x.shape[0])
    else:
        B, T = 1, x.shape[0]
    I = x.shape[-1]
    H = out[-1] // dirs
    G = GATES.get(c.op, 4)
    flops = 0.0
    for layer in range(layers):
        width = I if layer == 0 else H * dirs
        flops += dirs * 2.0 * G * H * (width + H) * B * T
    if len(x.shape) == 3:
        names = ("b0", "t", "h") if batch_first else ("t", "b0", "h")
        dims = [("b0", int(B), True), ("t", int(T), False), ("h", int(out[-1]), False), ("i", int(I), False)]
        xd = names[:2] + ("i",)
        od = names
    else:
        dims = [("t", int(T), False), ("h", int(out[-1]), False), ("i", int(I), False)]
        xd, od = ("t", "i"), ("t", "h")
    ind = [xd] + [(None,) * len(t.shape) for t in c.ins[1:]]
    return Spec("matmul", dims, ind, od, flops, ("in0", "out"),
                extra={"recurrent": c.op, "layers": layers, "directions": dirs, "hidden": int(H)})
