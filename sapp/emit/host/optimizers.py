"""The host's optimizers: SparseFtrl (FTRL-Proximal for wide tables) and OffloadAdam (ZeRO-Offload-style
Adam/AdamW with the master weights and moments on the CPU), built by host.build_optimizers."""
from __future__ import annotations

import time

import torch

from ...errors import PlanError
from .stats import HostStats


# ---- sparse FTRL ----------------------------------------------------------------------------------
class SparseFtrl(torch.optim.Optimizer):
    """FTRL-Proximal (McMahan et al. 2013), per coordinate, for sparse (touched rows only) or dense
    gradients.  State: z (linear) and n (squared-gradient accumulator, starts at
    `initial_accumulator`).  Per touched coordinate with gradient g:
        sigma = (sqrt(n + g^2) - sqrt(n)) / lr;  z += g - sigma * w;  n += g^2
        w = 0 if |z| <= l1 else -(z - sign(z) * l1) / ((beta + sqrt(n)) / lr + l2)
    Untouched rows of a sparse gradient keep their weight and state (lazy)."""

    def __init__(self, params, lr=0.01, l1=0.0, l2=0.0, beta=0.0, initial_accumulator=0.1):
        if lr <= 0:
            raise ValueError(f"FTRL lr must be positive, got {lr}")
        super().__init__(params, dict(lr=lr, l1=l1, l2=l2, beta=beta, initial_accumulator=initial_accumulator))

    @staticmethod
    def _update(w, g, z, n, lr, l1, l2, beta):
        n_new = n + g * g
        sigma = (n_new.sqrt() - n.sqrt()) / lr
        z = z + g - sigma * w
        denom = (beta + n_new.sqrt()) / lr + l2
        w_new = torch.where(z.abs() <= l1, torch.zeros_like(z), -(z - z.sign() * l1) / denom)
        return w_new, z, n_new

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            hp = (group["lr"], group["l1"], group["l2"], group["beta"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["z"] = torch.zeros_like(p)
                    st["n"] = torch.full_like(p, group["initial_accumulator"])
                g = p.grad
                if g.is_sparse:
                    g = g.coalesce()
                    idx, vals = g.indices()[0], g.values()
                    w, z, n = self._update(p[idx], vals, st["z"][idx], st["n"][idx], *hp)
                    p.index_copy_(0, idx, w)
                    st["z"].index_copy_(0, idx, z)
                    st["n"].index_copy_(0, idx, n)
                else:
                    w, z, n = self._update(p, g, st["z"], st["n"], *hp)
                    p.copy_(w)
                    st["z"].copy_(z)
                    st["n"].copy_(n)
        return loss


# ---- optimizer offload -------------------------------------------------------------------------
def _master(p, pin: bool):
    """p's fp32 master copy on the host (pinned if `pin`, except DTensor shards); a float64
    parameter's master stays float64 (narrowing it would round every step of a float64 run)."""
    m = p.detach().to("cpu", torch.promote_types(p.dtype, torch.float32)).clone()
    if pin and not hasattr(m, "placements"):
        m = m.pin_memory()
    return m.requires_grad_(True)


class OffloadAdam(torch.optim.Optimizer):
    """ZeRO-Offload-style Adam/AdamW: the device parameters keep their dtype; an fp32 master copy, the
    moments and an fp32 gradient accumulator live on the CPU.  step(): gradients device -> CPU (unless
    streamed), CPU Adam on the masters, updated weights CPU -> device (cast to the device dtype).
    With stream_grads=True each gradient is copied to the CPU accumulator as soon as backward has
    accumulated it and the device gradient is freed (the device then never holds all gradients;
    micro-batches accumulate on the host).  Not for use inside DDP/FSDP with stream_grads=True (their
    reducers own .grad).

    overlap=True (implies streaming; what sapp/placement/cost.py prices): during the step's last
    backward (`accumulations` backwards per step: the micro-batches), a parameter group (`groups`: lists
    of parameter indices, e.g. one per block; default one per parameter) whose every gradient is final
    runs its CPU Adam and copies its weights back at once, while backward goes on with the earlier
    layers -- gradient copy -> CPU Adam -> weight copy as a pipeline over the groups.  On a CUDA device
    the copies are asynchronous (pinned buffers, an event per gradient) and the group's Adam runs on one
    worker thread; on a CPU device it runs in the hook (one set of cores: nothing to overlap, the order
    is the same).  Adam's update of a parameter reads only its own gradient and state, so stepping the
    groups one by one equals one step over all (tests/test_offload_overlap.py).  `late`: parameter
    indices left to step() (e.g. pipeline-tied weights whose gradients are summed between stages after
    backward); `grad_divisor`: what the host gradient is divided by first (a pipeline schedule divides
    the device gradients by its micro-batch count after backward; streamed ones it never sees)."""

    def __init__(self, params, lr=1e-3, *, kind="adam", betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 stream_grads=False, stats: HostStats | None = None, sparse_ids=frozenset(), overlap=False,
                 accumulations=1, groups=None, late=frozenset(), grad_divisor=1):
        params = [p for p in params if p.requires_grad]
        super().__init__(params, dict(lr=lr))
        self.stats = stats or HostStats()
        # with a CUDA device the masters live in pinned memory: the weight copy back is then a real
        # asynchronous DMA at the link's rate (what the price assumes); from pageable memory it is a
        # synchronous staged copy at a fraction of it (measured on an H200, bench/gpu_offload.py: the
        # gpt3-1.3b offload step fell from 1652 to 791 ms when the masters were pinned)
        pin = any(p.device.type == "cuda" for p in params)
        self.masters = [_master(p, pin) for p in params]
        self._acc = [None] * len(params)
        cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}.get(kind)
        if cls is None:
            raise PlanError(f"optimizer offload supports adam and adamw, not {kind!r}")
        extra = {"weight_decay": weight_decay} if weight_decay or kind == "adamw" else {}
        # fused: torch's vectorised CPU Adam kernel (~2x its per-tensor loop here; DeepSpeed's CPU Adam
        # plays this role there) on the plain masters.  A tensor-parallel parameter's master is a DTensor
        # (its local shard, with the parameter's placements, so checkpoints reshard it over tp): the fused
        # kernel refuses a mix of DTensors and plain tensors, so those run in their own param group on
        # torch's per-tensor loop, as emit runs DTensor parameters everywhere else.
        # sparse-gradient tables (nn.Embedding(sparse=True)): their masters take SparseAdam (lazy Adam,
        # the same dense moments), which Adam's kernels refuse
        sparse = [m for m, p in zip(self.masters, params) if id(p) in sparse_ids]
        self.inner_sparse = torch.optim.SparseAdam(sparse, lr=lr, betas=betas, eps=eps) if sparse else None
        rest = [m for m, p in zip(self.masters, params) if id(p) not in sparse_ids]
        plain = [m for m in rest if not hasattr(m, "placements")]
        dtensors = [m for m in rest if hasattr(m, "placements")]
        groups_ = ([{"params": plain, "fused": True}] if plain else []) + \
                  ([{"params": dtensors, "fused": False}] if dtensors else [])
        self.inner = cls(groups_, lr=lr, betas=betas, eps=eps, **extra) if groups_ else None
        self.overlap = bool(overlap)
        self.stream = stream_grads or self.overlap
        self.accumulations = max(1, int(accumulations))
        self.grad_divisor = grad_divisor
        # sparse tables and `late` parameters keep their device gradient for step()
        self._late = set(late) | {i for i, p in enumerate(params) if id(p) in sparse_ids}
        if groups is None:
            groups = [[i] for i in range(len(params))]
        self.groups = [[i for i in g if i not in self._late] for g in groups]
        self.groups = [g for g in self.groups if g]
        self._group_of = {i: k for k, g in enumerate(self.groups) for i in g}
        self._async = self.overlap and any(p.device.type == "cuda" for p in params)
        self._worker = None
        self._reset_step()
        self._hooks = []
        if self.stream:
            for i, p in enumerate(params):
                if i not in self._late:
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._make_hook(i)))

    def _reset_step(self):
        self._seen = [0] * len(self._acc)
        self._pending = [len(g) for g in self.groups]
        self._stepped = set()      # groups updated during this step's last backward
        self._futures = []

    def _make_hook(self, i):
        def hook(p):
            t = time.perf_counter()
            g = p.grad.detach()
            if self._async and not hasattr(g, "to_local"):   # async copy into pinned memory; the worker waits for its event
                buf = torch.empty(g.shape, dtype=g.dtype, device="cpu", pin_memory=True)
                buf.copy_(g, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record()
            else:
                buf, ev = g.to("cpu", self.masters[i].dtype), None
            p.grad = None
            self._seen[i] += 1
            last = self.overlap and self._seen[i] == self.accumulations
            self.stats.add("offload_d2h_s", time.perf_counter() - t)
            if self._async:
                if self._worker is None:
                    from concurrent.futures import ThreadPoolExecutor
                    self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sapp-offload")
                self._futures.append(self._worker.submit(self._arrive, i, buf, ev, last))
            else:
                self._arrive(i, buf, ev, last)
        return hook

    def _arrive(self, i, buf, ev, last):
        """Gradient i reached the host: accumulate it; the last one of a group's last backward steps it."""
        if ev is not None:
            ev.synchronize()
            buf = buf.to(self.masters[i].dtype)
        self._acc[i] = buf if self._acc[i] is None else self._acc[i].add_(buf)
        if last:
            k = self._group_of[i]
            self._pending[k] -= 1
            if self._pending[k] == 0:
                with torch.autograd.profiler.record_function(f"sapp.offload_adam.group{k}"):
                    self._update(self.groups[k])
                self._stepped.add(k)

    @property
    def device_params(self):
        return self.param_groups[0]["params"]

    def _host_grad(self, i, p):
        if i in self._late or not self.stream:
            return None if p.grad is None else p.grad.detach().to("cpu", self.masters[i].dtype)
        g = self._acc[i]
        if g is not None and self.grad_divisor != 1:
            g = g.div_(self.grad_divisor)
        return g

    @torch.no_grad()
    def _update(self, idx):
        """Host gradient -> CPU Adam -> weights back to the device, for the parameters `idx` (Adam
        skips masters without a gradient, so the others are untouched)."""
        t = time.perf_counter()
        params = self.device_params
        for i in idx:
            self.masters[i].grad = self._host_grad(i, params[i])
        t1 = time.perf_counter()
        for inner in self._inners():
            for g in inner.param_groups:       # an LR scheduler changes the outer group's lr
                g["lr"] = self.param_groups[0]["lr"]
            inner.step()
        t2 = time.perf_counter()
        for i in idx:
            p, m = params[i], self.masters[i]
            if m.grad is not None:
                if m.is_pinned():
                    # a pinned master crosses in fp32 and is cast on the device (a cast on the host
                    # would make a pageable temporary and a synchronous copy)
                    p.copy_(m.detach().to(p.device, non_blocking=True))
                else:
                    p.copy_(m.detach().to(p.device, p.dtype))
            m.grad = None
            self._acc[i] = None
        t3 = time.perf_counter()
        if not self.stream:
            self.stats.add("offload_d2h_s", t1 - t)
        self.stats.add("optimizer_s", t2 - t1)
        self.stats.add("offload_h2d_s", t3 - t2)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for f in self._futures:          # the worker's copies and group updates of this step
            f.result()
        done = {i for k in self._stepped for i in self.groups[k]}
        rest = [i for i in range(len(self.masters)) if i not in done]
        if rest:
            with torch.autograd.profiler.record_function("sapp.offload_adam.after_backward"):
                self._update(rest)
        self._reset_step()
        return loss

    def _inners(self):
        return [o for o in (self.inner, self.inner_sparse) if o is not None]

    def state_dict(self):
        out = {"inner": self.inner.state_dict() if self.inner else {}, "masters": [m.detach() for m in self.masters]}
        if self.inner_sparse is not None:
            out["inner_sparse"] = self.inner_sparse.state_dict()
        return out

    def load_state_dict(self, sd):
        if self.inner is not None:
            self.inner.load_state_dict(sd["inner"])
        if self.inner_sparse is not None:
            self.inner_sparse.load_state_dict(sd["inner_sparse"])
        with torch.no_grad():
            for m, src, p in zip(self.masters, sd["masters"], self.device_params):
                m.copy_(src)
                p.copy_(src.to(p.device, p.dtype))
