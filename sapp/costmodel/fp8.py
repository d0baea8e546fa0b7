"""FP8 linear layers: what the engines run when FP8 training is on (`CostSettings.fp8`).

Which GEMMs: the linear layers inside the repeated blocks (a matmul with a weight), as both engines
convert them: torchtitan's float8 converter swaps every nn.Linear but the filtered output projection
(its job files filter `output`), Megatron-LM's Transformer Engine layers are the blocks' linears (the
output layer is Megatron-Core's own ColumnParallelLinear, bf16).  Attention's score GEMMs, the
embedding and the head stay bf16.

Their time, per GEMM (forward: Y = X·W; backward: dX = dY·Wᵀ and dW = Xᵀ·dY): the arithmetic at the
cluster's FP8 rate (`Cluster.fp8_peak_flops`) at the same fraction of it the bf16 GEMMs reach, on the
same summed roofline, with the operands read at one byte; and the casts, memory-bound passes of their
own (bytes an element of the bf16 operand):
  "tensorwise" (torchao's Float8Linear, dynamic per-tensor scales, torchao/float8 of 2025), eager: each
      cast is torchao's op sequence, one kernel an op: `torch.max(torch.abs(x))` (abs r2 w2, max r2),
      `x.to(float32) * scale` (r2 w4, r4 w4), the saturating clamp (r4 w4) and `.to(float8)` (r4 w1):
      33 B, 6 launches, for X and W in forward and for dY, X and W again in backward
      (matmul_with_hp_or_float8_args keeps the bf16 X and W and casts them again), and the weight
      gradient's operands copied into the layouts `_scaled_mm` takes (X and dY, r1 w1 each);
  the same under torch.compile (the runtime profiles ending "+compile": torchtitan compiles each
      TransformerBlock, fullgraph) as torchao's own roofline prices a compiled tensorwise cast
      (torchao/float8/roofline_utils.py get_tensor_memory_traffic_ovhd_s): the amax's first stage
      (r2) and its second (a launch), then one kernel writing the fp8 copy in both layouts (X, dY: r2
      w1 w1) or, for the weight, once in forward and again in backward (r2 w1 each); nothing else in
      backward.  Identical casts of one tensor in one compiled graph are one (the joint graph's CSE):
      the X that wq / wk / wv (or w1 / w3) read is cast once, each linear priced its share
      (`fp8_shares`, stamped on the graph beside the autocast widths: costmodel.dtypes.fp8_share_of);
  "tensorwise-tp": "tensorwise" with torchao's float8 tensor-parallel styles (Float8ColwiseParallel,
      Float8RowwiseParallel, PrepareFloat8ModuleInput: torchtitan's enable_float8_tensorwise_tp), on
      torchtitan's sequence-parallel plan: a column-parallel linear's input is cast on this rank's
      sequence shard (1/tp of the gathered X) before the all-gather, which moves fp8 (1 B an element),
      and the gathered fp8 X is what backward keeps (no second cast; a copy into the weight
      gradient's layout, r1 w1 of the gathered X); a row-parallel linear's output gradient is cast to
      fp8 on the shard before the all-gather of backward (1 B), plus the same layout copy.  The
      reduce-scatters (forward after wo / w2, backward of the gathers) stay bf16: what they move is a
      GEMM's bf16 output.  The scalar amax all-reduces over tp are not priced (a latency each);
  "delayed" (Transformer Engine): the scale comes from the amax history and the amax is taken inside a
      fused cast-transpose (read 2, write 1 + 1) for X and W in forward, dY in backward; the FP8
      weight and its transpose are kept across the step's micro-batches (2 bytes per weight element).
  "blockwise" (Transformer Engine's Float8BlockScaling, Megatron-LM's --fp8-recipe blockwise: DeepSeek-V3's
      fine-grained recipe, arXiv 2412.19437 section 3.3): an fp32 scale per 1x128 tile of an activation or
      gradient and per 128x128 block of a weight, taken inside the cast (no amax history).  A cast is one
      pass reading bf16 and writing fp8 with its scales, in both layouts where a second GEMM reads the
      tensor along its other axis: X (forward, for the weight gradient's Xᵀ·dY, tiled along the tokens)
      and dY (backward: dY·Wᵀ and dYᵀ·X) 2 + 2 x (1 + 4/128) B, W 2 + 2 x (1 + 4/128²) B (a 128x128 block
      is one block of the transpose too).  Its GEMM promotes the tensor cores' partial sums to fp32 on
      the CUDA cores every 128 elements of K (section 3.3.2): per output element one fp32 FMA each
      2 x 128 FP8 FLOPs, on H800 / H100 SXM (67 TFLOP/s fp32, 1979 FP8) 0.231 of the MMA time; priced
      exposed, BLOCKWISE_GEMM = 1 / 1.231 of the tensorwise efficiency.  That is the pessimistic end: the
      report overlaps one warpgroup's promotion with another's MMA, and sapp found no public measurement
      of a blockwise against a tensorwise GEMM on one Hopper (DeepGEMM's "up to 1550 TFLOPS" on H800 is a
      best shape, not a comparison).  GEMM operands are read at one byte plus their scales.
The experts' grouped GEMMs run in FP8 under Transformer Engine's recipes (costmodel/fp8_linears.py), priced
by the same functions with the routed rows as X and every local expert's weights as W.
Activation memory (costmodel/memory.py through `cached_width`): Transformer Engine keeps the FP8 copy of
each FP8 GEMM's input for backward instead of the bf16 one ("delayed": 1 byte an element; "blockwise": 1 +
4/128 with its tile scales), a copy of its own (a bf16 tensor another op keeps stays kept), one an
activation however many linears read it (Megatron-Core's fused linear_qkv / linear_fc1 read theirs once;
the experts' up and down GEMMs each theirs, search/joint/ep.py prices the EP share); torchao keeps
the bf16 input, or under the tensor-parallel styles and compile the fp8 copy: priced at bf16 there, an
upper bound."""
from __future__ import annotations

from .fp8_linears import GROUPED_FP8_RECIPES, fp8_shares, is_fp8_gemm, is_fp8_grouped, is_fp8_linear  # noqa: F401

TENSORWISE = ("tensorwise", "tensorwise-tp")
TP_GATHER = "tensorwise-tp"         # the recipe whose tensor-parallel collectives move fp8
EAGER_CAST, EAGER_LAUNCHES = 33.0, 6            # torchao's cast op by op (above)
AMAX, CAST_ONE, CAST_BOTH = 2.0, 3.0, 4.0       # compiled: amax stage 1; one-layout cast; both layouts
LAYOUT_COPY = 2.0                               # an fp8 tensor copied into the other layout (r1 w1)
DELAYED_CAST = 4.0                              # Transformer Engine's cast-transpose
TILE = 128                                      # blockwise: 1 x 128 tiles, 128 x 128 weight blocks
TILE_SCALE = 4.0 / TILE                         # an fp32 scale a 1 x 128 tile, bytes an element
BLOCK_SCALE = 4.0 / TILE ** 2                   # an fp32 scale a 128 x 128 block
BLOCKWISE_ACT = 2.0 + 2 * (1.0 + TILE_SCALE)    # X, dY: read bf16, write both tilings with their scales
BLOCKWISE_WEIGHT = 2.0 + 2 * (1.0 + BLOCK_SCALE)
PROMOTION = (2.0 / 67e12) / (2.0 * TILE / 1979e12)  # fp32 FMA a 128-element interval over its MMA (above)
BLOCKWISE_GEMM = 1.0 / (1.0 + PROMOTION)
WEIGHT_CACHE_BYTES = {"delayed": 2.0, "blockwise": 2.0 * (1.0 + BLOCK_SCALE)}
# bytes an element of the copy of an FP8 GEMM's input Transformer Engine keeps for backward
CACHE_WIDTH = {"delayed": 1.0, "blockwise": 1.0 + TILE_SCALE}


def fp8_rate_ratio(cluster) -> float:
    """FP8 over bf16 peak (0 without FP8 tensor cores)."""
    return float(getattr(cluster, "fp8_peak_flops", 0.0) or 0.0) / cluster.peak_flops


def compiled(settings) -> bool:
    """The blocks run under torch.compile: the runtime profiles ending "+compile" (costmodel/settings.py)."""
    return settings.runtime.endswith("+compile")


def edge_width(prod, cons, backward: bool, settings, width: float) -> float:
    """Bytes an element an activation edge moves: 1 under "tensorwise-tp" into an FP8 linear (its
    input gathered as fp8) and, backward, out of one (its output's gradient cast before the gather);
    `width` otherwise."""
    if settings.fp8 != TP_GATHER:
        return width
    node = prod if backward else cons
    return 1.0 if node is not None and is_fp8_linear(node) else width


def _tp_split(node, numel) -> tuple:
    """(column-parallel, row-parallel, tp): how the strategy splits the linear's weight (the local
    X and output element counts against their whole ones tell which side is split)."""
    w = [o for o in node.operands if o.param is not None]
    tp = (sum(o.numel for o in w) / max(1.0, sum(numel(o) for o in w))) if w else 1.0
    if tp <= 1.0 + 1e-9:
        return False, False, 1.0
    xs = [o for o in node.operands if o.param is None]
    rx = sum(o.numel for o in xs) / max(1.0, sum(numel(o) for o in xs)) if xs else 1.0
    ry = node.out.numel / max(1.0, numel(None))
    return ry > rx, rx > ry, tp


def tensorwise_casts(node, numel, settings, share: int = 1) -> tuple:
    """((forward bytes, launches), (backward bytes, launches)) of a tensorwise FP8 linear's casts on
    this rank (module docstring: eager or compiled, with or without the float8 tensor-parallel styles);
    `share`: the FP8 linears reading its input (fp8_shares)."""
    x = sum(numel(o) for o in node.operands if o.param is None)
    w = sum(numel(o) for o in node.operands if o.param is not None)
    y = numel(None)
    comp = compiled(settings)
    share = share if comp else 1
    col, row, tp = _tp_split(node, numel) if settings.fp8 == TP_GATHER else (False, False, 1.0)
    cast, launches = (AMAX + CAST_ONE, 3) if comp else (EAGER_CAST, EAGER_LAUNCHES)
    fb, fl = cast * w, launches                         # the weight, forward
    bb, bl = (CAST_ONE * w, 1) if comp else (EAGER_CAST * w, EAGER_LAUNCHES)   # and again for dX
    if col or row:              # the fp8 input is kept for backward: one cast, and the layout copy
        xs = x / tp if col else x                       # (PrepareFloat8ModuleInput: once a module)
        fb += cast * xs / share
        fl += launches / share
        bb += LAYOUT_COPY * x / share
        bl += 1.0 / share
    elif comp:                  # torchao's roofline: both layouts in one kernel, nothing in backward
        fb += (AMAX + CAST_BOTH) * x / share
        fl += launches / share
    else:                       # eager: cast in forward, again in backward, then the layout copy
        fb += EAGER_CAST * x
        fl += EAGER_LAUNCHES
        bb += (EAGER_CAST + LAYOUT_COPY) * x
        bl += EAGER_LAUNCHES + 1
    if row:                     # dY cast on the shard before backward's all-gather, then its copy
        bb += cast * y / tp + LAYOUT_COPY * y
        bl += launches + 1
    elif comp:
        bb += (AMAX + CAST_BOTH) * y
        bl += launches
    else:
        bb += (EAGER_CAST + LAYOUT_COPY) * y
        bl += EAGER_LAUNCHES + 1
    return (fb, fl), (bb, bl)


def cached_width(node, i: int, settings) -> float:
    """Bytes an element of the FP8 copy of operand `i` the FP8 GEMM `node` keeps for backward instead of
    the bf16 input (Transformer Engine's recipes, CACHE_WIDTH); 0 where the input is kept as it is."""
    w = CACHE_WIDTH.get(settings.fp8, 0.0)
    if not w or not is_fp8_gemm(node, settings.fp8):
        return 0.0
    o = node.operands[i]
    return w if o.param is None and len(o.shape) >= 2 else 0.0


def grouped_fp8(settings) -> bool:
    """The experts' grouped GEMMs run in FP8 (costmodel/fp8_linears.py GROUPED_FP8_RECIPES)."""
    return settings.fp8 in GROUPED_FP8_RECIPES


def _elems(node, numel) -> tuple:
    """(X, W, Y) local element counts: the float inputs (a grouped GEMM's group ends are no operand of
    the GEMM), the weights, the output."""
    x = sum(numel(o) for o in node.operands if o.param is None and len(o.shape) >= 2)
    w = sum(numel(o) for o in node.operands if o.param is not None)
    return x, w, numel(None)


def te_casts(recipe: str, x: float, w: float, y: float) -> tuple:
    """((forward bytes, launches), (backward bytes, launches)) of Transformer Engine's casts of one FP8
    GEMM's X and W (forward) and dY (backward): "delayed" or "blockwise" (module docstring)."""
    if recipe == "blockwise":
        return (BLOCKWISE_ACT * x + BLOCKWISE_WEIGHT * w, 2), (BLOCKWISE_ACT * y, 1)
    return (DELAYED_CAST * (x + w), 2), (DELAYED_CAST * y, 1)


def fp8_gemm_times(ff, fb, x, w, y, casts, cluster, settings, grad: bool, overlap: float) -> tuple:
    """(forward s, backward s, weight-cache bytes) of an FP8 GEMM of `ff` / `fb` FLOPs over X, W, Y of
    `x`, `w`, `y` elements with `casts` ((forward bytes, launches), (backward bytes, launches)); the
    experts' grouped GEMMs under EP are repriced with it (costmodel/moe.py), so the delta is this one."""
    from .primitives import compute_time, kernel_efficiency
    recipe = settings.fp8
    ratio = fp8_rate_ratio(cluster) * (BLOCKWISE_GEMM if recipe == "blockwise" else 1.0)
    sx, sw = (TILE_SCALE, BLOCK_SCALE) if recipe == "blockwise" else (0.0, 0.0)    # scales read beside
    out_w = 2.0                     # the GEMM writes bf16
    eff_f = kernel_efficiency("matmul", False, cluster, settings) * ratio
    eff_b = kernel_efficiency("matmul", True, cluster, settings) * ratio
    (cf, lf), (cb, lb) = casts
    fwd = compute_time(ff, x * (1 + sx) + w * (1 + sw) + out_w * y, cluster, 1, efficiency=eff_f, overlap=overlap)
    fwd += compute_time(0.0, cf, cluster, lf)
    if not grad:
        return fwd, 0.0, 0.0
    bwd = compute_time(fb, 2 * y * (1 + sx) + x * (1 + sx) + w * (1 + sw) + out_w * (x + w), cluster, 2,
                       efficiency=eff_b, overlap=overlap)
    bwd += compute_time(0.0, cb, cluster, lb)
    return fwd, bwd, WEIGHT_CACHE_BYTES.get(recipe, 0.0) * w


def fp8_times(node, numel, ff, fb, cluster, settings, grad: bool, overlap: float, share: int = 1) -> tuple:
    """(forward s, backward s, weight-cache bytes) of an FP8 linear or grouped GEMM; `numel(operand or
    None)` the local element count of an operand (None: the output); `share` as tensorwise_casts."""
    x, w, y = _elems(node, numel)
    if settings.fp8 in TENSORWISE:
        casts = tensorwise_casts(node, numel, settings, share)
    else:
        casts = te_casts(settings.fp8, x, w, y)
    return fp8_gemm_times(ff, fb, x, w, y, casts, cluster, settings, grad, overlap)
