"""Single-process rates measured inside a worker: GEMM FLOP/s, memory and RNG bandwidth (large and by
size), host<->device copies, non-GEMM operator rates."""
from __future__ import annotations

from .machine import _timeit


def _measure_gemm(torch, dev, cfg, sync):
    """FLOP/s of square GEMMs at the configured sizes (bf16 on GPUs, fp32 on CPUs)."""
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    gemm = {}
    # a GPU's matrix units fill only at thousands per side (H100 bf16: ~190 TFLOP/s at 1536, ~750 at 8192)
    for n in (cfg["gemm_cuda"] if dev.type == "cuda" else cfg["gemm"]):
        # cache-hot repeats, as in training a small model's operands stay in cache (gpt-small on this
        # CPU: 77 GFLOP/s in a profiled step, 77 here; rotating 96 MB of operands gave 67)
        a = torch.randn(n, n, device=dev, dtype=dtype)
        b = torch.randn(n, n, device=dev, dtype=dtype)
        t = _timeit(lambda: torch.mm(a, b), cfg["min_time"], sync)
        gemm[n] = 2.0 * n ** 3 / t
    return gemm


def _measure_local(torch, dev, cfg, sync):
    gemm = _measure_gemm(torch, dev, cfg, sync)
    numel = cfg["copy_mb"] * (1 << 20) // 4
    src = torch.empty(numel, device=dev, dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    t_copy = _timeit(lambda: dst.copy_(src), cfg["min_time"], sync)
    other = torch.empty_like(src).uniform_()
    t_add = _timeit(lambda: torch.add(src, other, out=dst), cfg["min_time"], sync)
    # dropout: one random draw per element (what dropout masks cost beyond the memory traffic)
    t_rng = _timeit(lambda: torch.nn.functional.dropout(src, 0.1, True), cfg["min_time"], sync)
    copy_bw = 2.0 * numel * 4 / t_copy            # read + write
    add_bw = 3.0 * numel * 4 / t_add              # two reads + one write
    curve_bw, curve_rng = [], []
    # CPU only: a GPU's small ops are launch-bound (priced by op_overhead), and timing each call with a
    # synchronise would measure that latency, not the cache
    for kb in (cfg["curve_kb"] if dev.type != "cuda" else ()):
        # as in training: inputs just written (warm where they fit in cache), a fresh output each call
        n = kb * 1024 // 4
        a = torch.empty(n, device=dev, dtype=torch.float32).uniform_()
        b = torch.empty_like(a).uniform_()
        t = _timeit(lambda: torch.add(a, b), cfg["min_time"] / 2, sync)
        curve_bw.append((3.0 * n * 4, 3.0 * n * 4 / t))
        t = _timeit(lambda: torch.nn.functional.dropout(a, 0.1, True), cfg["min_time"] / 2, sync)
        curve_rng.append((float(n), n / t))
    h2d = None
    if dev.type == "cuda":
        host = torch.empty(numel, dtype=torch.float32).pin_memory()
        t_h2d = _timeit(lambda: dst.copy_(host, non_blocking=True), cfg["min_time"], sync)
        h2d = numel * 4 / t_h2d
    return {"gemm_flops": gemm, "copy_bw": copy_bw, "add_bw": add_bw, "h2d_bw": h2d, "rng_rate": numel / t_rng,
            "mem_bw_curve": curve_bw or None, "rng_curve": curve_rng or None}


def _op_cases(torch, dev, n):
    """name -> (make inputs, run) for the non-GEMM ops transformers and MLPs spend time in; ~n elements
    each, in shapes like theirs (softmax over 64 keys, layer norm over 128 features, a causal mask
    broadcast over batch and heads, a 512-way loss)."""
    F = torch.nn.functional
    x = lambda *shape: torch.randn(*shape, device=dev, requires_grad=True)
    heads = max(1, n // 4096)
    return {
        "gelu": (lambda: (x(n),), lambda a: F.gelu(a)),
        "relu": (lambda: (x(n),), lambda a: F.relu(a)),
        "silu": (lambda: (x(n),), lambda a: F.silu(a)),
        "add": (lambda: (x(n), x(n)), lambda a, b: a + b),
        "mul": (lambda: (x(n), x(n)), lambda a, b: a * b),
        "softmax": (lambda: (x(n // 64, 64),), lambda a: torch.softmax(a, -1)),
        "log_softmax": (lambda: (x(n // 512, 512),), lambda a: torch.log_softmax(a, -1)),
        "layer_norm": (lambda: (x(n // 128, 128), x(128), x(128)), lambda a, w, b: F.layer_norm(a, (128,), w, b)),
        "masked_fill": (lambda: (x(heads, 64, 64),),
                        lambda a: a.masked_fill(torch.ones(64, 64, dtype=torch.bool, device=dev).triu(1), 0.0)),
        "cross_entropy_loss": (lambda: (x(n // 512, 512),),
                               lambda a: F.cross_entropy(a, torch.zeros(a.shape[0], dtype=torch.long, device=dev))),
    }


def _measure_op_rates(torch, dev, cfg, sync):
    """Forward and backward elements/s of each op in `_op_cases` (autograd recording as in training;
    backward time = forward+backward - forward)."""
    n = cfg["op_elems"]
    out = {}
    for name, (make, fn) in _op_cases(torch, dev, n).items():
        args = make()
        elems = float(max(a.numel() for a in args))
        t_f = _timeit(lambda: fn(*args), cfg["min_time"] / 4, sync)

        grad_out = torch.ones_like(fn(*args))

        def fwd_bwd():
            # gradients handed back, not accumulated into the inputs: as between layers in training
            torch.autograd.grad(fn(*args), args, grad_out)

        t_fb = _timeit(fwd_bwd, cfg["min_time"] / 4, sync)
        out[name] = (elems / t_f, elems / max(t_fb - t_f, 0.05 * t_fb))
    return out
