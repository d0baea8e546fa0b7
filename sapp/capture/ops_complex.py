"""Complex tensors as torch stores them: a complex tensor of shape S is a real one of shape S + [2]
(real and imaginary parts interleaved), so view_as_real / view_as_complex move no bytes and only
add or drop that trailing pair axis, which stays whole.  Llama 4's rotary embedding builds its
frequencies with `polar` and rotates q/k as complex products."""
from __future__ import annotations

from .opspec import Spec, _act_saves, _adims, _bcast, generic, prod

COMPLEX = ("complex32", "complex64", "complex128")


def view_as_real(c):
    """[S] complex -> [S, 2] real: the S axes map straight; the pair axis is new and kept whole."""
    x, r = c.ins[0], c.out_shape
    n = len(x.shape)
    if len(r) != n + 1 or r[-1] != 2:
        return generic(c)
    return Spec("view", _adims(r, {n}), [tuple(f"a{i}" for i in range(n))], tuple(f"a{i}" for i in range(n + 1)),
                0.0, (), copies=False)


def view_as_complex(c):
    """[S, 2] real -> [S] complex: the pair axis folds into the element; the S axes map straight."""
    x, r = c.ins[0], c.out_shape
    n = len(r)
    if len(x.shape) != n + 1 or x.shape[-1] != 2:
        return generic(c)
    return Spec("view", _adims(r), [tuple(f"a{i}" for i in range(n)) + (None,)], tuple(f"a{i}" for i in range(n)),
                0.0, (), copies=False)


def polar(c):
    """polar(abs, angle) = abs * (cos angle + i sin angle): element-wise (broadcast) with a complex
    output, one FLOP per real component (2 per element, as the S + [2] view counts); its backward
    needs both inputs."""
    r = c.out_shape
    return Spec("elementwise", _adims(r), [_bcast(t.shape, r) for t in c.ins], tuple(f"a{i}" for i in range(len(r))),
                2.0 * prod(r), _act_saves(c, range(len(c.ins))))


def complex_flops(c, flops: float) -> float:
    """An element-wise op on complex values works on both components: add / sub and the like cost 2
    real FLOPs per element (one per component); a product of two complex operands
    (a+bi)(c+di) = (ac-bd) + (ad+bc)i costs 6 (4 multiplies, 2 adds)."""
    if c.out_dtype not in COMPLEX:
        return flops
    both = sum(1 for t in c.ins if t.dtype in COMPLEX) > 1
    return flops * (6.0 if c.op in ("mul", "multiply") and both else 2.0)
