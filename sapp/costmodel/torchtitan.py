"""Terms of the "torchtitan" runtime profile (costmodel/settings.py) read off the code torchtitan's
published Llama 3.1 8B runs used (benchmarks/llama3_h100_202412_torchtitan.md: torchtitan 9dec370,
torch 1963fc8, Dec 2024, eager, `norm_type = "rmsnorm"`): pure functions, one per kernel sequence.

- RMSNorm: torchtitan's `RMSNorm.forward` (torchtitan/models/norms.py at 9dec370) is
  `self._norm(x.float()).type_as(x) * self.weight` with `_norm(x) = x * torch.rsqrt(x.pow(2).mean(-1,
  keepdim=True) + eps)`: one eager kernel per op, fp32 in between (aten's composite `rms_norm`, what
  nn.RMSNorm runs without a fused CUDA kernel, is the same sequence: upcast, pow, mean, add_, rsqrt,
  mul, type_as, mul by the weight).  Per element of a bf16 input, forward: float() r2 w4, pow r4 w4,
  mean r4, x * rsqrt r4 w4, type_as r4 w2, * weight r2 w2 = 36 B.  Backward (autograd of those):
  * weight (grad_in r2 w2; grad_weight: g * out r2 r2 w2, then its row sum r2) 12, type_as's
  ToCopyBackward r2 w4 6, x * rsqrt (grad_x r4 w4; grad_rsqrt: g * x r4 r4 w4, its row sum r4) 24,
  mean's expand-divide w4 4, pow's `grad * (2 * x.pow(1))` (copy r4 w4, scale r4 w4, product r4 r4
  w4) 28, the two gradients of the fp32 x summed r4 r4 w4 12, float()'s ToCopyBackward r4 w2 6 =
  92 B.  The profile prices the fused norm's 2 B in and 2 B out per element otherwise.
- The loss: `cross_entropy(pred.flatten(0, 1).float(), labels)` (train.py at 9dec370).  Forward:
  float() r2 w4; log_softmax over a 128K vocabulary (torch's blockwise softmax: the row max, the row
  sum of exp, then the write pass: three reads, one write) r12 w4; nll_loss reads one element a row:
  22 B a logit.  Backward: nll_loss_backward's zeros w4 (then a scatter of one a row);
  log_softmax_backward (the row sum of the gradient r4, then grad - exp(out) * sum r4 r4 w4) 16;
  float()'s ToCopyBackward r4 w2 6: 26 B.
- Memory at the loss's backward (torchtitan logs the caching allocator's `max_reserved`): autograd
  holds the saved log-probabilities (fp32, an activation sapp counts), nll_loss_backward's fp32
  gradient and log_softmax_backward's fp32 result at once: 8 B a logit beyond the stash.  The
  allocator (c10/cuda/CUDACachingAllocator: freed blocks stay cached, a request takes the smallest
  cached block at least its size, blocks of separate cudaMallocs never merge) also keeps `pred`'s
  bf16 block (2 B a logit, freed by `del pred` before backward) that neither fp32 request fits: the
  second one is a new cudaMalloc.  The reserved peak holds 10 B a logit beyond the stash.
- Attention: torchtitan calls F.scaled_dot_product_attention(is_causal=True); torch's SDPA of that
  time tried FlashAttention-2 first on H100 (cuDNN attention was deprioritised:
  pytorch/pytorch#141133, #142132 of 2024-12-05 on 2.6.0.dev20241204: SDPA 329 TFLOP/s against
  cuDNN's 631 at the same shape; torchtitan put cuDNN first only on B200 later, pytorch/torchtitan#1196).
  The Hopper presets carry cuDNN's figures (sapp/cluster/__init__.py, FlashAttention-3's paper, Shah et al.
  2024, Fig. 5-6 at 4k, head dim 128); the same figures give FlashAttention-2 319 TFLOP/s causal
  forward against cuDNN's 518 and 310 backward against 499: the profile scales a cluster's attention
  figures by those ratios.
- The update: torchtitan builds torch.optim.AdamW / Adam with foreach=True, fused=False and weight decay
  0.1 (torchtitan/optimizer.py at 9dec370), and clips the gradients first (utils.clip_grad_norm_,
  foreach).  FSDP2 keeps the weights, gradients and moments fp32.  torch's _multi_tensor_adamw, per
  parameter: weight decay `_foreach_mul_(params)` r4 w4, `_foreach_lerp_(exp_avgs, grads)` r8 w4,
  `_foreach_mul_(exp_avg_sqs)` r4 w4, `_foreach_addcmul_(exp_avg_sqs, grads, grads)` r12 w4,
  `_foreach_sqrt` r4 w4, `_foreach_div_` r4 w4, `_foreach_add_(eps)` r4 w4, `_foreach_addcdiv_(params,
  exp_avgs, denom)` r12 w4: 84 B (Adam's L2 decay `_foreach_add(grads, params)` r8 w4 in place of the
  mul: 88 B); the clip's `_foreach_norm` r4 and `_foreach_mul_(grads, coef)` r4 w4: 12 B.

- FSDP2's copies around its collectives (torch/distributed/fsdp/_fully_shard/, torch 2.13 as installed;
  torchtitan shards each block and the root with fully_shard, Shard(0), param_dtype bf16, reduce_dtype
  fp32).  Per local element of a parameter of a unit sharded over n ranks, wb the param dtype's bytes,
  rb the reduce dtype's, 4 the fp32 sharded (master) parameter's:
  * all-gather copy-in, _fsdp_collectives.py:_get_param_all_gather_inputs (the fp32 shard cast into a
    flat bf16 buffer, r4 w2: `_foreach_copy_`) then :all_gather_copy_in_cuda (`_foreach_copy_` into
    this rank's slice of the all-gather output, r2 w2): (4 + wb + 2 wb) / n B (2 wb / n without a cast).
    foreach_all_gather runs both under `all_gather_copy_in_stream`, which _fsdp_param_group.py:
    FSDPCommContext.get_all_gather_streams makes a separate stream for the implicit prefetch of
    forward and pre-backward: overlapped, priced with the gather it feeds (memory contention only).
  * all-gather copy-out, :foreach_all_gather_copy_out (`split_with_sizes_copy` of the gathered buffer
    into the unsharded parameters, r wb w wb: 2 wb B), called by _fsdp_param_group.py:
    FSDPParamGroup.wait_for_unshard on the current (compute) stream after it waits on the all-gather's
    event: exposed, wherever the all-gather is priced (every forward and backward under ZeRO-3, once
    a step under ZeRO-2, whose gathered parameters stay until the step's last backward).
  * reduce-scatter copy-in, :foreach_reduce -> :foreach_reduce_scatter_copy_in (`_chunk_cat` of the
    unsharded bf16 gradients into the flat reduce_dtype input, casting: r wb w rb B), on the current
    stream before `reduce_scatter_stream.wait_stream(current_stream)`: exposed, once a step with the
    gradient sync (sapp syncs on the last micro-batch, as torch.distributed.pipelining's stages do).
    Under fp32 reduce it writes twice the bytes a bf16 reduce would.
  * :_get_gradient_divide_factors gives no pre-/post-divide for an fp32 (or bf16) reduce dtype (NCCL's
    ReduceOp.AVG divides): 0 B.  The reduce-scatter output becomes the sharded gradient as a view
    (`torch.as_strided`), cast by `_to_dtype_if_needed` only when reduce_dtype is not the fp32 sharded
    parameter's dtype ((rb + 4) / n B on the reduce-scatter stream: overlapped), and `+=` into an
    existing gradient only when one is kept between syncs (sapp syncs once a step: none).
  * memory (stage transient, search/joint/numbers.zero3_gathered): a unit's post-backward holds its
    unsharded bf16 gradients (wb B) while it writes the fp32 reduce-scatter input (rb B), which
    FSDPParamGroup.post_backward keeps in `comm_ctx.reduce_scatter_states` until the next unit's
    post-backward (reduce_scatter_max_input_buffers 1): during a block's backward the previous
    block's input is held beside its own gradients, at its copy-in its own.  Either way (wb + rb) B an
    element of an identical block beside its gathered parameters.

Era: the RMSNorm and attention terms are the benchmark's kernels (Dec 2024), priced only under the
"torchtitan-2412" profiles, which `sapp import` chooses for a TOML of that era's schema
(sapp/engines/torchtitan_2412.py).  "torchtitan-2412+compile" is that stack with its training.compile on:
torch.compile (fullgraph) on each TransformerBlock, whose inductor graph fuses the eager RMSNorm's ops
into one kernel (priced as the fused norm) and leaves SDPA's kernel choice as it is (FlashAttention-2).  torch later gained a fused CUDA RMSNorm (aten._fused_rms_norm,
pytorch/pytorch#153666) and torchtitan's llama3 moved to nn.RMSNorm, so the current profiles price the
norm as one fused kernel.  Their attention: "torchtitan-0.2.2" (`--target torchtitan@0.2.2`) calls SDPA,
which a current torch on Hopper dispatches to cuDNN's kernel first (check_prefer_cudnn_attention), the
cluster's attention figures; "torchtitan" (`--target torchtitan`, torchtitan 0.3) runs what sapp's
export names, `attn_backend="varlen"`: torch's varlen_attn, which torchtitan 0.3 switches to
FlashAttention-3 on Hopper (models/common/attention.py VarlenAttention, tools/utils.py
get_cuda_flash_attention_impl), the cluster's flash_attention figures (FlashAttention-3's paper on
the Hopper presets).  The loss, its backward memory and the update are the same code in all three."""
from __future__ import annotations

ERA_2412 = "torchtitan-2412"     # the profile of the benchmark's stack; "torchtitan" is a current one
ERA_2412_COMPILE = "torchtitan-2412+compile"     # that stack with each block compiled (its norm fused)
ERAS_2412 = (ERA_2412, ERA_2412_COMPILE)
CURRENT = "torchtitan"           # torchtitan 0.3 as sapp exports it (varlen FlashAttention)
RMSNORM_FWD_BYTES, RMSNORM_BWD_BYTES = 36, 92
CE_FWD_BYTES, CE_BWD_BYTES = 22, 26
LOSS_BWD_LIVE_BYTES = 4 + 4 + 2
FA2_OVER_CUDNN = (319 / 518, 310 / 499)       # (forward, backward), FlashAttention-3 paper Fig. 5-6, 4k
UPDATE_BYTES = {"adamw": 84 + 12, "adam": 88 + 12}
MASTER_BYTES = 4                # FSDP2's sharded parameters (the optimizer's master copy) stay fp32


def _local(o, factors):
    n = 1.0
    for s, d in zip(o.shape, o.dims):
        n *= s / (factors.get(d, 1) if d is not None else 1)
    return n


def _logits(node):
    """The logits operand of a cross-entropy loss on activations, else None."""
    if node.kind != "loss" or "cross_entropy" not in node.target or not node.operands:
        return None
    o = node.operands[0]
    if o.param is not None or o.dtype not in ("float32", "float16", "bfloat16"):
        return None
    return o


def pass_bytes(node, factors, settings):
    """(forward, backward) memory traffic of `node`'s shard as torchtitan's eager code runs it: its
    loss, and under the benchmark's era ("torchtitan-2412") its RMSNorm (module docstring); None for
    any other op or runtime."""
    if not settings.torchtitan or not settings.mixed:
        return None
    if node.kind == "norm" and "rms_norm" in node.target and node.operands:
        if settings.runtime != ERA_2412:
            return None         # a current stack's nn.RMSNorm, or the 2412 stack's compiled block: one fused kernel
        n = _local(node.operands[0], factors)
        return n * RMSNORM_FWD_BYTES, n * RMSNORM_BWD_BYTES
    o = _logits(node)
    if o is None:
        return None
    n = _local(o, factors)
    rest = sum(_local(p, factors) * settings.act_bytes(p.dtype) for p in node.operands[1:])
    return n * CE_FWD_BYTES + rest, n * CE_BWD_BYTES


def flash_kernel(settings) -> bool:
    """Attention runs FlashAttention's own kernel, priced at the cluster's flash_attention figures: the
    "torchtitan" profile, torchtitan 0.3's varlen attention as sapp exports it (module docstring)."""
    return settings is not None and settings.runtime == CURRENT


def attention_scale(backward: bool, settings) -> float:
    """Factor on a cluster's fused-attention efficiency: torch SDPA's FlashAttention-2 over cuDNN's
    kernel under the benchmark's era ("torchtitan-2412", compiled or not: module docstring), 1 otherwise."""
    if settings is None or settings.runtime not in ERAS_2412:
        return 1.0
    return FA2_OVER_CUDNN[1 if backward else 0]


def loss_backward_bytes(node, factors, settings) -> float:
    """Bytes the backward of a cross-entropy loss holds beyond the activations it saved, per device:
    the two fp32 gradients and the cached block of the bf16 logits (module docstring), under the
    torchtitan profile; 0 for any other op or runtime."""
    if not settings.torchtitan or not settings.mixed:
        return 0.0
    o = _logits(node)
    return 0.0 if o is None else _local(o, factors) * LOSS_BWD_LIVE_BYTES


def loss_class_shards(node, strategy, sizes, roles, settings) -> int:
    """The tensor-parallel ranks a cross-entropy loss's classes are spread over under the torchtitan
    profile: torchtitan runs the loss vocab-parallel (train.py `loss_parallel` unless
    `disable_loss_parallel`; the output layer's ColwiseParallel keeps its logits Shard(-1)), so its
    logits, log-probabilities and their gradients are each tp rank's share of the vocabulary: the
    sizes of the `tp` levels (`roles`) the loss's `strategy` leaves unsplit.  1 otherwise.  Memory
    only (pipeline/profile.py): the loss's passes (`pass_bytes`) are still timed on the logits the
    strategy gives the rank, whole over tp."""
    if not settings.torchtitan or _logits(node) is None or not roles:
        return 1
    k = 1
    for s, size, role in zip(strategy, sizes, roles):
        if role == "tp" and s is None:
            k *= size
    return k


def update_bytes(settings):
    """Bytes per parameter torchtitan's clip and foreach update move (module docstring), or None for
    another runtime or optimizer (costmodel.optimizer prices those)."""
    if not settings.torchtitan or not settings.mixed:
        return None
    return UPDATE_BYTES.get(settings.optimizer)


def fsdp_copy_bytes(numel, n, settings) -> dict:
    """Bytes FSDP2's copies move for one parameter of `numel` local (unsharded) elements sharded over
    `n` ranks, under a torchtitan profile (module docstring, each from its torch function): "gather_in"
    per all-gather (overlapped), "copy_out" per all-gather (exposed), "rs_in" per reduce-scatter
    (exposed), "rs_out" per reduce-scatter (overlapped).  Empty for another runtime or n <= 1."""
    if not settings.torchtitan or n <= 1 or numel <= 0:
        return {}
    wb, rb = settings.weight_bytes, settings.reduce_bytes
    cast = MASTER_BYTES + wb if wb != MASTER_BYTES else 0
    return {"gather_in": numel / n * (cast + 2 * wb), "copy_out": numel * 2 * wb,
            "rs_in": numel * (wb + rb), "rs_out": numel / n * (rb + MASTER_BYTES if rb != MASTER_BYTES else 0)}


def fsdp_held_ratio(settings) -> float:
    """Bytes a block's backward holds beside its gathered parameters (its unsharded gradients and one
    fp32 reduce-scatter input, module docstring), per gathered byte, under a torchtitan profile; 0
    otherwise."""
    if not settings.torchtitan:
        return 0.0
    return (settings.weight_bytes + settings.reduce_bytes) / settings.weight_bytes
