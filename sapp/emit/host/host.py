"""Run a plan's "placement" section (see sapp/placement for the schema): host embedding tables with
sparse optimizers, ZeRO-Offload-style optimizer offload, and a single-process training loop.

    apply_placement(model, section, device)     # in place: host tables stay on the CPU, rest -> device
    opts = build_optimizers(model, section, lr)  # SparseAdam / SparseFtrl / OffloadAdam / Adam(W)
    train_steps(model, section, batches, steps, device)   # per-step losses + host timings

Host tables become `HostEmbedding` (an nn.Embedding subclass, so qualnames and state dicts are
unchanged): ids are moved to the CPU, rows are gathered there with sparse gradients, and the rows go
to the device with `.to(device, non_blocking=True)`; their gradients come back in backward.  The
module refuses to move with `model.to(...)`.  Timings (lookup, h2d, d2h, optimizer, offload
copies) accumulate in `model.sapp_host_stats` (a HostStats).

Wide&Deep losses (`train_steps`), as in MindSpore's Wide&Deep: both parts are trained on the BCE of
the combined logit (wide + deep); `wide_loss` is that BCE, `deep_loss` adds an L2 penalty
`l2_coef * 0.5 * sum(w^2)` over the deep MLP weight matrices.  The wide parameters (qualnames starting
with "wide") are updated by FTRL with the gradient of wide_loss, the deep ones by (lazy) Adam with the
gradient of deep_loss; since the penalty involves deep parameters only, one backward of deep_loss
gives both gradients exactly."""
from __future__ import annotations

import fnmatch
import time

import torch
from torch import nn
from torch.nn import functional as F

from ...errors import PlanError
from ...placement.schema import resolve, validate_section
from .optimizers import OffloadAdam, SparseFtrl
from .stats import HostStats


def _stats(model) -> HostStats:
    st = getattr(model, "sapp_host_stats", None)
    if st is None:
        st = HostStats()
        model.sapp_host_stats = st
    return st


# ---- host embedding -----------------------------------------------------------------------------
class _ToDevice(torch.autograd.Function):
    """Host rows -> device in forward, their gradient device -> host in backward, both timed."""

    @staticmethod
    def forward(ctx, x, device, stats):
        ctx.stats = stats
        t = time.perf_counter()
        y = x.to(device, non_blocking=True)
        stats.add("h2d_s", time.perf_counter() - t)
        return y

    @staticmethod
    def backward(ctx, g):
        t = time.perf_counter()
        out = g.to("cpu")
        ctx.stats.add("d2h_s", time.perf_counter() - t)
        return out, None, None


class HostEmbedding(nn.Embedding):
    """An embedding table kept in host memory with sparse gradients; lookups run on the CPU."""

    def __init__(self, src: nn.Embedding, device, stats: HostStats):
        super().__init__(src.num_embeddings, src.embedding_dim, padding_idx=src.padding_idx,
                         max_norm=src.max_norm, norm_type=src.norm_type, scale_grad_by_freq=src.scale_grad_by_freq,
                         sparse=True, device="cpu", dtype=torch.float32)
        with torch.no_grad():
            self.weight.copy_(src.weight.detach().to("cpu", torch.float32))
        self.weight.requires_grad_(src.weight.requires_grad)
        self.out_device = torch.device(device)
        self.stats = stats

    def _apply(self, fn, recurse=True):
        # model.to(device) / .half() must not move or cast the host table: it stays fp32 on the CPU.
        return self

    def forward(self, ids):
        t = time.perf_counter()
        rows = F.embedding(ids.to("cpu"), self.weight, self.padding_idx, self.max_norm, self.norm_type,
                           self.scale_grad_by_freq, True)
        self.stats.add("lookup_s", time.perf_counter() - t)
        if self.out_device.type == "cpu":
            return rows
        return _ToDevice.apply(rows, self.out_device, self.stats)


def _tied_names(model) -> dict:
    seen = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        seen.setdefault(id(p), []).append(name)
    return {n: names for names in seen.values() if len(names) > 1 for n in names}


def host_parameter_names(model, section) -> list:
    """Qualnames whose weights the section puts on the host (e.g. to keep them out of DDP)."""
    return sorted(n for n, _ in model.named_parameters() if (resolve(section, n) or {}).get("weights") == "host")


def apply_placement(model, section, device):
    """Place `model` as `section` says, in place (returns `model`): host tables become HostEmbedding
    on the CPU, everything else moves to `device`."""
    validate_section(section)
    device = torch.device(device)
    stats = _stats(model)
    tied = _tied_names(model)
    host = set(host_parameter_names(model, section))
    done = set()
    for mname, mod in list(model.named_modules()):
        pname = f"{mname}.weight" if mname else "weight"
        if pname not in host:
            continue
        if not isinstance(mod, nn.Embedding):
            raise PlanError(f"placement puts {pname} on the host but {mname} is a {type(mod).__name__}, not an "
                            "nn.Embedding; only embedding tables can live on the host")
        if pname in tied:
            raise PlanError(f"placement puts {pname} on the host but it is tied to {', '.join(sorted(set(tied[pname]) - {pname}))}; "
                            "untie it or keep it on the device")
        if isinstance(mod, HostEmbedding):
            done.add(pname)
            continue
        new = HostEmbedding(mod, device, stats)
        parent = model.get_submodule(mname.rsplit(".", 1)[0]) if "." in mname else model
        setattr(parent, mname.rsplit(".", 1)[-1], new)
        done.add(pname)
    missing = sorted(host - done)
    if missing:
        raise PlanError(f"placement puts {missing[0]} on the host but it is not the weight of an nn.Embedding")
    model.to(device)
    model.sapp_placement = section
    return model


def ignore_host_params_in_ddp(model, section) -> list:
    """Keep host tables out of DDP (NCCL cannot reduce sparse CPU gradients; DDP buckets per device):
    call before wrapping `model` in DDP, and `sync_host_grads` after backward.  Returns the names."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    names = host_parameter_names(_unwrap(model), section)
    if names:
        DDP._set_params_and_buffers_to_ignore_for_model(_unwrap(model), names)
    return names


def sync_host_grads(model, section, group=None) -> None:
    """Average the host tables' (sparse) gradients over the data-parallel `group` (a gloo group when
    the devices are GPUs), as DDP averages the dense ones.  A rank whose table got no gradient this
    step contributes an empty sparse tensor so the collective never hangs."""
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        return
    world = dist.get_world_size(group)
    if world == 1:
        return
    m = _unwrap(model)
    for name in host_parameter_names(m, section):
        p = m.get_parameter(name)
        g = p.grad
        if g is None:
            g = torch.sparse_coo_tensor(torch.empty((1, 0), dtype=torch.long), torch.empty((0,) + p.shape[1:]), p.shape)
        g = g.coalesce() if g.is_sparse else g
        dist.all_reduce(g, group=group)
        p.grad = g / world


# ---- optimizers for a placed model -----------------------------------------------------------
def _unwrap(model):
    return getattr(model, "module", model) if isinstance(getattr(model, "module", None), nn.Module) else model


def _timed(opt, stats, key="optimizer_s"):
    state = {}
    opt.register_step_pre_hook(lambda *_: state.__setitem__("t", time.perf_counter()))
    opt.register_step_post_hook(lambda *_: stats.add(key, time.perf_counter() - state["t"]))
    return opt


def _overlap_args(model, params, overlap) -> dict:
    """OffloadAdam's overlap arguments for `params` of `model`: a group per block, indices of late ones."""
    names = {id(p): n for n, p in model.named_parameters()}
    blocks = sorted(overlap.get("blocks") or (), key=len, reverse=True)
    late = set(overlap.get("late") or ())
    keys, groups, lates = {}, [], set()
    for i, p in enumerate(q for q in params if q.requires_grad):
        n = names.get(id(p), str(i))
        if n in late:
            lates.add(i)
            continue
        key = next((b for b in blocks if n.startswith(b + ".")), n)
        if key not in keys:
            keys[key] = len(groups)
            groups.append([])
        groups[keys[key]].append(i)
    return {"overlap": True, "accumulations": int(overlap.get("accumulations", 1)), "groups": groups,
            "late": frozenset(lates), "grad_divisor": overlap.get("grad_divisor", 1)}


def build_optimizers(model, section, lr, *, optimizer="adam", betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                     ftrl_lr=None, ftrl=None, overrides=None, stream_grads=False, overlap=None) -> list:
    """One optimizer per (where, kind), in a fixed order: host tables (by kind name), OffloadAdam, then
    the device optimizers.  `optimizer` is the kind for device parameters no entry names; `overrides`
    ({fnmatch pattern: kind}) picks a kind for device parameters (e.g. {"wide*": "ftrl"} for
    Wide&Deep's wide part, as MindSpore).  Each optimizer carries `sapp_kind` and `sapp_where`.
    overlap: None, or {"accumulations": backwards per step, "blocks": block qualnames (one parameter
    group each; other parameters alone), "late": qualnames stepped after backward, "grad_divisor"}:
    OffloadAdam then updates each group during the last backward (see OffloadAdam)."""
    model = _unwrap(model)
    validate_section(section)
    stats = _stats(model)
    buckets = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        e = resolve(section, name) or {}
        if e.get("weights") == "host":
            if not isinstance(p, nn.Parameter) or p.device.type != "cpu":
                raise PlanError(f"{name} is placed on the host but lives on {p.device}; call apply_placement first")
            key = ("host", e.get("optimizer_kind", "sparse_adam"))
        elif e.get("optimizer") == "host" or e.get("master_weights") == "host":
            key = ("offload", e.get("optimizer_kind", optimizer))
        else:
            kind = optimizer
            for pat in sorted(overrides or {}):
                if fnmatch.fnmatchcase(name, pat):
                    kind = overrides[pat]
                    break
            key = ("device", kind)
        buckets.setdefault(key, []).append(p)
    ftrl_kw = dict(ftrl or {})
    ftrl_kw.setdefault("lr", ftrl_lr or lr)
    order = {"host": 0, "offload": 1, "device": 2}
    out = []
    for where, kind in sorted(buckets, key=lambda k: (order[k[0]], k[1])):
        ps = buckets[(where, kind)]
        if where == "offload":
            ov = _overlap_args(model, ps, overlap) if overlap is not None else {}
            opt = OffloadAdam(ps, lr, kind=kind, betas=betas, eps=eps, weight_decay=weight_decay,
                              stream_grads=stream_grads, stats=stats, **ov,
                              sparse_ids={id(p) for n, p in model.named_parameters() if (overrides or {}).get(n) == "sparse_adam"})
        elif kind == "sparse_adam":
            opt = _timed(torch.optim.SparseAdam(ps, lr=lr, betas=betas, eps=eps), stats)
        elif kind == "ftrl":
            opt = SparseFtrl(ps, **ftrl_kw)
            if where == "host":
                _timed(opt, stats)
        elif kind in ("adam", "adamw"):
            cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
            extra = {"weight_decay": weight_decay} if weight_decay or kind == "adamw" else {}
            opt = cls(ps, lr=lr, betas=betas, eps=eps, **extra)
        elif kind == "sgd":
            opt = torch.optim.SGD(ps, lr=lr)
        else:
            raise PlanError(f"optimizer kind {kind!r} is not supported here; use sparse_adam, ftrl, adam, adamw or sgd")
        opt.sapp_kind, opt.sapp_where = kind, ("host" if where in ("host", "offload") else "device")
        out.append(opt)
    return out


# ---- a single-process training loop ------------------------------------------------------------
def is_wide_deep(model) -> bool:
    m = _unwrap(model)
    return hasattr(m, "wide_emb") and hasattr(m, "deep_emb")


def wide_deep_losses(model, logit, target, l2_coef=8e-5):
    """(wide_loss, deep_loss) as MindSpore's Wide&Deep (see the module docstring)."""
    wide = F.binary_cross_entropy_with_logits(logit.float(), target.float())
    m = _unwrap(model)
    l2 = sum((p.float() ** 2).sum() for n, p in m.named_parameters() if n.startswith("deep.") and p.dim() > 1)
    return wide, wide + l2_coef * 0.5 * l2


def train_steps(model, section, batches, steps, device, *, lr=1e-3, optimizer="adam", loss_fn=None,
                optimizers=None, l2_coef=8e-5, ftrl_lr=None, log=print) -> list:
    """Train `steps` steps on `batches` (a list of (inputs tuple, target), cycled), placing the model
    first if needed.  Returns one dict per step: {"step", "loss"} or {"step", "wide_loss", "deep_loss"},
    plus "host": the step's host timings (lookup_s, h2d_s, d2h_s, optimizer_s, offload_*).  Logs
    "step 1, wide_loss 0.693, deep_loss 0.888, host lookup 0.1 ms ..." through `log` (None: silent)."""
    if not hasattr(model, "sapp_placement"):
        apply_placement(model, section, device)
    wd = is_wide_deep(model)
    if optimizers is None:
        optimizers = build_optimizers(model, section, lr, optimizer=optimizer, ftrl_lr=ftrl_lr,
                                      overrides={"wide*": "ftrl"} if wd else None)
    if loss_fn is None and not wd:
        from ...models import loss_fn as zoo_loss
        loss_fn = zoo_loss(model)
    stats = _stats(model)
    stats.take()
    out = []
    for i in range(steps):
        inputs, target = batches[i % len(batches)]
        inputs = tuple(x.to(device) for x in (inputs if isinstance(inputs, (tuple, list)) else (inputs,)))
        target = target.to(device)
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        logits = model(*inputs)
        if wd:
            wide, deep = wide_deep_losses(model, logits, target, l2_coef)
            deep.backward()
            rec = {"step": i + 1, "wide_loss": float(wide.detach()), "deep_loss": float(deep.detach())}
        else:
            loss = loss_fn(logits, target)
            loss.backward()
            rec = {"step": i + 1, "loss": float(loss.detach())}
        for opt in optimizers:
            opt.step()
        rec["host"] = stats.take()
        if log is not None:
            losses = ", ".join(f"{k} {v:.3f}" for k, v in rec.items() if k.endswith("loss"))
            host = ", ".join(f"{k[:-2]} {v * 1e3:.2f} ms" for k, v in rec["host"].items())
            log(f"step {i + 1}, {losses}" + (f", host {host}" if host else ""))
        out.append(rec)
    return out


__all__ = ["apply_placement", "build_optimizers", "train_steps", "sync_host_grads", "ignore_host_params_in_ddp", "HostEmbedding", "SparseFtrl", "OffloadAdam",
           "HostStats", "host_parameter_names", "wide_deep_losses", "is_wide_deep"]
