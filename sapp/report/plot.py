"""`plot(plan, path)`: the pipeline schedule as a Gantt chart (stages x time; forward, backward,
recompute, communication, gradient sync and host work coloured) above per-stage memory bars against
device capacity.  matplotlib is an optional extra (`pip install sapp[plot]`)."""
from __future__ import annotations

from ..errors import SappError
from ..units import fmt_bytes, fmt_time
from ._common import as_plan, capacity, stage_memory
from .explain import MEMORY_PARTS
from .timeline import normalise_events, plan_timeline

COLOURS = {"fwd": "#4C78A8", "bwd": "#F58518", "recompute": "#B279A2", "comm": "#54A24B",
           "sync": "#E45756", "host": "#9D755D"}
LABELS = {"fwd": "forward", "bwd": "backward", "recompute": "recompute", "comm": "p2p communication",
          "sync": "gradient sync", "host": "host work"}
PART_COLOURS = {"params": "#4C78A8", "grads": "#F58518", "optimizer": "#54A24B", "activations": "#B279A2"}


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg", force=True)      # files only; never open a window
        import matplotlib.pyplot as plt
    except ImportError:
        raise SappError("plotting needs matplotlib: pip install 'sapp[plot]' (or pip install matplotlib)") from None
    return plt


MAX_PIXELS = 10_000        # per side: a 10k x 10k RGBA canvas is 400 MB already
MAX_EVENTS = 200_000       # bars in the Gantt chart (2 per micro-batch per stage); more is unreadable
FALLBACK_SUFFIXES = ("png", "pdf", "svg", "jpg", "jpeg", "eps", "ps", "tif", "tiff", "webp")


def check_size(width, height):
    for name, v in (("width", width), ("height", height)):
        if isinstance(v, bool) or not isinstance(v, int) or not 200 <= v <= MAX_PIXELS:
            raise SappError(f"plot {name} must be a whole number of pixels in [200, {MAX_PIXELS}], got {v!r}")


def image_suffixes():
    """File extensions matplotlib can write (a fixed common list when it is not installed)."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        return FALLBACK_SUFFIXES
    return tuple(sorted(FigureCanvasBase.get_supported_filetypes()))


def check_events(plan):
    """Refuse to simulate a schedule with more bars than a chart can show (micro_batches 1e9 would
    allocate tens of GB of events before drawing anything)."""
    pipe = plan["pipeline"]
    n = 2 * int(pipe["micro_batches"]) * max(len(pipe.get("stages") or []), int(plan["parallel"]["pp"]))
    if n > MAX_EVENTS:
        raise SappError(f"pipeline.micro_batches={pipe['micro_batches']} gives {n} bars to draw (limit {MAX_EVENTS}); "
                        f"plot a plan with fewer micro-batches or stages")


def plot(plan, path, timeline=None, *, width=1400, height=900, dpi=100):
    """Write a PNG (or any format matplotlib infers from `path`) of width x height pixels.
    `timeline`: events to draw instead of simulating the plan's schedule (Event, dict or
    (stage, micro_batch, kind, start, end) tuples).  Returns the path."""
    check_size(width, height)
    plan = as_plan(plan)
    if timeline is None:
        check_events(plan)
    events = normalise_events(timeline) if timeline is not None else plan_timeline(plan)
    plt = _pyplot()
    p = int(plan["parallel"]["pp"])
    fig = plt.figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    gs = fig.add_gridspec(2, 1, height_ratios=[max(2, min(p, 8)), 2], hspace=0.45)
    ax = fig.add_subplot(gs[0])
    _gantt(ax, plan, events, p)
    ax2 = fig.add_subplot(gs[1])
    _memory(ax2, plan)
    par = plan["parallel"]
    fig.suptitle(f"{plan['model'].get('name', '?')} on {plan['devices']} x {plan['cluster'].get('name', '?')}: "
                 f"dp={par['dp']} tp={par['tp']} pp={par['pp']}" + (f" ep={par['ep']}" if par.get("ep", 1) > 1 else "")
                 + f", {_schedule_label(plan)}, predicted step {fmt_time(plan['predicted']['step_time_s'])}",
                 fontsize=11)
    try:
        fig.savefig(path, dpi=dpi)
    except OSError as e:
        raise SappError(f"cannot write plot to {path}: {e.strerror or e}") from None
    except ValueError as e:        # matplotlib: "Format 'xyz' is not supported"
        raise SappError(f"cannot write plot to {path}: {e}; use one of {', '.join(image_suffixes())}") from None
    finally:
        plt.close(fig)
    return path


def _schedule_label(plan):
    pipe = plan["pipeline"]
    m = pipe["micro_batches"]
    if int(plan["parallel"]["pp"]) == 1 or pipe.get("schedule") in (None, "none"):
        return "no pipeline" + (f", {m} accumulation steps" if m > 1 else "")
    v = pipe.get("virtual_chunks") or 1
    return f"{pipe['schedule']}{f' v={v}' if v > 1 else ''} m={m}"


def _gantt(ax, plan, events, p):
    rows = max([p] + [e.stage + 1 for e in events])
    used = set()
    label_mbs = len({e.micro_batch for e in events}) <= 32
    for e in events:
        if e.duration <= 0:
            continue
        y = rows - 1 - e.stage          # stage 0 on top
        h = 0.3 if e.kind == "comm" else 0.8
        yo = y - 0.45 if e.kind == "comm" else y - 0.4
        ax.broken_barh([(e.start, e.duration)], (yo, h), facecolors=COLOURS.get(e.kind, "#BBBBBB"),
                       edgecolor="white", linewidth=0.4)
        used.add(e.kind)
        if label_mbs and e.kind in ("fwd", "bwd") and e.micro_batch >= 0:
            ax.text(e.start + e.duration / 2, y, str(e.micro_batch), ha="center", va="center", fontsize=6,
                    color="white", clip_on=True)
    ax.set_yticks(range(rows))
    ax.set_yticklabels([f"stage {rows - 1 - i}" for i in range(rows)])
    ax.set_xlabel("time (s)")
    ax.set_title("pipeline schedule (one training step)", fontsize=10, loc="left")
    end = max((e.end for e in events), default=1.0)
    ax.set_xlim(0, end * 1.01 if end > 0 else 1.0)
    ax.set_ylim(-0.7, rows - 0.3)
    from matplotlib.patches import Patch
    handles = [Patch(color=COLOURS[k], label=LABELS[k]) for k in COLOURS if k in used]
    if handles:
        ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=7, ncol=len(handles),
                  frameon=False)


def _memory(ax, plan):
    rows = stage_memory(plan)
    cap = capacity(plan)
    xs = [r[0] for r in rows]
    has_bd = any(bd for _, _, bd in rows)
    if has_bd:
        bottom = [0.0] * len(rows)
        for part in MEMORY_PARTS:
            vals = [((bd or {}).get(part, 0.0)) / 1e9 for _, _, bd in rows]
            ax.bar(xs, vals, bottom=bottom, color=PART_COLOURS[part], label=part, width=0.6)
            bottom = [b + v for b, v in zip(bottom, vals)]
        other = [t / 1e9 - b for (_, t, _), b in zip(rows, bottom)]
        if any(o > 1e-3 * max(bottom + [1e-9]) for o in other):   # transient buffers etc.
            ax.bar(xs, [max(o, 0) for o in other], bottom=bottom, color="#BBBBBB", label="other", width=0.6)
    else:
        ax.bar(xs, [t / 1e9 for _, t, _ in rows], color="#4C78A8", label="total", width=0.6)
    if cap:
        ax.axhline(cap / 1e9, color="#E45756", linestyle="--", linewidth=1.2, label=f"capacity {fmt_bytes(cap)}")
    top = max([t for _, t, _ in rows] + [cap]) / 1e9
    ax.set_ylim(0, top * 1.4 if top > 0 else 1)        # room for the legend above the capacity line
    ax.set_xticks(xs)
    ax.set_xticklabels([f"stage {x}" for x in xs])
    ax.set_ylabel("GB per device")
    ax.set_title("memory per device by stage", fontsize=10)
    ax.legend(fontsize=7, loc="upper right", ncol=3)
