"""The main job end to end, against a bare `import torch`, in one run:
`python -m bench.startup [--runs N] [--no-phases]`.

Each case is a fresh Python process (what a user waits for), run --runs times (default 3), median:

  import torch      python -c "import torch"
  main job          sapp search --model gpt3-175b --cluster a100-80g:nodes=128      (target: <= 2x import torch)
  DeepSeek-V3-like  sapp search --model deepseek-v3-like --cluster h800:nodes=256 --batch 4096   (target: <= 5 s)

each job twice: cold (an empty capture cache: every run gets a fresh SAPP_CACHE_DIR, so it imports
torch, builds and traces the model) and warm (the cache holds the model's graph, as for any search
after the first of that model: sapp/capture/cache.py; no torch import).  Wall seconds and the
child's CPU seconds (user + sys) are printed; on a shared machine the CPU column is the steadier one
(wall swings with the other load), the targets are about wall on a quiet box.  Then, unless
--no-phases, where the time goes: one more process per job and temperature timing its phases in
order (cold: imports, torch._dynamo's import which torch.export needs, building the model on meta,
capture; warm: reading the cached graph; then the joint search, building and validating the plan)."""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

MAIN = ["--model", "gpt3-175b", "--cluster", "a100-80g:nodes=128"]
DSV3 = ["--model", "deepseek-v3-like", "--cluster", "h800:nodes=256", "--batch", "4096"]
CASES = [("import torch", ["-c", "import torch"], None),
         ("main job cold (gpt3-175b, 1024 A100)", ["-m", "sapp.commands.cli", "search", *MAIN], "cold"),
         ("main job warm", ["-m", "sapp.commands.cli", "search", *MAIN], "warm"),
         ("DeepSeek-V3-like cold (2048 H800)", ["-m", "sapp.commands.cli", "search", *DSV3], "cold"),
         ("DeepSeek-V3-like warm", ["-m", "sapp.commands.cli", "search", *DSV3], "warm")]


def timed(args, cache_dir=None):
    """(wall s, CPU s) of one child process `python args` (SAPP_CACHE_DIR=cache_dir when given)."""
    env = dict(os.environ, **({"SAPP_CACHE_DIR": cache_dir} if cache_dir is not None else {}))
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, stdout=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - t
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def phases(model, cluster, batch, warm=False):
    """{phase: (wall s, CPU s)} of one `sapp search` run, phase by phase, in this process; `warm`:
    the graph read from the capture cache (SAPP_CACHE_DIR must hold it)."""
    out, clock = {}, [time.perf_counter(), time.process_time()]

    def mark(name):
        t, c = time.perf_counter(), time.process_time()
        out[name] = (t - clock[0], c - clock[1])
        clock[:] = [t, c]
    if warm:
        return _warm_phases(model, cluster, batch, out, mark)
    import torch  # noqa: F401
    mark("import torch")
    from sapp.api import capture_graph, resolve_model
    from sapp.search.joint import joint_search  # noqa: F401  (imported here to time it)
    mark("import sapp")
    import torch.export  # noqa: F401
    import torch._dynamo  # noqa: F401  (torch.export, or the first meta op with a Python kernel, imports it)
    mark("import torch._dynamo")
    module, name, info = resolve_model(model)        # what sapp.api.search does, phase by phase
    mark("build model on meta")
    graph, _ = capture_graph(module)
    mark("capture (torch.export + replicate)")
    _search_phases(graph, name, info, cluster, batch, mark)
    return out


def _warm_phases(model, cluster, batch, out, mark):
    from sapp.api import capture_spec
    from sapp.search.joint import joint_search  # noqa: F401  (imported here to time it)
    mark("import sapp")
    module, name, info, graph, _ = capture_spec(model)
    if module is not None:
        raise SystemExit("warm phases: the capture cache did not hold the graph")
    mark("read the cached graph")
    _search_phases(graph, name, info, cluster, batch, mark)
    if "torch" in sys.modules:
        raise SystemExit("warm phases: torch was imported")
    return out


def _search_phases(graph, name, info, cluster, batch, mark):
    """The phases after capture, as sapp.api.search runs them."""
    from sapp.api import build_plan, default_global_batch, resolve_cluster, tp_search_fn
    from sapp.search.constraints import Constraints
    from sapp.costmodel import CostSettings
    from sapp.search.joint import joint_search
    cl = resolve_cluster(cluster)
    gb = batch if batch is not None else default_global_batch(info, cl.devices)
    settings = CostSettings(precision=cl.precision, runtime="eager", dropout_noise=not cl.fused_dropout)
    cons = Constraints.from_dict(None)
    res = joint_search(graph, cl, global_batch=gb, constraints=cons, settings=settings, search_fn=tp_search_fn())
    mark("joint search")
    plan = build_plan(graph, cl, res, name=name, global_batch=gb, constraints=cons, settings=settings)
    mark("plan (operators, schema check)")
    plan.to_json()
    mark("plan to JSON")


def _phase_child(argv):
    model, cluster, batch = argv[0], argv[1], (int(argv[2]) if argv[2] != "-" else None)
    print(json.dumps(phases(model, cluster, batch, warm=argv[3] == "warm")))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-phases", action="store_true")
    ap.add_argument("--_phases", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a._phases:
        return _phase_child(a._phases)
    print(f"{'case':38s} {'wall s':>8s} {'CPU s':>8s}   (median of {a.runs} fresh processes; min..max wall)")
    med = {}
    with tempfile.TemporaryDirectory() as tmp:
        warm_dir = os.path.join(tmp, "warm-cache")
        for label, args, temp in CASES:
            if args[0] == "-m":
                args = [*args, "--out", os.path.join(tmp, "plan.json")]
            if temp == "warm":                    # the first search of the model fills the cache, untimed
                timed(args, warm_dir)
            runs = []
            for i in range(max(1, a.runs)):
                cold_dir = os.path.join(tmp, f"cold-{len(med)}-{i}")        # empty: nothing cached
                runs.append(timed(args, {"cold": cold_dir, "warm": warm_dir}.get(temp)))
            w, c = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
            med[label] = (w, c)
            print(f"{label:38s} {w:8.2f} {c:8.2f}   [{min(r[0] for r in runs):.2f}..{max(r[0] for r in runs):.2f}]")
        (tw, tc), (mw, mc), (ww, wc), (dw, dc), (dww, dwc) = med.values()
        for temp, (m_w, m_c), (d_w, d_c) in (("cold", (mw, mc), (dw, dc)), ("warm", (ww, wc), (dww, dwc))):
            print(f"{temp}: main job / import torch: {m_w / tw:.2f}x wall, {m_c / tc:.2f}x CPU (target <= 2x wall on a "
                  f"quiet box: {'met' if m_w <= 2 * tw else 'NOT met'}); DeepSeek-V3-like {d_w:.2f} s wall, {d_c:.2f} s "
                  f"CPU (target <= 5 s: {'met' if d_w <= 5 else 'NOT met'})")
        if a.no_phases:
            return 0
        for label, (model, cluster, batch) in (("main job", ("gpt3-175b", "a100-80g:nodes=128", "-")),
                                               ("DeepSeek-V3-like", ("deepseek-v3-like", "h800:nodes=256", "4096"))):
            for temp in ("cold", "warm"):
                env = dict(os.environ, SAPP_CACHE_DIR=warm_dir)
                r = subprocess.run([sys.executable, "-m", "bench.startup", "--_phases", model, cluster, batch, temp],
                                   check=True, capture_output=True, text=True, env=env)
                ph = json.loads(r.stdout.strip().splitlines()[-1])
                tot = [sum(v[i] for v in ph.values()) for i in (0, 1)]
                print(f"\n{label}, {temp}: where the time goes (one process, phases in order)")
                print(f"  {'phase':36s} {'wall s':>7s} {'CPU s':>7s} {'CPU %':>6s}")
                for k, (w, c) in ph.items():
                    print(f"  {k:36s} {w:7.2f} {c:7.2f} {100 * c / max(tot[1], 1e-9):5.0f}%")
                print(f"  {'total':36s} {tot[0]:7.2f} {tot[1]:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
