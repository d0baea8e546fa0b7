"""`plot_mixed(doc, path)`: a mixed-cluster plan's step drawn as its prediction sums it.

Data mode: one schedule chart per group that trains (its own plan at its share: the groups run side
by side), then the cross-group gradient all-reduce on its own row, starting when the slowest group
ends: the step is the slowest group's plus that sync, so the drawing ends at the predicted step.
Pipeline mode: the pipeline's one plan (its stages priced on their groups' devices), each stage's
row naming its group, above the memory per stage."""
from __future__ import annotations

from sapp.plan.mixed import inner, members, mode, used_groups
from ..units import fmt_time
from ._common import as_plan
from .plot import COLOURS, _gantt, _memory, _pyplot, check_events, check_size, dense, save_figure, warm_up_end
from .timeline import plan_timeline


def plot_mixed(doc, path, *, width=1400, height=900, dpi=100):
    check_size(width, height)
    plt = _pyplot()
    fig = plt.figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    try:
        drawn = (_pipeline if mode(doc) == "pipeline" else _groups)(fig, doc)
        step = float(doc["predicted"]["step_time_s"])
        ends = f" (the drawn step ends at {fmt_time(drawn)})" if abs(drawn - step) > 0.01 * step else ""
        how = "pipeline stages on the groups" if mode(doc) == "pipeline" else "data-parallel groups, uneven shares"
        fig.suptitle(f"{doc['model']['name']} on {doc['cluster'].get('name', 'a mixed cluster')} ({doc['devices']} "
                     f"devices; {how}): predicted step {fmt_time(step)}{ends}", fontsize=11)
    except BaseException:
        plt.close(fig)
        raise
    return save_figure(plt, fig, path, dpi)


def _groups(fig, doc) -> float:
    """One chart per group with a share and the sync row; returns where the drawing ends."""
    groups = used_groups(doc)
    plans = [as_plan(g["plan"]) for g in groups]
    for p in plans:
        check_events(p)
    events = [plan_timeline(p) for p in plans]
    pps = [int(p["parallel"]["pp"]) for p in plans]
    gs = fig.add_gridspec(len(plans) + 1, 1, height_ratios=[max(2, min(p, 6)) for p in pps] + [1], hspace=0.8,
                          right=0.86)
    gb = doc["model"]["global_batch"]
    slowest = max((max((e.end for e in ev), default=0.0) for ev in events), default=0.0)
    sync = float(doc["predicted"].get("cross_group_sync_s") or 0.0)
    end = slowest + sync
    axes = []
    for i, (g, plan, ev, p) in enumerate(zip(groups, plans, events, pps)):
        ax = fig.add_subplot(gs[i])
        _gantt(ax, plan, ev, p)
        par = plan["parallel"]
        ax.set_title(f"group {g['name']}: {g['batch_share']}/{gb} samples on {g['devices']} devices, dp={par['dp']} "
                     f"tp={par['tp']} pp={par['pp']}, its step {fmt_time(max((e.end for e in ev), default=0.0))}",
                     fontsize=9, loc="left")
        axes.append(ax)
    ax = fig.add_subplot(gs[-1])
    ax.broken_barh([(slowest, sync)], (-0.4, 0.8), facecolors=COLOURS["sync"])
    ax.set_yticks([0])
    ax.set_yticklabels(["all groups"], fontsize=8)
    ax.set_title(f"cross-group gradient all-reduce {fmt_time(sync)}, after the slowest group", fontsize=9, loc="left")
    if 0 < end < 1:                 # in the unit the groups' charts use
        from matplotlib.ticker import FuncFormatter
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x * 1e3:g}"))
        ax.set_xlabel("time (ms)")
    axes.append(ax)
    for ax in axes:                 # one time axis: the groups run side by side
        ax.set_xlim(0, end * 1.01 if end > 0 else 1.0)
    return end


def _pipeline(fig, doc) -> float:
    plan = as_plan(inner(doc))
    check_events(plan)
    events = plan_timeline(plan)
    p = int(plan["parallel"]["pp"])
    zoom = dense(events)
    ratios = [max(2, min(p, 6))] + ([max(2, min(p, 6))] if zoom else []) + [3]
    gs = fig.add_gridspec(len(ratios), 1, height_ratios=ratios, hspace=0.55, right=0.86)
    charts = [fig.add_subplot(gs[0])]
    _gantt(charts[0], plan, events, p)
    if zoom:
        charts.append(fig.add_subplot(gs[1]))
        _gantt(charts[1], plan, events, p, xlim=warm_up_end(events), zoom=True)
    owner = {s["index"]: g["name"] for g in members(doc) for s in g["stages"]}
    for ax in charts:               # which group's devices each stage runs on
        rows = len(ax.get_yticks())
        ax.set_yticklabels([f"stage {rows - 1 - i} ({owner.get(rows - 1 - i, '?')})" for i in range(rows)],
                           fontsize=8 if rows <= 16 else 6)
    mem = fig.add_subplot(gs[-1])
    _memory(mem, plan)
    if len(owner) <= 16:
        mem.set_xticklabels([f"stage {int(i)} ({owner.get(int(i), '?')})" for i in mem.get_xticks()], fontsize=8)
    return max((e.end for e in events), default=0.0)
