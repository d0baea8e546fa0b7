"""`sapp calibrate --from-run`: the few efficiency figures of a cluster fitted to measured steps of the
user's own jobs, so every other plan on that cluster is priced from what the hardware showed.

A measured run is a plan and what one of its steps took (and, where known, its peak memory):
  - `sapp run --log-json` output (JSON lines: rank 0's `start` event names the plan, each step line
    its seconds; the first step after a start is warm-up and left out; the median of the rest);
  - `sapp run --out` output (`plan`, `measured_step_time_s`, `peak_memory_bytes`);
  - a JSON object `{"plan": PATH, "step_time_s": X, "peak_memory_gib": Y}` (Y optional): any sapp plan,
    searched with pins or written by `sapp import` from an engine's file.
Files are data: a plan is loaded as JSON and its model built only when it is a zoo name or an HF
config (a factory a plan names is code, never imported from here).

What is fitted, each inside a physical bound:
  - `compute`: `compute_scale`, the measured-over-priced factor on every operator's time.  Bounded
    below by compute_efficiency on a GPU (no GEMM beats the datasheet peak; a CPU preset's peak is a
    guess: 0.05) and above by 25x (beyond that the run was not the plan's program);
  - `comm`: one factor on every collective's bandwidth (intra_bw, inter_bw, the fitted collectives'
    betas); at most 1 on a datasheet GPU preset (no link beats its datasheet), 20 on a CPU;
  - `memory`: the memory the runtime holds beyond what is priced, added to `memory_headroom` (so the
    search keeps it free), from runs whose peak is the allocator's (CUDA) or was stated; a CPU
    process's resident set counts torch itself and is not used.
Two unknowns need two runs whose communication shares differ: with one run (or runs that do not
separate them) `--fit auto` fits compute and says it held the bandwidth; asked for both explicitly, it
refuses in one line.  A fit that needs a figure past its bound is refused, naming it.  The pricing
itself comes in as a callable (`price(cluster, run) -> sapp.evaluate's dict`): this package sits
below the search and the API (docs/ARCHITECTURE.md)."""
from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass, field

from ..errors import SappError
from ..units import fmt_time

MAX_FILE_BYTES = 64 << 20         # a log of a long run is megabytes; more is not a run's log
SCALE_MAX = 25.0
SHARE_GAP = 0.05                  # communication shares closer than this do not separate the two unknowns
BOUND_SLACK = 1e-3
UNKNOWNS = ("compute", "comm", "memory")
EXACT = "exact fit, one run per unknown: other layouts unvalidated (calibrate on runs of two layouts to measure it)"


class CalibrationError(SappError):
    """A measured run that cannot be read, or a fit that cannot be made."""


@dataclass
class Run:
    """One measured run: its file, the plan's path and the measured figures."""
    source: str
    plan_path: str
    step_s: float
    peak_bytes: float | None = None      # allocator peak or stated; None: not usable for memory
    spread: float = 0.0                  # the measured steps' half-range around the median, as a fraction
    plan: object = None                  # the loaded Plan (read_runs fills it)


@dataclass
class Fit:
    cluster: object
    fitted: dict                         # unknown -> value
    held: dict                           # unknown -> why it was held
    rows: list = field(default_factory=list)   # per run: (source, measured, before, after)

    @property
    def residual(self) -> float:
        """The largest relative step error after the fit (0 for one run and one unknown)."""
        return max((abs(a / m - 1) for _, m, _, a in self.rows), default=0.0)

    @property
    def band(self) -> float:
        """How far a prediction on this cluster is trusted: the fit's residual, and no tighter than
        the measured steps' own spread (a step timed to ±4% cannot calibrate to ±1%)."""
        return max([self.residual] + [r.spread for r in self._runs])

    _runs: list = field(default_factory=list, repr=False)

    @property
    def exact(self) -> bool:
        """As many step-time unknowns fitted as runs: the fit meets every run by construction, so its
        residual says nothing of other plans (the band is then only the runs' own spread)."""
        return len(self._runs) <= len([u for u in self.fitted if u in ("compute", "comm")])


# ---- reading ----------------------------------------------------------------------------------------
def _read_text(path: str) -> str:
    from ..fileio import read_text
    return read_text(path, MAX_FILE_BYTES, what="--from-run", give="give a JSON file from `sapp run`",
                     too_big="give the log of one run", not_text="give a JSON file from `sapp run`",
                     error=CalibrationError)


def _number(v, what, path, lo=0.0):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= lo:
        raise CalibrationError(f"--from-run {path}: {what} must be a positive number of seconds or bytes, got "
                               f"{str(v)[:40]!r}")
    return float(v)


def _plan_path(value, path) -> str:
    if not isinstance(value, str) or not value or len(value) > 4096:
        raise CalibrationError(f"--from-run {path}: 'plan' must name the plan's JSON file")
    if os.path.isabs(value) or os.path.exists(value):
        return value
    return os.path.join(os.path.dirname(os.path.abspath(path)), value)   # beside the record


def _from_object(d: dict, path: str) -> Run:
    if "measured_step_time_s" in d:              # sapp run --out
        peak = d.get("peak_memory_bytes") if d.get("peak_memory_kind") == "cuda_allocated" else None
        times = [t for t in (d.get("step_times_s") or [])[1:] if isinstance(t, (int, float))]
        step = _number(d["measured_step_time_s"], "measured_step_time_s", path)
        return Run(path, _plan_path(d.get("plan"), path), step,
                   float(peak) if isinstance(peak, (int, float)) and peak > 0 else None, _spread(times, step))
    if "step_time_s" not in d:
        raise CalibrationError(f"--from-run {path}: expected {{\"plan\": PATH, \"step_time_s\": X}}, a `sapp run "
                               "--out` file or a `sapp run --log-json` log")
    gib = d.get("peak_memory_gib")
    peak = _number(gib, "peak_memory_gib", path) * 2 ** 30 if gib is not None else None
    return Run(path, _plan_path(d.get("plan"), path), _number(d["step_time_s"], "step_time_s", path), peak)


def _spread(times, median) -> float:
    if len(times) < 3 or not median:
        return 0.0
    qs = statistics.quantiles(times, n=4)
    return (qs[2] - qs[0]) / 2 / median


def _from_log(lines: list, path: str) -> Run:
    """The steps after the last start (or re-plan) that names a plan, its first step left out."""
    plan, steps, peaks = None, [], []
    for ln in lines:
        if ln.get("event") in ("start", "replan") and isinstance(ln.get("plan"), str):
            plan, steps, peaks = ln["plan"], [], []
        elif "step_time_s" in ln and not ln.get("event"):
            steps.append(ln["step_time_s"])
            if ln.get("peak_memory_kind") == "cuda_allocated":
                peaks.append(ln.get("peak_memory_bytes"))
    if plan is None:
        raise CalibrationError(f"--from-run {path}: no start event names the plan (a log of an older sapp run); "
                               "give {\"plan\": PATH, \"step_time_s\": X} instead")
    steps = [float(t) for t in steps[1:] if isinstance(t, (int, float)) and math.isfinite(t) and t > 0]
    if not steps:
        raise CalibrationError(f"--from-run {path}: fewer than 2 steps after the run started; run more steps "
                               "(--steps 5)")
    med = statistics.median(steps)
    peak = max((p for p in peaks if isinstance(p, (int, float))), default=None)
    return Run(path, _plan_path(plan, path), med, float(peak) if peak else None, _spread(steps, med))


def read_run(path: str) -> Run:
    text = _read_text(path)
    try:
        d = json.loads(text)
    except ValueError:
        d = None
    if isinstance(d, dict) and not ({"event", "step", "rank"} & set(d)):    # else a log of one line
        return _from_object(d, path)
    lines = []
    for i, ln in enumerate(text.splitlines()):
        if not ln.strip():
            continue
        try:
            obj = json.loads(ln)
        except ValueError:
            raise CalibrationError(f"--from-run {path}: line {i + 1} is not JSON; give a `sapp run --log-json` "
                                   "log or one JSON object") from None
        if isinstance(obj, dict):
            lines.append(obj)
    if not lines:
        raise CalibrationError(f"--from-run {path}: no JSON object in it; give a `sapp run --log-json` log")
    return _from_log(lines, path)


# ---- the cluster a fit describes --------------------------------------------------------------------
def _gpu(base) -> bool:
    return bool(getattr(base, "async_launch", True))


def bounds(base) -> dict:
    """unknown -> (lowest, highest) of the value fitted (compute: compute_scale; comm: the factor on
    every bandwidth; memory: memory_headroom)."""
    # a GPU preset's peak is its datasheet's: no GEMM beats it.  A CPU preset's peak is a guess (a
    # 2-core box trains a small GPT 2.4x faster than the 'cpu' preset prices), so only the wide bound
    low = max(0.05, base.compute_efficiency) if _gpu(base) else 0.05
    return {"compute": (low, SCALE_MAX),
            "comm": (0.02, 1.0 if _gpu(base) else 20.0),
            "memory": (0.0, 0.5)}


def apply(base, values: dict):
    """`base` with the fitted values: compute_scale set, bandwidths scaled, headroom set."""
    ch = {}
    if "compute" in values:
        ch["compute_scale"] = float(values["compute"])
    if "comm" in values:
        f = float(values["comm"])
        ch.update(intra_bw=base.intra_bw * f, inter_bw=base.inter_bw * f,
                  collective_fits=tuple((k, a, b * f) for k, a, b in base.collective_fits))
    if "memory" in values:
        ch["memory_headroom"] = float(values["memory"])
    return base.replace(**ch) if ch else base


def run_cluster(base, run):
    """The base figures on the run's own shape (nodes, devices per node): a run on 1 node calibrates a
    cluster of 16.  A plan for another device (its peak differs) is refused."""
    pc = run.plan["cluster"]
    peak = pc.get("peak_flops")
    if isinstance(peak, (int, float)) and abs(peak / base.peak_flops - 1) > 0.01:
        raise CalibrationError(f"--from-run {run.source}: its plan is for {pc.get('name')} ({peak:.4g} FLOP/s) but "
                               f"--cluster is {base.name} ({base.peak_flops:.4g}); calibrate each device kind "
                               "with its own runs")
    return base.replace(nodes=int(pc.get("nodes", base.nodes)), gpus_per_node=int(pc.get("gpus_per_node",
                                                                                              base.gpus_per_node)))


# ---- the fit ----------------------------------------------------------------------------------------
def _choose(want, runs, before) -> tuple:
    """(unknowns to fit, {held unknown: why}) for `want` ("auto" or a list)."""
    shares = [b["comm_s"] / b["step_time_s"] for b in before]
    separate = len(runs) >= 2 and max(shares) - min(shares) >= SHARE_GAP
    why_comm = ("one run cannot fix two unknowns (compute and communication)" if len(runs) < 2 else
                f"the runs' communication shares ({', '.join(f'{s:.0%}' for s in shares)}) do not separate it from "
                "compute: add a run of another layout")
    why_mem = "no run states an allocator peak (a CPU process's resident set counts torch itself)"
    has_mem = any(r.peak_bytes for r in runs)
    if want == "auto":
        fit = ["compute"] + (["comm"] if separate else []) + (["memory"] if has_mem else [])
        held = {**({} if separate else {"comm": why_comm}), **({} if has_mem else {"memory": why_mem})}
        return fit, held
    bad = [u for u in want if u not in UNKNOWNS]
    if bad or not want:
        raise CalibrationError(f"--fit {','.join(want)[:80]}: choose from auto or {', '.join(UNKNOWNS)}")
    if "comm" in want and not separate:
        raise CalibrationError(f"--fit comm: {why_comm}; fit compute alone (--fit compute) or add runs")
    if "comm" in want and "compute" not in want:
        raise CalibrationError("--fit comm needs compute too: a step's time is both (--fit compute,comm)")
    if "memory" in want and not has_mem:
        raise CalibrationError(f"--fit memory: {why_mem}; give peak_memory_gib or drop memory")
    held = {u: "not asked for (--fit)" for u in UNKNOWNS if u not in want}
    return list(want), held


def _fit_time(unknowns, runs, clusters, price, base, before) -> dict:
    from scipy.optimize import least_squares
    if not unknowns:
        return {}
    lim = bounds(base)
    ratio = statistics.median(r.step_s / b["step_time_s"] for r, b in zip(runs, before))
    start = {"compute": min(max(base.compute_scale * ratio, lim["compute"][0]), lim["compute"][1]), "comm": 1.0}
    lo = [math.log(lim[u][0]) for u in unknowns]
    hi = [math.log(lim[u][1]) for u in unknowns]
    x0 = [min(max(math.log(start[u]), a + 1e-9), b - 1e-9) for u, a, b in zip(unknowns, lo, hi)]

    def residuals(x):
        vals = dict(zip(unknowns, (math.exp(v) for v in x)))
        return [math.log(price(apply(c, vals), r)["step_time_s"] / r.step_s) for c, r in zip(clusters, runs)]
    sol = least_squares(residuals, x0, bounds=(lo, hi), x_scale=1.0, diff_step=1e-4, xtol=1e-10, ftol=1e-12)
    out = dict(zip(unknowns, (math.exp(v) for v in sol.x)))
    worst = max(abs(v) for v in residuals(sol.x))
    for u, v, a, b in zip(unknowns, sol.x, lo, hi):
        at = "below" if v - a < BOUND_SLACK else "above" if b - v < BOUND_SLACK else None
        if at and worst > 0.02:
            what = "compute_scale" if u == "compute" else "the bandwidth factor"
            edge = math.exp(a if at == "below" else b)
            r, bf = max(zip(runs, before), key=lambda rb: abs(math.log(rb[0].step_s / rb[1]["step_time_s"])))
            raise CalibrationError(f"the runs need {what} {at} its bound {edge:.3g} (run {os.path.basename(r.source)[:60]}: "
                                   f"measured {fmt_time(r.step_s)}, priced {fmt_time(bf['step_time_s'])}); check that each run "
                                   "trained its plan on this --cluster")
    return out


def _fit_memory(runs, after, base) -> float:
    need = max((r.peak_bytes - a["peak_memory_bytes"]) / base.device_memory
               for r, a in zip(runs, after) if r.peak_bytes)
    value = max(base.memory_headroom, base.memory_headroom + need) if need > 0 else base.memory_headroom
    if value > bounds(base)["memory"][1]:
        raise CalibrationError(f"the runs hold {need:.0%} of device memory beyond what their plans price, past the "
                               f"{bounds(base)['memory'][1]:.0%} bound; check that each run trained its plan")
    return value


def fit(runs, base, price, want="auto", name=None) -> Fit:
    """Fit `base`'s unknowns to `runs` (read_run, plans loaded); `price(cluster, run)` -> the
    evaluate dict of run's plan on `cluster`.  The cluster comes back named `name` and carrying its
    calibration in its notes (sapp/cluster/trust.py reads it back as the plan's trust note)."""
    clusters = [run_cluster(base, r) for r in runs]
    before = [price(c, r) for c, r in zip(clusters, runs)]
    unknowns, held = _choose(want, runs, before)
    values = _fit_time([u for u in unknowns if u in ("compute", "comm")], runs, clusters, price, base, before)
    after = [price(apply(c, values), r) for c, r in zip(clusters, runs)]
    if "memory" in unknowns:
        values["memory"] = _fit_memory(runs, after, base)
    out = Fit(cluster=None, fitted=values, held=held,
              rows=[(r.source, r.step_s, b["step_time_s"], a["step_time_s"]) for r, b, a in zip(runs, before, after)],
              _runs=list(runs))
    cl = apply(base, values)
    note = (f"calibrated from {len(runs)} measured run(s) (sapp calibrate --from-run): "
            + ", ".join(f"{_label(u)} {v:.4g}" for u, v in values.items())
            + (f"; held {', '.join(_label(u) for u in held)}" if held else "")
            + f"; trust band ±{out.band:.1%}" + (f"; {EXACT}" if out.exact else ""))
    out.cluster = cl.replace(name=name or f"{base.name}-calibrated",
                             notes=f"{base.notes}; {note}" if base.notes else note)
    return out


def _label(u) -> str:
    return {"compute": "compute_scale", "comm": "bandwidth factor", "memory": "memory_headroom"}[u]
