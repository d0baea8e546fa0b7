"""Pre-flight of a pipeline split: run every stage once, in this process, before any rank talks to
another.  A stage torch cannot run then fails here on every rank alike, as one PlanError line that
names the stage, the module that failed and what to change, instead of as a gloo disconnect seen by
the neighbouring rank.

Stages run under FakeTensorMode (shapes only, no compute; the real weights are read, never written),
forward and then backward to the stage's inputs through torch.autograd.grad (parameters' .grad stay
untouched), through the fx interpreter: the stage modules themselves, not private copies."""
from __future__ import annotations

import torch

from ...errors import PlanError


def _tensors(x) -> list:
    if torch.is_tensor(x):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    return []


class _Where:
    """Forward pre/post hooks on every sub-module: the innermost one still running when an
    exception left the stage is the module to name."""

    def __init__(self, mod):
        self.stack, self.failed, self.handles = [], None, []
        for name, sub in mod.named_modules():
            if name:
                self.handles.append(sub.register_forward_pre_hook(self._enter(name)))
                self.handles.append(sub.register_forward_hook(self._leave))

    def _enter(self, name):
        def hook(module, args):
            self.stack.append(name)         # returns None: a hook's return value would replace args
        return hook

    def _leave(self, module, args, out):
        self.stack.pop()                    # returns None: a value would replace the output

    def close(self):
        if self.stack and self.failed is None:
            self.failed = self.stack[-1]
        for h in self.handles:
            h.remove()


def _blocks(mod) -> str:
    names = [n for n, _ in mod.named_children()]
    return f" ({names[0]} .. {names[-1]})" if names else ""


def check_stages(pipe, example_mb: tuple, points: list) -> None:
    """Run each stage of `pipe` on fake tensors shaped like one micro-batch; raise PlanError on the
    first that fails."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    n = pipe.num_stages
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        args = tuple(mode.from_tensor(x) for x in example_mb)
        for i in range(n):
            stage = pipe.get_stage_module(i)        # not copied: it is run, never changed
            where = _Where(stage)
            try:
                ins = [a.detach().requires_grad_(a.is_floating_point()) if torch.is_tensor(a) else a for a in args]
                out = stage(*ins)
                where.close()
                outs = [t for t in _tensors(out) if t.requires_grad]
                grads_to = [a for a in ins if torch.is_tensor(a) and a.requires_grad]
                if outs and grads_to:
                    torch.autograd.grad(outs, grads_to, [torch.ones_like(t) for t in outs], allow_unused=True)
                if i < n - 1:
                    bad = [type(v).__name__ for v in (out if isinstance(out, (tuple, list)) else (out,))
                           if not torch.is_tensor(v)]
                    if bad:
                        raise TypeError(f"stage hands {', '.join(bad)} to the next stage; only tensors can be sent")
                    args = tuple(out) if isinstance(out, (tuple, list)) else (out,)
            except Exception as e:
                where.close()
                at = f" in module {where.failed!r}" if where.failed else ""
                cut = f"before {points[i - 1]!r}" if i > 0 else "at the start"
                msg = str(e).strip().splitlines()
                raise PlanError(f"pipeline stage {i} of {n} (starting {cut}{_blocks(stage)}) fails in torch{at}: "
                                f"{type(e).__name__}: {msg[0] if msg else ''}; split at other blocks "
                                f"(constraints stages=...) or pin pp=1") from e
