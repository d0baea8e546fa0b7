"""Mixed-cluster figures: `python -m bench.hetero_figures [--only NAME] [--runs N]`.

For zoo models on 8 A100 nodes + 4 H100 nodes, and one V100 + A100 mix: the mixed plan's predicted
step against the best on each group alone and on all devices priced as the slowest kind, with the
search's time.  Then (`--only scale`) the search time on a 1024-device two-group cluster against the
homogeneous search of the same size (the issue's goal: within 3x): the graph captured once, the two
searches run alternately --runs times (default 3) in this process, CPU seconds of this process
(steadier than wall time on a shared machine), medians.  Homogeneous: the joint search and its plan
(what `sapp search` does after capture, bench/search_time.one_search).  Mixed: the split search over
shares (one joint search per group and share) and, in total, with the baselines (each group alone,
all devices as the slowest kind: one more homogeneous search of 1024 devices) and the groups' plans.
Each case line also gives the pipeline mode's best step (stages on the groups, sapp/search/hetero_pipeline.py)
beside the data mode's, or "> X s (pruned)" when none beats the data mode's X (the auto mode skips the
configurations whose step floor reaches X, so their steps stay unknown); `--only link` is one case over
a slow link between the groups (0.3 GB/s per device, batch 256), where the pipeline mode is the faster.

The pipeline mode (bench/RESULTS.md §18):
Pipeline mode (sapp/search/hetero_pipeline.py; `sapp search --mixed-mode pipeline` forces it).  On
the four cases above it is 3-7% slower than the data mode (no plan changes).  It wins where the link between
the groups is slow against the gradient: gpt3-13b, batch 256, 0.3 GB/s per device (the `link` row):
3 stages x 32 devices, 8 micro-batches, 1F1B, ZeRO-2; A100 stages 13 and 8 layers, H100 stage 19
(the A100 stage that sends over the link holds fewer), 4.706 s against the data mode's 5.294 s (which
leaves the A100s idle).  *The uniform baseline there assumes the groups' own fast links between all
96 devices, so it is not a plan this cluster can run.  On gpt3-13b over 512 A100s + 512 H100s (B
1024) the pipeline search alone costs 0.64 CPU s (40 of 80 configurations and orders priced: each
configuration gets a provable step floor, `hetero_pipeline.step_floor`, and is priced in floor order
until a floor exceeds the best step; the result is the exhaustive search's to the bit, ties included).
Under `--mixed-mode auto` the data mode's step is the cutoff: there no floor beats it, nothing is
priced (0.18 CPU s), and both
modes' search is 2.8-3.0x the homogeneous one (§12, load average 4-5).  The auto mode then reports the
pipeline mode as above the data mode's step ("> X s (pruned)", the `hetero_figures` case lines and
`sapp search`); the pipeline steps in the table above are the pipeline mode searched alone (no
cutoff), equal bit for bit to the exhaustive search's.  `pytest tests/test_hetero_pipeline.py` (2026-11-28, 28 s, default
suite): two one-device CPU groups, `cpu` declared 3× slower, model of 8 float64 blocks, batch 16:
the pipeline plan puts 2 layers on `cpu` and 6 on `cpu-2`, a stage's price on `cpu` is 3.00× the
same units' on `cpu-2`, and `sapp run` of it (2 gloo ranks, pp=2, 16 micro-batches, 1F1B) gives the
float64 losses of 3 Adam steps equal to one process within 1e-9; tp inside a stage, interleaved
chunks and groups out of stage order are refused in one line before launch; the auto mode keeps the
data mode at the groups' 2 GB/s link and the pipeline over a link 200× slower.  Not shown: tp, cp, ep
or host placement inside a pipeline stage (not searched; tp refused under `sapp run`), a group
left idle by the pipeline mode, multi-node `sapp run` of a pipeline plan (the ranks refuse nodes
that joined out of the groups' order), GPUs.

Search time of the two-group case (bench/RESULTS.md §12, 2026-11-28, CPU box), goal within 3x of the
homogeneous search: the data mode's split search 2.3-2.7x (load 5-6; 2.35x at load 2-3; eight more
invocations at load 2-6: 2.2-3.4x, two above 3x at load ~5.5).  With the pipeline mode's search beside the
split (`--mixed-mode auto`; two invocations, load 4-5: homogeneous 0.92 / 1.03 CPU s, split 2.57 / 2.74 =
2.81x / 2.66x): 2.75 / 2.91 CPU s (3.00x / 2.83x), the data mode kept (none of the pipeline mode's 80
configurations' step floors beats the data mode's 0.9974 s; 0 priced).  Both modes with the baselines
(each group alone, 1,024 devices as A100s) and the plan documents: 4.86 / 5.24 (5.30x / 5.10x).  The
pipeline mode alone (no cutoff): 0.64 CPU s, 40 of its 80 (configuration, order) pairs priced.

The shares of bench/RESULTS.md §18's table (dp x tp x pp, 2026-12-01): gpt3-13b A100 480 at 16x2x1, H100
544 at 8x1x4; llama3-70b 336 at 4x4x4, 432 at 2x2x8; mixtral 312 at 8x1x8, 456 at 8x1x4; gpt3-13b V100 448
at 8x4x2, A100 576 at 8x2x2 (cross-group sync 0.131 s).  The `link` row's pipeline: 3 stages x 32
devices, 8 micro-batches, 1F1B, ZeRO-2; A100 stages 13 and 8 layers, H100 stage 19."""
from __future__ import annotations

import argparse
import statistics
import sys
import time

MIXED = "a100-80g:nodes=8+h100-80g:nodes=4"
# (model, groups spec)
CASES = (("gpt3-13b", MIXED), ("llama3-70b", MIXED), ("mixtral-8x7b", MIXED),
         ("gpt3-13b", "v100-32g:nodes=8+a100-80g:nodes=4"))
LINK = ("gpt3-13b", MIXED, 3e8, 256)       # model, groups, link bytes/s per device, batch
SCALE = ("gpt3-13b", "a100-80g:nodes=64+h100-80g:nodes=64", "a100-80g:nodes=128")
TARGET = 3.0


def mixed_case(model, spec=MIXED, link_bw=None, batch=None):
    from sapp.api import mixed as hetero_plan
    from sapp.cluster.groups import MixedCluster, parse
    mc = parse(spec)
    if link_bw is not None:
        mc = MixedCluster.build(mc.groups, link_bw=link_bw, link_latency=mc.link_latency)
    doc, timing = hetero_plan.search(model, mc, global_batch=batch)      # default: the zoo's batch (GPT-3: the paper's)
    return doc, timing


def pipeline_words(doc, timing) -> str:
    """The other mode's step, and the pipeline's layout when it won."""
    from sapp.plan.mixed import members, mode, pipe
    if mode(doc) == "pipeline":
        p = pipe(doc)
        lay = "; ".join(f"{g['name']} layers {'/'.join(str(len(s['blocks'])) for s in g['stages'])}" for g in members(doc))
        return (f"PIPELINE mode {p['stages']} stages x {p['stage_width']}, m={p['micro_batches']} {p['schedule']} "
                f"ZeRO-{p['zero']} [{lay}]; data mode {timing.get('data_step_s') or float('nan'):.4g} s")
    t, above = timing.get("pipeline_step_s"), timing.get("pipeline_step_above_s")
    if t is None and above is not None:
        return f"pipeline mode > {above:.4g} s (pruned)"
    return "pipeline mode " + (f"{t:.4g} s" if t is not None else f"none ({timing.get('pipeline_why')})")


def case_line(model, spec, link_bw=None, batch=None):
    doc, timing = mixed_case(model, spec, link_bw, batch)
    step = doc["predicted"]["step_time_s"]
    alone = doc["groups"]["baselines"]["alone"]
    uni = doc["groups"]["baselines"]["uniform_slowest"]
    fits = [v for v in alone.values() if v is not None]
    best_alone = min(fits) if fits else None
    shares = ", ".join(f"{g['name']} {g.get('batch_share', '-')}" + (
        f" dp{g['parallel']['dp']} tp{g['parallel']['tp']} pp{g['parallel']['pp']}" if g.get("batch_share") else "")
        for g in doc["groups"]["members"])
    from sapp.cluster.groups import parse
    slow = parse(spec).slowest().name
    fmt = lambda v: "n/a" if v is None else f"{v:.4g} s ({v / step - 1:+.1%})"  # noqa: E731
    return (f"{model:13} {spec} B={doc['model']['global_batch']}: mixed {step:.4g} s [{shares}; sync "
            f"{doc['predicted']['cross_group_sync_s']:.3g} s]  alone: "
            + ", ".join(f"{k} {fmt(v)}" for k, v in alone.items())
            + f"  best alone {fmt(best_alone)}  uniform-as-{slow} {fmt(uni)}"
            + f"  {pipeline_words(doc, timing)}"
            + f"  search {timing['search_s']:.1f} s (split {timing['split_search_s']:.1f} s, "
              f"pipeline {timing.get('pipeline_search_s', 0):.1f} s)")


def scale(runs, out=sys.stdout):
    """(split ratio, total ratio): medians of CPU seconds, mixed over homogeneous."""
    from bench.search_time import one_search
    from sapp import api
    from sapp.api import mixed as hetero_plan
    from sapp.cluster import Cluster
    from sapp.cluster.groups import parse
    model, mixed, homo = SCALE
    _, name, info, graph, _ = api.capture_spec(model)
    mc, cl = parse(mixed), Cluster.parse(homo)
    gb = api.default_global_batch(info, mc.devices)
    homo_s, split_s, both_s, total_s = [], [], [], []
    for _ in range(max(1, runs)):
        c = time.process_time()
        _, _, res = one_search(graph, cl, gb)
        homo_s.append(time.process_time() - c)
        c = time.process_time()
        doc, timing = hetero_plan.search(name, mc, graph=graph, global_batch=gb)
        total_s.append(time.process_time() - c)
        split_s.append(timing["split_search_cpu_s"])
        both_s.append(timing["split_search_cpu_s"] + timing.get("pipeline_search_cpu_s", 0.0))
    h, sp, bo, tot = (statistics.median(x) for x in (homo_s, split_s, both_s, total_s))
    print(f"scale {model} B={gb}, 1024 devices, CPU s, median of {len(homo_s)}: homogeneous {homo} {h:.2f} "
          f"[{min(homo_s):.2f}-{max(homo_s):.2f}] (step {res.step_time_s:.4g} s); mixed {mixed}: split search "
          f"{sp:.2f} [{min(split_s):.2f}-{max(split_s):.2f}] ({timing['evaluations']} group searches), with the "
          f"pipeline mode's search {bo:.2f} [{min(both_s):.2f}-{max(both_s):.2f}], with "
          f"baselines and plans {tot:.2f} [{min(total_s):.2f}-{max(total_s):.2f}] (step "
          f"{doc['predicted']['step_time_s']:.4g} s)", file=out, flush=True)
    print(f"ratio to homogeneous: split search {sp / h:.2f}x, both modes' searches {bo / h:.2f}x, with baselines "
          f"and plans {tot / h:.2f}x "
          f"(target <= {TARGET:g}x: split {'met' if sp / h <= TARGET else 'NOT met'}, total "
          f"{'met' if tot / h <= TARGET else 'NOT met'})", file=out, flush=True)
    return sp / h, tot / h


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", help="a model name, a groups spec part (e.g. v100), 'link' or 'scale'")
    ap.add_argument("--runs", type=int, default=3, help="alternating runs of the scale timing")
    args = ap.parse_args(argv)
    for model, spec in CASES:
        if args.only and args.only not in model and args.only not in spec:
            continue
        print(case_line(model, spec), flush=True)
    if not args.only or args.only == "link":
        model, spec, bw, batch = LINK
        print(f"link {bw / 1e9:g} GB/s per device: " + case_line(model, spec, bw, batch), flush=True)
    if not args.only or args.only == "scale":
        scale(args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
