"""The last steps of a stage profile (sapp/pipeline/profile.py build_profile): the sampled unit numbers
at the first ZeRO stage extended to the other stages, then fitted in the micro-batch size into the
profile's Units (times as the secants between samples, memory affine: profile.py's docstring)."""
from __future__ import annotations

import dataclasses

from ..costmodel.gradsync import bucketed_sync, fsdp_exposed_copies
from ..errors import SappError
from .states import unit_states
from .units import Unit


def _affine(v1, v2, b1, b2):
    c1 = (v2 - v1) / (b2 - b1)
    return (v1 - c1 * b1, c1)


def _pieces(values, points):
    """Secants between consecutive samples of a convex function: its max is the interpolation."""
    return tuple(_affine(values[i], values[i + 1], points[i], points[i + 1]) for i in range(len(points) - 1))


def _fresh_unit(d):
    """A copy of one unit's numbers whose mutable members (its states, its parameter list) no other
    profile shares."""
    return dict(d, states=dict(d["states"]), param_list=list(d["param_list"]))


def _fresh(numbers):
    """A copy of build_profile's (num, samples) (_fresh_unit for every unit)."""
    (a, b), samples = numbers
    a2, b2 = {k: _fresh_unit(v) for k, v in a.items()}, {k: _fresh_unit(v) for k, v in b.items()}
    return (a2, b2), [a2, b2] + [{k: _fresh_unit(v) for k, v in smp.items()} for smp in samples[2:]]


def zero_numbers(first, zeros, cluster, settings, steps, gc, key_tail) -> dict:
    """{ZeRO stage: (numbers at b = 1, at b = 2)} from `first`, the numbers at zeros[0]: the other
    stages only change batch-independent terms (states, gradient sync, ZeRO-3 gathers), one
    evaluation each, kept in `gc` by ("zero", z) + key_tail."""
    z0 = zeros[0]
    num = {z0: first}
    for z in zeros[1:]:
        zkey = ("zero", z) + key_tail    # (the parameter lists are the first sample's)
        if zkey not in gc:
            sz = dataclasses.replace(settings, zero=z)
            gc[zkey] = {k: bucketed_sync(a0["param_list"], cluster, sz, steps)
                        + (unit_states(a0["param_list"], z, sz, steps),
                           fsdp_exposed_copies(a0["param_list"], cluster, sz)) for k, a0 in first[0].items()}
        one, two = {}, {}
        for k, (a0, b0) in ((k, (first[0][k], first[1][k])) for k in first[0]):
            sync, lat, gather, states, copy = gc[zkey][k]
            ef = gather - a0["gather"] + copy[0] - a0["copy"][0]
            eb = gather - a0["gather"] + copy[1] - a0["copy"][1]
            states = dict(states)
            # weight bytes the operators keep beyond the parameters themselves (Transformer Engine's FP8
            # weight copies, costmodel/fp8.py), which no ZeRO stage shards: carried over from zeros[0]
            states["params"] += _kept_weight_extra(a0, z0, settings, steps)
            common = {"grad_sync": sync, "sync_lat": lat, "states": states, "copy": copy}
            one[k] = dict(a0, fwd=a0["fwd"] + ef, bwd=a0["bwd"] + eb, **common)
            two[k] = dict(b0, fwd=b0["fwd"] + ef, bwd=b0["bwd"] + eb, **common)
        num[z] = (one, two)
    return num


def _kept_weight_extra(a0, z0, settings, steps) -> float:
    """The unit's parameter bytes as its operators priced them (a0["states"]) less the parameters'
    own at ZeRO z0: the FP8 weight copies an FP8 recipe keeps (0 without FP8)."""
    base = unit_states(a0["param_list"], z0, dataclasses.replace(settings, zero=z0), steps)["params"]
    return max(0.0, a0["states"]["params"] - base)


def fit_units(units, num, samples, points, zeros, t1, dp):
    """(the profile's Units, each unit's representative): every unit's numbers fitted in the
    micro-batch size; identical blocks copy their representative's."""
    z0 = zeros[0]
    rep_of = {u.name: u.rep for u in units}
    per_sample_flops = {}
    for u in reversed(units):       # (the last unit of each type sets it: only that one's sum is read)
        if u.rep not in per_sample_flops:
            per_sample_flops[u.rep] = sum(t1.nodes[n].flops for n in u.nodes if n in t1.nodes) / dp
    out_units = []
    made = {}          # key -> the first unit built for it: identical blocks copy its numbers
    for u in units:
        key = u.rep if u.kind == "block" else u.name
        a, b = num[z0][0].get(key), num[z0][1].get(key)
        if a is None:
            raise SappError(f"unit {u.name} has no operators in the template (internal)")
        nu = Unit(u.name, u.kind, u.rep, u.nodes, u.cut_before)
        first = made.get(key)
        if first is not None:
            for f in ("fwd", "bwd", "reshard", "act", "extra", "out_bytes", "flops", "tensors", "fsdp_exempt",
                      "bwd_live"):
                setattr(nu, f, getattr(first, f))
            for f in ("zfwd", "zbwd", "grad_sync", "sync_lat", "zcopy"):
                setattr(nu, f, dict(getattr(first, f)))
            nu.states = {z: dict(v) for z, v in first.states.items()}
            out_units.append(nu)
            continue
        made[key] = nu
        sv = [smp[key] for smp in samples]
        nu.fwd = _pieces([x["fwd"] for x in sv], points)
        nu.bwd = _pieces([x["bwd"] for x in sv], points)
        nu.reshard = _pieces([x["reshard"] for x in sv], points)
        nu.act = tuple(_affine(x, y, 1, 2) for x, y in zip(a["act"], b["act"]))
        nu.extra = tuple(_pieces([x["extra"][k] for x in sv], points) for k in range(3))
        nu.out_bytes = _affine(a["out"], b["out"], 1, 2)
        nu.bwd_live = _affine(a["bwd_live"], b["bwd_live"], 1, 2)
        for z in zeros:
            za = num[z][0][key]
            # ZeRO stages only add batch-independent time (gathers) to the z0 curve
            dz_f, dz_b = za["fwd"] - a["fwd"], za["bwd"] - a["bwd"]
            nu.zfwd[z] = tuple((c0 + dz_f, c1) for c0, c1 in nu.fwd)
            nu.zbwd[z] = tuple((c0 + dz_b, c1) for c0, c1 in nu.bwd)
            nu.grad_sync[z] = za["grad_sync"]
            nu.sync_lat[z] = za["sync_lat"]
            nu.zcopy[z] = za["copy"]
            nu.states[z] = za["states"]
        nu.flops = per_sample_flops.get(u.rep, 0.0)
        nu.tensors = sum(1 for _, _, _, trainable, _ in a["param_list"] if trainable)
        nu.fsdp_exempt = a["fsdp_exempt"]
        out_units.append(nu)
    return out_units, rep_of
