"""FP8 linear layers: what the engines run when FP8 training is on (`CostSettings.fp8`).

Which GEMMs: the linear layers inside the repeated blocks (a matmul with a weight), as both engines
convert them: torchtitan's float8 converter swaps every nn.Linear but the filtered output projection
(its job files filter `output`), Megatron-LM's Transformer Engine layers are the blocks' linears (the
output layer is Megatron-Core's own ColumnParallelLinear, bf16).  Attention's score GEMMs, the
embedding and the head stay bf16.

Their time, per GEMM (forward: Y = X·W; backward: dX = dY·Wᵀ and dW = Xᵀ·dY):
  - the arithmetic at the cluster's FP8 rate (`Cluster.fp8_peak_flops`) at the same fraction of it
    the bf16 GEMMs reach, on the same summed roofline, with the operands read at one byte;
  - the casts, memory-bound passes of their own:
      "tensorwise" (torchao's Float8Linear, dynamic scaling, eager): each operand's amax (a read, 2 bytes
        an element) then the cast (read 2, write 1), for X and W in forward and for dY, X and W in
        backward (torchao keeps X and W in bf16 for backward and casts them again), two launches
        each;
      "delayed" (Transformer Engine): the scale comes from the amax history and the amax is taken
        inside a fused cast-transpose (read 2, write 1 + 1) for X and W in forward, dY in backward;
        the FP8 weight and its transpose are kept across the step's micro-batches (2 bytes per weight
        element of memory).
Activation memory is priced at bf16 (torchao keeps the bf16 input; Transformer Engine keeps the FP8
input, 1 byte: an upper bound there, said in the plan's notes)."""
from __future__ import annotations

CAST_BYTES = {"tensorwise": 5.0, "delayed": 4.0}        # bytes an element per operand cast (above)
CAST_LAUNCHES = {"tensorwise": 2, "delayed": 1}
WEIGHT_CACHE_BYTES = {"tensorwise": 0.0, "delayed": 2.0}


def is_fp8_linear(node) -> bool:
    """A linear layer inside a repeated block: a matmul with a weight."""
    return node.kind == "matmul" and node.block is not None and any(
        o.param is not None and len(o.shape) == 2 for o in node.operands)


def fp8_rate_ratio(cluster) -> float:
    """FP8 over bf16 peak (0 without FP8 tensor cores)."""
    return float(getattr(cluster, "fp8_peak_flops", 0.0) or 0.0) / cluster.peak_flops


def fp8_times(node, numel, ff, fb, cluster, settings, grad: bool, overlap: float) -> tuple:
    """(forward s, backward s, weight-cache bytes) of an FP8 linear; `numel(operand or None)` the
    local element count of an operand (None: the output)."""
    from .primitives import compute_time, kernel_efficiency
    recipe = settings.fp8
    ratio = fp8_rate_ratio(cluster)
    x = sum(numel(o) for o in node.operands if o.param is None)
    w = sum(numel(o) for o in node.operands if o.param is not None)
    y = numel(None)
    out_w = 2.0                     # the GEMM writes bf16
    eff_f = kernel_efficiency("matmul", False, cluster, settings) * ratio
    eff_b = kernel_efficiency("matmul", True, cluster, settings) * ratio
    cast, launches = CAST_BYTES[recipe], CAST_LAUNCHES[recipe]
    fwd = compute_time(ff, x + w + out_w * y, cluster, 1, efficiency=eff_f, overlap=overlap)
    fwd += compute_time(0.0, cast * (x + w), cluster, 2 * launches)
    if not grad:
        return fwd, 0.0, 0.0
    bwd = compute_time(fb, 2 * y + x + w + out_w * (x + w), cluster, 2, efficiency=eff_b, overlap=overlap)
    again = (x + w) if recipe == "tensorwise" else 0.0         # torchao casts the bf16 X and W again
    bwd += compute_time(0.0, cast * (y + again), cluster, launches * (3 if again else 1))
    return fwd, bwd, WEIGHT_CACHE_BYTES[recipe] * w
