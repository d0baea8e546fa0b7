"""Element-wise ops and dropout: one output element per input element (with broadcasting), every
axis splittable.  1 FLOP per output element; what each op saves for backward follows its derivative."""
from __future__ import annotations

from .ops_complex import complex_flops
from .opspec import Spec, _act_saves, _adims, _arg, _bcast, prod

# ---- element-wise ----------------------------------------------------------------------------
SAVE_OUT = {"relu", "sigmoid", "tanh", "exp", "rsqrt", "sqrt", "hardsigmoid", "expm1"}
SAVE_IN = {"gelu", "silu", "log", "pow", "erf", "sin", "cos", "leaky_relu", "elu", "softplus",
           "hardtanh", "mish", "abs", "log1p", "reciprocal", "hardswish", "clamp", "clamp_min",
           "clamp_max", "square", "acos", "asin", "atan", "log_sigmoid"}
SAVE_ALL_ACT = {"mul", "multiply", "div", "divide", "true_divide",
                "maximum", "minimum", "fmax", "fmin", "atan2", "where", "max", "min"}
NO_SAVE = {"add", "sub", "subtract", "rsub", "neg", "masked_fill", "eq", "ne", "le", "lt", "ge", "gt",
           "__and__", "__or__", "__xor__", "bitwise_not", "bitwise_and", "bitwise_or",
           "logical_not", "logical_and", "logical_or", "fill", "zero", "copy", "lerp", "sign",
           "floor", "ceil", "round", "trunc", "remainder", "fmod", "isnan", "isinf", "nan_to_num",
           "scalar_tensor", "floor_divide", "logical_xor", "type_as", "_to_copy", "to", "addcmul",
           "addcdiv", "triu", "tril", "bitwise_xor", "uniform", "exponential", "normal", "bernoulli"}
ELEMENTWISE = SAVE_OUT | SAVE_IN | SAVE_ALL_ACT | NO_SAVE


def elementwise(c):
    r = c.out_shape
    if c.op in SAVE_OUT:
        saves = ("out",)
    elif c.op in SAVE_IN:
        saves = _act_saves(c, [0])
    elif c.op in SAVE_ALL_ACT:
        tensors = [i for i, t in enumerate(c.ins) if len(t.shape) > 0]
        saves = _act_saves(c, tensors) if len(tensors) > 1 else ()
    else:
        saves = ()
    flops = 0.0 if c.op in ("_to_copy", "to", "type_as", "copy", "fill", "zero") else complex_flops(c, float(prod(r)))
    if c.op in ("tril", "triu"):
        # Not quite element-wise (position dependent) but keeps shape; its last two axes stay whole.
        return Spec("elementwise", _adims(r, {len(r) - 1, len(r) - 2}), [_bcast(t.shape, r) for t in c.ins],
                    tuple(f"a{i}" for i in range(len(r))), flops, saves)
    return Spec("elementwise", _adims(r), [_bcast(t.shape, r) for t in c.ins],
                tuple(f"a{i}" for i in range(len(r))), flops, saves)


def dropout(c):
    p = float(_arg(c, 1, "p", 0.5))
    train = bool(_arg(c, 2, "train", True))
    r = c.out_shape
    active = p > 0 and train
    return Spec("dropout", _adims(r), [_bcast(c.ins[0].shape, r)], tuple(f"a{i}" for i in range(len(r))),
                float(prod(r)) if active else 0.0, ("mask",) if active else (), copies=active,
                extra={"p": p})


