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
           "sync": "#E45756", "host": "#9D755D", "exposed": "#72B7B2", "optimizer": "#EECA3B"}
LABELS = {"fwd": "forward", "bwd": "backward", "recompute": "recompute", "comm": "p2p communication",
          "sync": "gradient sync", "host": "host work", "exposed": "exposed comm.",
          "optimizer": "optimizer"}
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
    zoom = dense(events)           # a long schedule gets a second chart of its start, boxes numbered
    ratios = [max(2, min(p, 6))] + ([max(2, min(p, 6))] if zoom else []) + [3]
    gs = fig.add_gridspec(len(ratios), 1, height_ratios=ratios, hspace=0.55, right=0.88)
    _gantt(fig.add_subplot(gs[0]), plan, events, p)
    if zoom:
        _gantt(fig.add_subplot(gs[1]), plan, events, p, xlim=warm_up_end(events), zoom=True)
    _memory(fig.add_subplot(gs[-1]), plan)
    par = plan["parallel"]
    step = float(plan["predicted"]["step_time_s"])
    drawn = max((e.end for e in events), default=0.0)
    # the title's step is where the drawing ends; where the schedule's replay ends elsewhere, both are said
    ends = f" (the drawn schedule ends at {fmt_time(drawn)})" if abs(drawn - step) > 0.01 * step else ""
    fig.suptitle(f"{plan['model'].get('name', '?')} on {plan['devices']} x {plan['cluster'].get('name', '?')}: "
                 f"dp={par['dp']} tp={par['tp']} pp={par['pp']}" + (f" ep={par['ep']}" if par.get("ep", 1) > 1 else "")
                 + f", {_schedule_label(plan)}, predicted step {fmt_time(step)}{ends}",
                 fontsize=11)
    return save_figure(plt, fig, path, dpi)


def save_figure(plt, fig, path, dpi):
    """Write `fig` to `path` (closed whatever happens); a path matplotlib cannot write is one line."""
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


MAX_BOXES_PER_ROW = 96     # beyond this a row's boxes are too narrow for numbers: a zoom on the start carries them


def dense(events) -> bool:
    """Whether a stage's row holds more boxes than can carry their micro-batch labels."""
    per_row = {}
    for e in events:
        if e.micro_batch >= 0 and e.duration > 0:
            per_row[e.stage] = per_row.get(e.stage, 0) + 1
    return max(per_row.values(), default=0) > MAX_BOXES_PER_ROW


def warm_up_end(events) -> float:
    """Where a zoom on the schedule's start shows its bubble: past the first backward of stage 0 (by
    then every stage has started, so the idle wedge of the warm-up is whole)."""
    first = [e.end for e in events if e.stage == 0 and e.kind == "bwd"]
    end = max((e.end for e in events), default=1.0)
    return min(end, 1.15 * min(first)) if first else end


def _gantt(ax, plan, events, p, xlim=None, zoom=False):
    """Every box drawn (a dense row shades alternate micro-batches so each stays distinct and the
    white of the bubble reads); micro-batch numbers where they fit: a sparse row, or the zoom."""
    rows = max([p] + [e.stage + 1 for e in events])
    work = [e for e in events if e.duration > 0 and (xlim is None or e.start < xlim)]
    crowded = dense(events) and not zoom
    label_mbs = zoom or len({e.micro_batch for e in work}) <= 32
    used = set()
    for e in work:
        y = rows - 1 - e.stage          # stage 0 on top
        h = 0.3 if e.kind == "comm" else 0.8
        yo = y - 0.45 if e.kind == "comm" else y - 0.4
        alpha = 0.65 if e.micro_batch >= 0 and e.micro_batch % 2 and e.kind in ("fwd", "bwd") else 1.0
        ax.broken_barh([(e.start, e.duration)], (yo, h), facecolors=COLOURS.get(e.kind, "#BBBBBB"), alpha=alpha,
                       edgecolor="white", linewidth=0.0 if crowded else 0.4)
        used.add(e.kind)
        if label_mbs and e.kind in ("fwd", "bwd") and e.micro_batch >= 0:
            ax.text(e.start + e.duration / 2, y, str(e.micro_batch), ha="center", va="center", fontsize=6,
                    color="white", clip_on=True)
    ax.set_yticks(range(rows))
    ax.set_yticklabels([f"stage {rows - 1 - i}" for i in range(rows)], fontsize=8 if rows <= 16 else 6)
    if rows > 32:                     # label every k-th stage only
        k = -(-rows // 32)
        for i, t in enumerate(ax.get_yticklabels()):
            t.set_visible((rows - 1 - i) % k == 0)
    end = xlim or max((e.end for e in events), default=1.0)
    if 0 < end < 1:                   # a small plan's step in milliseconds
        from matplotlib.ticker import FuncFormatter
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x * 1e3:g}"))
        ax.set_xlabel("time (ms)")
    else:
        ax.set_xlabel("time (s)")
    pipe = plan["pipeline"]
    v = int(pipe.get("virtual_chunks") or 1)
    title = ("zoom on the start: the warm-up's bubble (white), micro-batch numbers on the boxes" if zoom else
             "pipeline schedule (one training step)" + (
                 f": {pipe['micro_batches']} micro-batches" + (f" x {v} chunks" if v > 1 else "")
                 + " a stage, alternate micro-batches shaded" if crowded else ""))
    ax.set_title(title, fontsize=10, loc="left")
    ax.set_xlim(0, end * 1.01 if end > 0 else 1.0)
    ax.set_ylim(-0.7, rows - 0.3)
    from matplotlib.patches import Patch
    handles = [Patch(color=COLOURS[k], label=LABELS[k]) for k in COLOURS if k in used]
    if handles and not zoom:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)


def _memory(ax, plan):
    """Stacked bars per stage in the unit the data needs (KB to TB), the axis scaled to the tallest bar;
    the capacity line drawn where it is on that scale, named in the title where it is far above."""
    rows = stage_memory(plan)
    cap = capacity(plan)
    xs = [r[0] for r in rows]
    peak = max([t for _, t, _ in rows] + [0.0])
    unit, scale = next(((u, s) for u, s in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)) if max(peak, 1.0) >= s),
                       ("B", 1.0))
    has_bd = any(bd for _, _, bd in rows)
    width = 0.6 if len(rows) <= 32 else 0.8
    if has_bd:
        bottom = [0.0] * len(rows)
        for part in MEMORY_PARTS:
            vals = [((bd or {}).get(part, 0.0)) / scale for _, _, bd in rows]
            ax.bar(xs, vals, bottom=bottom, color=PART_COLOURS[part], label=part, width=width)
            bottom = [b + v for b, v in zip(bottom, vals)]
        stacked = max(bottom + [0.0]) * scale         # the parts may add up to more than the peak
        other = [t / scale - b for (_, t, _), b in zip(rows, bottom)]
        if any(o > 1e-3 * max(bottom + [1e-9]) for o in other):   # transient buffers etc.
            ax.bar(xs, [max(o, 0) for o in other], bottom=bottom, color="#BBBBBB", label="other", width=width)
    else:
        stacked = 0.0
        ax.bar(xs, [t / scale for _, t, _ in rows], color="#4C78A8", label="total", width=width)
    top = max(peak, stacked)
    title = "memory per device by stage"
    if cap and cap <= 1.5 * peak:
        ax.axhline(cap / scale, color="#E45756", linestyle="--", linewidth=1.2, label=f"capacity {fmt_bytes(cap)}")
        top = max(top, cap)
    elif cap:
        title += f" (peak {fmt_bytes(peak)} of {fmt_bytes(cap)} capacity)"
    ax.set_ylim(0, top / scale * 1.08 if top > 0 else 1)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"stage {x}" if len(xs) <= 16 else str(x) for x in xs], fontsize=8 if len(xs) <= 16 else 6)
    if len(xs) > 32:
        k = -(-len(xs) // 32)
        for x, t in zip(xs, ax.get_xticklabels()):
            t.set_visible(x % k == 0)
    ax.set_xlim(min(xs, default=0) - 0.6, max(xs, default=0) + 0.6)
    ax.set_ylabel(f"{unit} per device")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
