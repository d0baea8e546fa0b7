"""Pipeline parallelism with torch.distributed.pipelining.

The whole model is traced once per rank (torch.export via `Pipe.from_tracing`, repaired by
graph_fix.py) and cut BEFORE each plan split point; stage modules keep the original parameter names.
Every stage is run once in-process before any rank communicates (preflight.py).  Stage i of S runs on
pipeline rank i % pp (interleaved: v = S / pp stages per rank); DualPipeV cuts the model in 2 pp
stages placed in a V, rank r holding stages r and 2 pp - 1 - r (pipeline.dualpipe.rank_of).

Tied weights (GPT-2's embedding and head) and the weights of a module several stages call (one
relative-position bias shared by every attention layer) are duplicated into every stage that uses
them; TiedGrads adds their gradients across the owning stages after backward so every copy gets the
single-process gradient and stays equal under the same optimizer update."""
from __future__ import annotations

import contextlib
import copy
import functools

import torch
import torch.distributed as dist
from torch import nn

from ...errors import PlanError, user_frame
from ...capture.state import aliases_hidden
from ...models.hf import eager_masks
from ...pipeline.dualpipe import dualpipev_problem, rank_of
from . import graph_fix
from ..checks import preflight
from ..tp.dtensor_local import local_grad

SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B",
             "dualpipev": "ScheduleDualPipeV"}


def micro_example(inputs: tuple, mbs: int) -> tuple:
    """Example micro-batch of batch size `mbs` (export bakes shapes in, values do not matter)."""
    out = []
    for x in inputs:
        if x.shape[0] >= mbs:
            out.append(x[:mbs].clone())
        else:
            reps = (mbs + x.shape[0] - 1) // x.shape[0]
            out.append(x.repeat((reps,) + (1,) * (x.dim() - 1))[:mbs].clone())
    return tuple(out)


def trace(model: nn.Module, example_mb: tuple, points: list, local: dict = None):
    """torch.export the model once and cut it BEFORE each split point; every stage is then checked
    in-process (preflight) so a stage torch cannot run fails here, on every rank alike, as one line.
    `local`: {module name: stand-in} traced in place of those modules (tensor-parallel layers at
    this rank's shapes, sapp.emit.tp.parallel.local_layers); the model is restored afterwards."""
    saved = {}
    for name, stand_in in (local or {}).items():
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        saved[name] = (owner, child, getattr(owner, child))
        setattr(owner, child, stand_in)
    try:
        with buffers_kept(model):       # tracing and the preflight run forwards: no running statistics kept
            return _trace(model, example_mb, points)
    finally:
        for owner, child, original in saved.values():
            setattr(owner, child, original)


def _trace(model: nn.Module, example_mb: tuple, points: list):
    from torch.distributed.pipelining import Pipe
    from torch.distributed.pipelining._IR import annotate_split_points
    from torch.distributed.pipelining import SplitPoint
    try:
        annotate_split_points(model, {p: SplitPoint.BEGINNING for p in points})
        # split_policy runs on the exported graph before it is cut: there we inline the grad-mode
        # regions (the split's module outliner cannot call them) and drop export's dtype checks, which
        # DTensor cannot run (see graph_fix.prepare); an HF decoder is traced with the masks its eager
        # forward uses, as capture priced it (sapp/models/hf.py eager_masks)
        with eager_masks(model, example_mb), graph_fix.shared_buffers_unlisted(model):
            names = frozenset(n for n, _ in model.named_modules())
            policy = functools.partial(graph_fix.prepare, names=names, aliases=graph_fix.buffer_aliases(model))
            try:
                pipe = Pipe.from_tracing(model, example_mb, split_policy=policy)
            except Exception:      # noqa: BLE001 - retried once, or re-raised as it was
                if not _registered_twice(model):
                    raise
                # a module registered under a second path (Performer's proj_updater.instance) gives it
                # two parents: torch's split fails on it ("... is not a descendant of parent module", or
                # "Attribute 'norm' not found in model" where the split cuts inside a layer list); traced
                # again with the second registration an attribute only.  Tried second: a leaf shared by
                # design (OpenAI GPT's one activation) splits as it is
                with aliases_hidden(model):
                    pipe = Pipe.from_tracing(model, example_mb, split_policy=policy)
    except Exception as e:  # pipeline() hides the real cause; keep the chain, say what to do
        from ...capture.retry import data_dependent
        if data_dependent(_innermost(e)):
            # capture may take such a branch as the example's values do (it only prices the graph); a
            # stage traced so would run that branch for every later batch
            site = _branch_site(_innermost(e))
            where = f"at {site} (data-dependent)" if site else f"({_cause(e)[:120]})"
            raise PlanError(f"the model's forward branches on tensor values {where}, which a pipeline stage, "
                            f"traced once, would fix to this batch's branch; pin pp=1 (stages split before "
                            f"{points})") from e
        raise PlanError(f"could not split the model into pipeline stages before {points} "
                        f"({_cause(e)}); the model must be traceable by torch.export with these example "
                        f"inputs, or pin pp=1") from e
    if pipe.num_stages != len(points) + 1:
        raise PlanError(f"splitting before {points} gave {pipe.num_stages} stages, expected {len(points) + 1}; "
                        f"split points must be modules called in this order in forward")
    preflight.check_stages(pipe, example_mb, points)
    return pipe


def _registered_twice(model: nn.Module) -> bool:
    """Whether some module of `model` is registered under two paths (capture.state.aliases_hidden)."""
    ids = [id(m) for _, m in model.named_modules(remove_duplicate=False)]
    return len(ids) != len(set(ids))


def _innermost(e: BaseException) -> BaseException:
    while e.__cause__ is not None:
        e = e.__cause__
    return e


def _branch_site(e: BaseException) -> str | None:
    """'file.py:line `code`' of the model's own line that branched on a tensor's value (TabTransformer's
    `if is_special_token.any():`): the last frame of the failure outside torch and sapp, else None."""
    import os
    skip = (os.path.dirname(torch.__file__) + os.sep,
            os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep)
    got = user_frame(e, skip)
    if got is None:
        return None
    name, line, code = got
    return f"{name}:{line} `{code}`" if code else f"{name}:{line}"


def _cause(e: BaseException) -> str:
    """The innermost exception of a chain, as 'Type: first line' (torch wraps the real cause)."""
    e = _innermost(e)
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"


@contextlib.contextmanager
def buffers_kept(module: nn.Module):
    """Put every buffer of `module` back as it was on exit: forwards run to trace or check a stage
    are not training steps, and a train-mode BatchNorm would count them in its running statistics
    (one process's running mean and variance see only the real steps)."""
    saved = [(b, b.detach().clone()) for b in module.buffers() if not b.is_meta]
    try:
        yield
    finally:
        # through .data: torch's backward metadata inference still differentiates the forward
        # that saved these buffers, and a tracked in-place write would fail its version check
        for b, v in saved:
            b.data.copy_(v)


def pipeline_stage(module: nn.Module, index: int, n: int, device, group):
    """torch's PipelineStage for `module`, whose set-up before the first step (torch 2.13: metadata
    inference, forward and backward on uninitialised tensors) leaves the module's buffers as it
    found them (buffers_kept) and gets zeros, not garbage, for integer inputs."""
    from torch.distributed.pipelining import PipelineStage

    class Stage(PipelineStage):
        # torch's first-step shape inference calls a later stage on tensors made from the received
        # metadata with torch.empty: an integer one holds garbage, and a stage that indexes with a
        # carried model input (DeepSeek-V4's `tid2eid[input_ids]`) fails there with "index out of
        # range" before the real micro-batch arrives.  Integer and boolean ones are zeros instead.
        def _to_tensor(self, arg):
            t = super()._to_tensor(arg)
            if not torch.is_tensor(arg) and torch.is_tensor(t) and not t.is_floating_point() \
                    and not t.is_complex() and type(t) is torch.Tensor:
                t.zero_()
            return t
    for name in ("_prepare_forward_infra", "_prepare_backward_infra"):
        inner = getattr(PipelineStage, name, None)
        if inner is not None:
            def kept(self, *a, _inner=inner, **k):
                with buffers_kept(self.submod):
                    return _inner(self, *a, **k)
            setattr(Stage, name, kept)
    return Stage(module, index, n, device, group=group)


def stage_modules(pipe, indices: list) -> dict:
    """Private copies of this rank's stage modules (they share objects with the traced model).

    pipeline() builds the stages out of torch.export's InterpreterModules, which by default run their
    graph node by node through torch.fx.Interpreter: about 30 us of Python per node per call, so a
    gpt-small stage spent 6-7 ms per micro-batch there (a 2-stage, 8-micro-batch step: 224 ms, of
    which ~50 ms interpreter).  Each of them also holds the generated code of the same graph; run that."""
    out = {}
    for i in indices:
        out[i] = graph_fix.compiled_stage(copy.deepcopy(pipe.get_stage_module(i)))
    return out


class TiedGrads:
    """Sum the gradients of one original parameter over all stages (and copies) that hold it."""

    def __init__(self, model: nn.Module, pipe, n_stages: int, my_stages: dict, pp: int, dp: int, tp: int,
                 schedule: str = "1f1b"):
        by_obj = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            by_obj.setdefault(id(p), []).append(name)
        alias = {n: tuple(sorted(ns)) for ns in by_obj.values() for n in ns}
        owners = {}                        # tie key -> stages holding it
        for s in range(n_stages):
            for name, _ in pipe.get_stage_module(s).named_parameters(remove_duplicate=False):
                key = alias.get(name)
                if key:
                    owners.setdefault(key, set()).add(s)
        # tied: a weight under several names (GPT-2's embedding and head), or one module's weight that
        # every stage calling it holds a copy of (x-transformers' one relative-position bias, called by
        # every attention layer: graph_fix.rejoin_module_paths inlines it into each caller)
        owners = {k: v for k, v in owners.items() if len(k) > 1 or len(v) > 1}
        self.ties = []                     # (local params, group or None)
        me = dist.get_rank()
        # new_group must be called by every rank in the same order: iterate ties and coords globally
        for key in sorted(owners):
            pp_ids = sorted({rank_of(schedule, pp, s) for s in owners[key]})
            for dp_i in range(dp):
                for tp_i in range(tp):
                    ranks = [((p * dp) + dp_i) * tp + tp_i for p in pp_ids]
                    group = dist.new_group(ranks) if len(ranks) > 1 else None
                    if me in ranks:
                        local = [p for mod in my_stages.values() for n, p in mod.named_parameters(remove_duplicate=False)
                                 if alias.get(n) == key]
                        # one object may sit under several tied names in a stage (T5's decoder
                        # embedding and LM head): count its gradient once
                        local = list({id(p): p for p in local}.values())
                        if local:
                            self.ties.append((local, group))

    def __call__(self):
        for params, group in self.ties:
            total = None
            for p in params:
                if p.grad is not None:
                    g = local_grad(p)
                    total = g.clone() if total is None else total + g
            if total is None:
                total = torch.zeros_like(params[0].to_local() if hasattr(params[0], "to_local") else params[0])
            if group is not None:
                dist.all_reduce(total, group=group)
            for p in params:
                if p.grad is None:
                    p.grad = _like(p, total.clone())
                else:
                    local_grad(p).copy_(total)


def _like(p, local):
    """A gradient for `p` from its local values (a DTensor for FSDP2 / tensor-parallel parameters)."""
    if hasattr(p, "placements"):
        from torch.distributed.tensor import DTensor
        return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False)
    return local


def schedule_run(kind: str, n_micro: int, n_stages: int) -> str:
    """The schedule a plan's runs as: 1F1B with fewer micro-batches than stages (a batch-statistics
    model's one, search.joint.configs) runs every stage's forwards before its backwards, GPipe's
    order, which torch's 1F1B refuses to run, so GPipe runs it."""
    return "gpipe" if kind == "1f1b" and n_micro < n_stages else kind


def build_schedule(kind: str, stages: list, n_micro: int, loss_fn):
    from torch.distributed import pipelining as P
    kind = schedule_run(kind, n_micro, stages[0].num_stages)
    cls = getattr(P, SCHEDULES[kind])
    if kind == "dualpipev":
        # torch 2.13's ScheduleDualPipeV: 2 stages a rank (the V), m >= 2 pp; one line here rather
        # than torch's ValueError on the ranks
        pp = stages[0].group_size
        why = dualpipev_problem(pp, n_micro) if len(stages) == 2 else (
            f"dualpipev runs 2 stages per rank (the V), this rank has {len(stages)}; regenerate the plan")
        if why:
            raise PlanError(why)
        return cls(stages, n_microbatches=n_micro, loss_fn=loss_fn)
    if kind == "interleaved":
        # torch 2.13's flex interleaving: rounds = max(1, m // pp) must divide m (any v, any
        # stage sizes); refused here in one line rather than by torch's ValueError on the ranks
        from ...pipeline.schedule import interleave_rounds
        pp = stages[0].group_size
        if interleave_rounds(pp, n_micro) is None:
            raise PlanError(f"interleaved 1F1B cannot run {n_micro} micro-batches over pp={pp} (torch needs a "
                            f"multiple of max(1, m // pp) = {max(1, n_micro // pp)}); use micro_batches a "
                            f"multiple of {pp}")
        return cls(stages, n_microbatches=n_micro, loss_fn=loss_fn)
    if len(stages) != 1:
        raise PlanError(f"schedule {kind!r} runs one stage per rank; use 'interleaved' for virtual_chunks > 1")
    return cls(stages[0], n_microbatches=n_micro, loss_fn=loss_fn)


# ---- Megatron's scatter/gather at stage boundaries (tp > 1 without sequence parallelism) -----------
def _gather_last(x, tp_group):
    """All-gather `x` over the tp group along its last dim (torch's functional collective, gloo too)."""
    from torch.distributed import _functional_collectives as funcol
    # (all_gather_single concatenates along dim 0 only: gather the last dim moved to the front)
    out = funcol.all_gather_single(x.movedim(-1, 0).contiguous(), 0, tp_group)
    out = funcol.wait_tensor(out) if hasattr(funcol, "wait_tensor") else out
    return out.movedim(0, -1).contiguous()


class _Split(torch.autograd.Function):
    """Sending stage: keep this tp rank's 1/tp slice of a replicated boundary tensor (no communication);
    backward: the gradient arrives as this rank's slice and is all-gathered back to the replica."""

    @staticmethod
    def forward(ctx, y, group, t, r):
        ctx.group = group
        if y.shape[-1] % t:
            raise PlanError(f"pipeline.scatter_gather: a stage output of shape {tuple(y.shape)} does not split "
                            f"into tp={t} equal pieces along its last dim; set pipeline.scatter_gather to false")
        return y.chunk(t, dim=-1)[r].contiguous()

    @staticmethod
    def backward(ctx, g):
        return _gather_last(g, ctx.group), None, None, None


class _Gather(torch.autograd.Function):
    """Receiving stage: all-gather the tp ranks' slices into the replica.  Backward: the gradient of a
    replicated tensor is the same on every tp rank (the tensor-parallel layers all-reduce it), so this
    rank's slice of it is what crosses back (the sender all-gathers it): no reduction here, unlike
    all_gather_tensor_autograd, whose reduce-scatter would sum tp identical copies."""

    @staticmethod
    def forward(ctx, x, group, t, r):
        ctx.t, ctx.r = t, r
        return _gather_last(x, group)

    @staticmethod
    def backward(ctx, g):
        return g.chunk(ctx.t, dim=-1)[ctx.r].contiguous(), None, None, None


def scatter_gather(mod: nn.Module, stage: int, n_stages: int, tp_mesh) -> None:
    """Megatron's scatter/gather at this stage's boundaries (plan pipeline.scatter_gather, priced by
    sapp.search.joint.numbers.boundary_send): every floating-point tensor the stage sends is cut to
    this tp rank's 1/tp (last dim), every one it receives all-gathered over the tp group first; the
    gradients cross back the same way.  Hooks on the stage module itself (PipelineStage and FSDP2 look
    at its type), marked in `sapp_scatter_gather` for the manifest."""
    group, t, r = tp_mesh.get_group(), tp_mesh.size(), tp_mesh.get_local_rank()
    marks = []

    def _each(x, fn):
        return fn.apply(x, group, t, r) if torch.is_tensor(x) and x.is_floating_point() else x

    if stage > 0:
        def pre(_m, args):
            return tuple(_each(a, _Gather) for a in args)
        mod.register_forward_pre_hook(pre)
        marks.append("gather-input")
    if stage < n_stages - 1:
        def post(_m, _args, out):
            if isinstance(out, tuple):
                return tuple(_each(o, _Split) for o in out)
            return _each(out, _Split)
        mod.register_forward_hook(post)
        marks.append("split-output")
    mod.sapp_scatter_gather = marks
    inner = getattr(mod, "module", None)        # the manifest reads the unwrapped module
    if isinstance(inner, nn.Module):
        inner.sapp_scatter_gather = marks
