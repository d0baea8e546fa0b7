"""Per-unit numbers of one (profile, micro-batch size, ZeRO) and the stage-boundary send time."""
from __future__ import annotations

from ...costmodel import collective_time


class UnitNumbers:
    """Unit numbers at one (profile, micro-batch size, zero); identical units computed once."""

    def __init__(self, prof, cfg, ctx):
        per_rep = {}
        self.t, self.act, self.extra, self.out, self.states, self.gs, self.pbytes, self.fwd, self.lat = (
            [] for _ in range(9))
        for u in prof.units:
            key = u.rep if u.kind == "block" else u.name
            r = per_rep.get(key)
            if r is None:
                f, b, act, extra, out = u.at(cfg.mbs, cfg.zero)
                st = held_states(u, cfg)
                r = (f + b, act, extra, out, st["params"] + st["grads"] + st["optimizer"],
                     u.grad_sync[cfg.zero], u.states[0]["params"], f, u.sync_lat.get(cfg.zero, 0.0))
                per_rep[key] = r
            for lst, val in zip((self.t, self.act, self.extra, self.out, self.states, self.gs, self.pbytes,
                                 self.fwd, self.lat), r):
                lst.append(val)
        self.boundary = max((o for u, o in zip(prof.units, self.out) if u.kind == "block"), default=0.0)


def held_states(unit, cfg):
    """Model-state bytes ({"params", "grads", "optimizer"}) a device holds for `unit` under what the
    emitter runs, not only the ZeRO formula.  FSDP2 (ZeRO-2/3) accumulating over several micro-batches
    keeps the unsharded gradients between them (the emitted accumulation loop turns
    set_requires_gradient_sync off until the last one; torch.distributed.pipelining's stages do the
    same), and the final reduce-scatter writes the sharded ones beside them; a pipeline stage also
    keeps the parameters unsharded between micro-batches (set_reshard_after_backward(False)) until
    the step's last backward."""
    st = dict(unit.states[cfg.zero])
    if cfg.zero >= 2 and cfg.m > 1:
        st["grads"] += unit.states[1]["grads"]
        if cfg.zero == 3 and cfg.pp > 1:
            st["params"] += unit.states[2]["params"]
    return st


def unit_numbers(ctx, prof, cfg):
    key = (prof.dp, prof.tp, cfg.mbs, cfg.zero, cfg.m > 1, cfg.pp > 1, getattr(prof, "sp", False))
    n = ctx.numbers.get(key)
    if n is None:
        n = ctx.numbers[key] = UnitNumbers(prof, cfg, ctx)
    return n


def p2p_time(ctx, cfg, nbytes):
    if cfg.pp == 1 or nbytes <= 0:
        return 0.0
    gpn = ctx.cluster.gpus_per_node
    S = ctx.cluster.devices // cfg.pp
    link = "inter" if (S >= gpn or S * cfg.pp > gpn) else "intra"
    return collective_time("p2p", nbytes, 2, link, ctx.cluster)
