"""What the free search's gain over each published configuration rests on: `python -m bench.free_gain
[--only TEXT] [--write]`.

For every row of bench/published.py that has a free plan, both plans are priced as bench.published prices
them (same graph, cluster, batch, settings and the row's own runtime flags) and their steps split into
terms (sapp.search.joint.terms.step_terms: compute, recomputation, exposed TP communication, exposed DP
sync, pipeline sends, bubble, the rest).  Each term's column is (pinned term - free term) / pinned step,
so the columns add up to the gain column, 1 - free step / pinned step: a row's gain reads off as the terms
that make it.  "compute at % of peak" is the model FLOPs over the compute term alone (pinned -> free):
the two plans do the same model FLOPs, so a compute gain is a kernel-efficiency gain (larger GEMMs from a
larger micro-batch or a smaller tp split), which only the cost model's kernel efficiencies vouch for.
"memory allows" is what the free plan spends memory on: its tp / pp / ZeRO degrees where they differ, its
micro-batch and recomputation against the pinned ones, and its peak against the device.  "above public" marks a free plan whose predicted MFU passes
the best public run on its GPU (sapp.cluster.public_mfu): those plans carry the note that says so.

The best public MFU per GPU (sapp/cluster/public_mfu.py, sources in that file): A100 55.2%, MegaScale;
H100 / H800 / H200 49.5%, the Megatron-LM README's 16B row; V100 48%, Megatron-LM v1.0.  A plan above it
carries a note naming the terms its gain rests on and asking for a calibration before trusting it.  The
terms are sapp/search/joint/terms.py step_terms."""
from __future__ import annotations

import argparse
import sys
import time

from sapp.search.joint.terms import TERMS, datasheet_mfu, step_terms

# terms shown as columns (the pipeline sends and the rest are small on every row; kept in "rest")
_COLS = ("compute", "recompute", "tp_comm", "dp_sync", "bubble")


def _rc(res) -> str:
    return "/".join(sorted(set(v for s in res.stages for v in s.recompute.values()))) or "none"


def gain_row(row, settings, cache):
    """(row, pinned JointResult, free JointResult, cluster), or None when either side does not price."""
    from sapp.errors import SappError
    from .published import _graph, _search, row_settings
    st = row_settings(row, settings)
    try:
        graph = _graph(row, cache)
        cl, pin = _search(graph, row, row.pins, st)
        _, free = _search(graph, row, {}, st)
    except SappError as e:
        print(f"{row.name}: {str(e).splitlines()[0][:120]}", file=sys.stderr)
        return None
    return row, pin, free, cl


def _above(res, cl) -> str:
    from sapp.cluster.public_mfu import best_public
    found = best_public(cl)
    if found is None:
        return "—"
    kind, best = found
    mfu = datasheet_mfu(res, cl, best.peak_flops)
    flag = "yes" if any("exceeds the best public run" in n for n in res.notes) else "no"
    return f"{flag} ({mfu:.1%} vs {kind} {best.mfu:.1%})"


def line(row, pin, free, cl) -> str:
    from sapp.cluster.public_mfu import best_public
    tp, tf = step_terms(pin), step_terms(free)
    S = pin.step_time_s
    cols = [f"{100 * (tp[k] - tf[k]) / S:+.1f}" for k in _COLS]
    rest = sum(tp[k] - tf[k] for k in tp if k not in _COLS)
    found = best_public(cl)
    peak = found[1].peak_flops if found else cl.peak_flops

    def rate(res, t):
        return res.model_flops / (t["compute"] * cl.devices * peak) if t["compute"] > 0 else float("nan")
    a, b = pin.config, free.config
    layout = ", ".join(f"{k} {getattr(a, k)}→{getattr(b, k)}" for k in ("tp", "pp", "zero") if getattr(a, k) != getattr(b, k))
    mem = (f"{layout + ', ' if layout else ''}mbs {a.mbs}→{b.mbs}, rc {_rc(pin)}→{_rc(free)}, "
           f"{free.peak_memory_bytes / 1e9:.1f} of {free.capacity_bytes / 1e9:.1f} GB")
    return (f"| {row.name} | {S:.3g} | {free.step_time_s:.3g} | {100 * (1 - free.step_time_s / S):+.1f} | "
            + " | ".join(cols) + f" | {100 * rest / S:+.1f} | {rate(pin, tp):.0%} → {rate(free, tf):.0%} | "
            f"{mem} | {_above(pin, cl)} | {_above(free, cl)} |")


HEADER = ("| run | pinned step s | free step s | gain % of pinned step | compute | recomputation | exposed TP comm | "
          "exposed DP sync | bubble | rest (pipeline sends, loss sync, schedule rounding) | compute at % of peak (pinned → free) | "
          "memory allows (free plan) | pinned above public | free above public |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def summary(results) -> str:
    """Of the time the free plans save (rows where they save any), the share each term gives, summed."""
    saved = {k: 0.0 for k, _ in TERMS}
    total = 0.0
    for _, pin, free, _ in results:
        if free.step_time_s >= pin.step_time_s:
            continue
        tp, tf = step_terms(pin), step_terms(free)
        for k in saved:
            saved[k] += (tp[k] - tf[k]) / pin.step_time_s
        total += 1 - free.step_time_s / pin.step_time_s
    if total <= 0:
        return "no free plan is faster than its pinned configuration"
    names = dict(TERMS)
    parts = [f"{names[k]} {100 * v / total:.0f}%" for k, v in sorted(saved.items(), key=lambda kv: -kv[1])]
    faster = sum(1 for _, p, f, _ in results if f.step_time_s < p.step_time_s)
    above = sum(1 for _, _, f, _ in results if any("exceeds the best public run" in n for n in f.notes))
    # how far the free plans lean on memory: the recomputation dropped and the stages merged are bought with it
    full = sum(1 for _, _, f, _ in results if f.peak_memory_bytes > 0.95 * f.capacity_bytes)
    return (f"{faster} of {len(results)} free plans faster than the published configuration; of the time they "
            f"save (summed over those rows, each as a share of its pinned step): " + ", ".join(parts)
            + f".  {full} of {len(results)} free plans peak above 95% of the device's usable memory.  {above} of "
            f"{len(results)} free plans are predicted above the best public MFU on their GPU and carry the note.")


def section(only=None, runtime="fused") -> str:
    from sapp.costmodel import CostSettings
    from .published import ROWS, _extra_rows
    rows = [r for r in ROWS + _extra_rows() if r.free and (not only or only in r.name or only in r.group)]
    settings = CostSettings(precision="bf16-mixed", runtime=runtime)
    cache, results = {}, []
    print(HEADER)
    for row in rows:
        r = gain_row(row, settings, cache)
        if r is not None:
            results.append(r)
            print(line(*r), flush=True)
    return summary(results) + "\n\n" + HEADER + "\n" + "\n".join(line(*r) for r in results) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="rows whose group or name contains this text")
    ap.add_argument("--write", action="store_true", help="write the table into bench/RESULTS.md")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    text = section(args.only)
    print(text.split("\n", 1)[0])
    if args.write:
        from .results_doc import write
        write("free_gain", stamp(time.perf_counter() - t0) + "\n\n" + text)
    return 0


def stamp(seconds) -> str:
    """bench.results' stamp line (written here too: bench.results imports this module, not the reverse)."""
    import datetime
    import platform
    return (f"Regenerated by `python -m bench.results` (`python -m bench.free_gain`) on "
            f"{datetime.date.today().isoformat()}, {platform.machine()} {platform.system()}, Python "
            f"{platform.python_version()}, {seconds:.0f} s.")


if __name__ == "__main__":
    sys.exit(main())
