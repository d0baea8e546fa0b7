"""`python -m bench.fuzz [--n 10000] [--seed 0] [--roundtrip]`: bad input never crashes, hangs or lies.

Generates plans (valid ones from `sapp.search`, then mutated: fields deleted, retyped, set to junk, the
JSON text cut or corrupted), cluster specs, dicts and files, constraints, search arguments and whole
`sapp` command lines, and (fuzz_surfaces.py, SURFACE_SHARE of the inputs) engine files, HF configs, data
files, re-sealed checkpoints and re-signed capture-cache entries, and feeds each to every entry point that takes it: Plan load, evaluate,
explain, diff, plot, run's pre-checks, search, Cluster.parse/load, Constraints and the CLI.  Each
input must end in success or a SappError whose message is one non-empty line, within TIMEOUT_S
seconds and MEMORY_LIMIT bytes of address space (a MemoryError counts as a blow-up).  Prints the
counts; any exception of another type is listed with the input that raised it.

`--roundtrip`: every case of bench/RESULTS.md §1 (bench/run.py FULL_CASES) searched, then re-scored
by `sapp.evaluate`; the prediction must be the same to the plan's 6 significant digits.

tests/test_fuzz.py runs the same generators under hypothesis with a small budget."""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import resource
import signal
import sys
import tempfile
import time
import traceback
from types import SimpleNamespace

from . import fuzz_hostile as hostile

TIMEOUT_S = 20.0           # CPU seconds (ITIMER_PROF): the bound must not depend on how loaded the box is
WALL_TIMEOUT_S = 300.0     # wall seconds: an open() blocked on a FIFO uses no CPU time at all
HOSTILE_SHARE = 0.3        # inputs drawn from bench/fuzz_hostile.py's classes
SURFACE_SHARE = 0.32       # engine files, HF configs, data files, checkpoints, cache entries (fuzz_surfaces.py)
DIR_SHARE = 0.12           # checkpoint dirs with foreign content, plans/ links, multi-node flags (fuzz_dirs.py)
MEMORY_LIMIT = 6 << 30


from .fuzz_gen import (corrupt_text, gen_argv, gen_cluster_doc, gen_cluster_spec, gen_constraints,  # noqa: F401
                       gen_global_batch, mutate)


# ---- the run ----------------------------------------------------------------------------------------
class Timeout(BaseException):
    """Raised by the alarm; a BaseException so that no `except Exception` in sapp swallows it."""


def _alarm(signum, frame):
    raise Timeout()


class Fuzzer:
    def __init__(self, rng, *, plot_every=5, precheck_every=5, quiet=True, light=False):
        """`light`: seeds from gpt-tiny only (a few seconds to build; what the CI tests use)."""
        from sapp.api import capture_graph, resolve_model, search
        self.rng = rng
        self.plot_every, self.precheck_every = plot_every, precheck_every
        self.tmp = tempfile.mkdtemp(prefix="sapp-fuzz-")
        models = ("gpt-tiny",) if light else ("gpt-tiny", "gpt-small")
        self.graphs = {m: capture_graph(resolve_model(m)[0])[0] for m in models}
        tiny = self.graphs["gpt-tiny"]
        self.seeds = [  # valid plans: plain, pipelined, CPU, interleaved with per-block recomputation
            search("gpt-tiny", "a100-80g:nodes=1", global_batch=16, graph=tiny).to_dict(),
            search("gpt-tiny", "a100-80g:nodes=1", global_batch=16, constraints={"pp": 2, "zero": 1}, graph=tiny).to_dict(),
            search("gpt-tiny", "cpu", global_batch=8, graph=tiny).to_dict(),
        ]
        if not light:
            self.seeds.append(search("gpt-small", "a100-80g:nodes=1,memory=15MB",
                                     constraints={"pp": 2, "schedule": "interleaved"},
                                     graph=self.graphs["gpt-small"]).to_dict())
        self.cluster_base = self.seeds[0]["cluster"]
        self.files = self._files()
        self.special = hostile.special_paths(self.tmp)
        from .fuzz_surfaces import Surfaces
        self.surfaces = Surfaces(rng, self.tmp, tiny, mutate)
        from .fuzz_dirs import DirSurfaces
        self.dirs = DirSurfaces(rng, self.tmp, self.surfaces.ckpt, self.seeds[2])
        self.counts = {"inputs": 0, "ok": 0, "sapp_error": 0, "other_exception": 0, "timeout": 0, "memory": 0,
                       "bad_message": 0, "clean_exit": 0, "nonsense": 0}
        self.by_kind = {}
        self.failures = []
        self.slowest = (0.0, None)
        self.quiet = quiet

    def _files(self):
        from sapp.plan import Plan
        plans = []
        for i, s in enumerate(self.seeds):
            p = os.path.join(self.tmp, f"seed{i}.json")
            Plan(s).save(p)
            plans.append(p)
        for i in range(3):
            p = os.path.join(self.tmp, f"bad{i}.json")
            with open(p, "w") as f:
                f.write(json.dumps(mutate(random.Random(i), self.seeds[0])))
            plans.append(p)
        plans += ["/nonexistent/plan.json", self.tmp]
        cl = os.path.join(self.tmp, "cluster.json")
        with open(cl, "w") as f:
            json.dump(self.cluster_base, f)
        return {"plans": plans, "cluster": cl, "out": os.path.join(self.tmp, "out.json"), "dir": self.tmp}

    # -- entry points --
    def plan_entry(self, doc, text=None, expect="any"):
        """`expect` "refuse": the plan names what the model lacks or is hostile; it must not score."""
        from sapp.api import evaluate
        from sapp.plan import Plan
        from sapp.report import diff, explain, plot
        plan = Plan.from_json(text) if text is not None else Plan(doc)
        explain(plan)
        diff(plan, Plan(self.seeds[0]))
        n = self.counts["inputs"]
        if n % self.plot_every == 0:
            plot(plan, os.path.join(self.tmp, "p.png"), width=400, height=300)
        name = plan["model"].get("name")
        graph = self.graphs.get(name) if isinstance(name, str) else None
        res = evaluate(name if graph is not None else "gpt-tiny", None, plan, graph=graph or self.graphs["gpt-tiny"])
        hostile.check_sane(res["step_time_s"], res["mfu"])
        if expect == "refuse":
            raise hostile.Nonsense("a hostile plan was scored instead of refused")
        if n % self.precheck_every == 0:
            self.run_precheck(plan)

    def run_precheck(self, plan):
        from sapp.commands.run import precheck
        path = os.path.join(self.tmp, "pre.json")
        plan.save(path)
        args = SimpleNamespace(plan=path, model=plan["model"].get("name") or "gpt-tiny", model_arg=[], steps=1,
                               data=None, out=None, nproc=None, lr=1e-3, optimizer="adam", seed=0, timeout=5.0,
                               nnodes=None, hf_config=None)
        precheck(args)

    def cluster_entry(self, kind, value):
        from sapp.api import search
        from sapp.cluster import Cluster
        if kind == "spec":
            cl = Cluster.parse(value)
        elif kind == "dict":
            cl = Cluster.from_dict(value)
        else:
            path = os.path.join(self.tmp, "fuzz-cluster.json")
            with open(path, "wb") as f:
                f.write(value)
            cl = Cluster.load(path)
        if self.rng.random() < 0.3:
            hostile.check_plan(search("gpt-tiny", cl, global_batch=gen_global_batch(self.rng), graph=self.graphs["gpt-tiny"]))

    def search_entry(self, spec, gb, cons, precision):
        from sapp.api import search
        model = self.rng.choice(sorted(self.graphs) + ["gpt-tiny"])
        hostile.check_plan(search(model, spec, global_batch=gb, constraints=cons, precision=precision,
                                  graph=self.graphs[model]), cons)

    def cli_entry(self, argv):
        import sapp.calibrate
        import subprocess
        from sapp.commands.cli import main
        from sapp.cluster import PRESETS
        import sapp.api
        real_call, real_cal, real_cap = subprocess.call, sapp.calibrate.calibrate, sapp.api.capture_graph
        subprocess.call = lambda *a, **k: 0                       # never launch training
        sapp.calibrate.calibrate = lambda **k: (PRESETS["cpu"], {})   # never measure

        def cached_capture(module, example_inputs=None, loss_fn=None, targets=None):   # zoo graphs captured once
            spec = getattr(module, "sapp_spec", None)
            if example_inputs is None and loss_fn is None and spec is not None and spec.name in self.graphs:
                return self.graphs[spec.name], 0.0
            return real_cap(module, example_inputs, loss_fn, targets)
        sapp.api.capture_graph = cached_capture
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    rc = main(argv)
                except SystemExit as e:      # argparse: usage line + exit 2 (or --help: 0)
                    return "clean_exit" if e.code in (0, 2) else None
        finally:
            subprocess.call, sapp.calibrate.calibrate, sapp.api.capture_graph = real_call, real_cal, real_cap
        if "Traceback" in err.getvalue():
            raise AssertionError(f"traceback printed: {err.getvalue()[-300:]}")
        if rc == 2:
            lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
            if len(lines) != 1:
                raise AssertionError(f"error output is not one line: {err.getvalue()[-300:]!r}")
        return None

    # -- one generated input --
    def one(self):
        rng = self.rng
        if rng.random() < DIR_SHARE:
            return self.dirs.one()
        if rng.random() < SURFACE_SHARE:
            return self.surfaces.one()
        if rng.random() < HOSTILE_SHARE:
            return self.one_hostile()
        r = rng.random()
        if r < 0.40:
            seed = rng.choice(self.seeds)
            if rng.random() < 0.2:
                kind, call = "plan-text", lambda t=corrupt_text(rng, json.dumps(mutate(rng, seed, 1) if rng.random() < 0.5 else seed)): self.plan_entry(None, t)
            else:
                kind, call = "plan", lambda d=(mutate(rng, seed) if rng.random() < 0.9 else seed): self.plan_entry(d)
        elif r < 0.55:
            kind, call = "cluster-spec", lambda s=gen_cluster_spec(rng): self.cluster_entry("spec", s)
        elif r < 0.65:
            if rng.random() < 0.7:
                kind, call = "cluster-dict", lambda d=gen_cluster_doc(rng, self.cluster_base): self.cluster_entry("dict", d)
            else:
                blob = corrupt_text(rng, json.dumps(gen_cluster_doc(rng, self.cluster_base))).encode("utf-8", "surrogatepass")
                if rng.random() < 0.2:
                    blob = bytes(rng.randrange(256) for _ in range(64))
                kind, call = "cluster-file", lambda b=blob: self.cluster_entry("file", b)
        elif r < 0.80:
            spec = rng.choice(["a100-80g:nodes=1", "cpu", "v100-32g:nodes=2", gen_cluster_spec(rng)])
            prec = rng.choice([None, None, "fp32", "bf16-mixed", "fp8", 5])
            kind, call = "search", lambda a=(spec, gen_global_batch(rng), gen_constraints(rng), prec): self.search_entry(*a)
        else:
            kind, call = "cli", lambda a=gen_argv(rng, self.files): self.cli_entry(a)
        return kind, call

    def one_hostile(self):
        """The classes of bench/fuzz_hostile.py: deep nesting, huge counts, tiny / huge floats,
        special paths, schema-valid plans naming what the model lacks."""
        rng = self.rng
        r = rng.random()
        if r < 0.4:
            doc, expect = hostile.hostile_plan(rng, rng.choice(self.seeds))
            return "hostile-plan", lambda a=(doc, expect): self.plan_entry(a[0], expect=a[1])
        if r < 0.5:
            text, which = hostile.deep_text(rng), rng.choice(["plan", "cluster"])
            return "deep-text", lambda a=(which, text): self.deep_entry(*a)
        if r < 0.65:
            kind, value = hostile.hostile_cluster(rng, self.cluster_base)
            return "hostile-cluster", lambda a=(kind, value): self.cluster_entry(*a)
        if r < 0.8:
            spec = rng.choice(["a100-80g:nodes=1", "cpu", "a100-80g:nodes=1,gpus=2"])
            a = (spec, rng.choice([1, 2, 16, 1 << 22]), hostile.hostile_constraints(rng), None)
            return "hostile-search", lambda a=a: self.search_entry(*a)
        what, call = hostile.special_path_call(rng, self.special, self.files)
        if isinstance(call, list):
            return "special-path", lambda a=(what, call[1]): self.cli_entry(a[1])
        return "special-path", lambda a=what, c=call: c()

    def deep_entry(self, which, text):
        from sapp.cluster import Cluster
        from sapp.plan import Plan
        if which == "plan":
            Plan.from_json(text)
        else:
            path = os.path.join(self.tmp, "deep-cluster.json")
            with open(path, "w") as f:
                f.write(text)
            Cluster.load(path)

    def step(self):
        from sapp.errors import SappError
        kind, call = self.one()
        self.counts["inputs"] += 1
        per = self.by_kind.setdefault(kind, {"inputs": 0, "errors": 0})
        per["inputs"] += 1
        t0 = time.perf_counter()
        signal.setitimer(signal.ITIMER_PROF, TIMEOUT_S)
        signal.setitimer(signal.ITIMER_REAL, WALL_TIMEOUT_S)     # a blocked open uses no CPU time
        outcome, detail = "ok", None
        try:
            res = call()
            if res == "clean_exit":
                outcome = "clean_exit"
        except SappError as e:
            msg = str(e)
            outcome = "sapp_error" if msg.strip() and "\n" not in msg else "bad_message"
            detail = msg
        except Timeout:
            outcome = "timeout"
        except hostile.Nonsense as e:
            outcome, detail = "nonsense", str(e)
        except MemoryError:
            outcome = "memory"
        except Exception as e:       # noqa: BLE001 - what the bench counts
            outcome, detail = "other_exception", "".join(traceback.format_exception_only(type(e), e)).strip()
            detail += " @ " + traceback.extract_tb(e.__traceback__)[-1].filename.split("site-packages/")[-1] + ":" + \
                str(traceback.extract_tb(e.__traceback__)[-1].lineno)
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
            signal.setitimer(signal.ITIMER_REAL, 0)
        dt = time.perf_counter() - t0
        if dt > self.slowest[0]:
            self.slowest = (dt, f"{kind}: {_describe(call)[:160]}")
        self.counts[outcome] += 1
        self.last = (outcome, detail)
        if outcome not in ("ok", "clean_exit", "sapp_error"):
            per["errors"] += 1
            self.failures.append((kind, outcome, (detail or "")[:300], _describe(call)))
            if not self.quiet:
                print(f"  {kind}: {outcome}: {(detail or '')[:200]}", flush=True)
        return outcome

    def report(self, elapsed):
        c = self.counts
        lines = [f"inputs {c['inputs']} in {elapsed:.0f} s: ok {c['ok']}, clean SappError {c['sapp_error']}, "
                 f"argparse usage exit {c['clean_exit']}",
                 f"non-SappError exceptions {c['other_exception']}, timeouts (> {TIMEOUT_S:.0f} CPU s) {c['timeout']}, "
                 f"memory blow-ups (> {MEMORY_LIMIT >> 30} GB) {c['memory']}, multi-line or empty messages {c['bad_message']}",
                 f"nonsense accepted (NaN / non-positive step, MFU > 100%, hostile plan scored, pins dropped) "
                 f"{c['nonsense']}",
                 f"slowest input {self.slowest[0]:.2f} s ({self.slowest[1]}); peak RSS "
                 f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB",
                 "by kind: " + ", ".join(f"{k} {v['inputs']}" + (f" ({v['errors']} failed)" if v["errors"] else "")
                                         for k, v in sorted(self.by_kind.items()))]
        seen = set()
        for kind, outcome, detail, what in self.failures:
            key = (kind, outcome, detail[:120])
            if key in seen:
                continue
            seen.add(key)
            lines.append(f"  FAIL {kind} {outcome}: {detail}\n       input: {what}")
        return "\n".join(lines)


def _describe(call):
    d = call.__defaults__ or ()
    try:
        return repr(d[0] if len(d) == 1 else d)[:300]
    except RecursionError:                   # an input nested past repr's depth
        return "<an input nested too deeply to print>"


def install_limits():
    signal.signal(signal.SIGALRM, _alarm)
    signal.signal(signal.SIGPROF, _alarm)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = MEMORY_LIMIT if hard == resource.RLIM_INFINITY else min(MEMORY_LIMIT, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


# ---- round trip of bench/RESULTS.md §1 ----------------------------------------------------------------
def roundtrip_results_table():
    """(case, ok, detail) for every FULL_CASES case: search, then evaluate the plan it wrote."""
    from sapp.api import capture_graph, evaluate, search
    from sapp.plan import Plan

    from .run import FULL_CASES, cluster_for
    import sapp.models
    keys = ("step_time_s", "peak_memory_bytes", "mfu", "compute_s", "comm_s", "bubble_s")
    out = []
    for model, batch, preset, devs in FULL_CASES:
        graph = capture_graph(sapp.models.get(model, device="meta"))[0]
        for n in devs:
            cl = cluster_for(preset, n)
            plan = search(model, cl, global_batch=batch, graph=graph)
            again = Plan.from_json(plan.to_json())
            ev = evaluate(model, None, again, graph=graph)
            pr = again["predicted"]
            diff = {k: (float(f"{ev[k]:.6g}"), pr[k]) for k in keys if float(f"{ev[k]:.6g}") != pr[k]}
            ok = not diff and again == plan
            out.append((f"{model} {preset} x{n}", ok, diff or f"step {pr['step_time_s']} s, peak "
                                                          f"{pr['peak_memory_bytes'] / 1e9:.2f} GB"))
            print(f"  {'ok  ' if ok else 'FAIL'} {model} {preset} x{n}: {out[-1][2]}", flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10000, help="generated inputs (default 10000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--roundtrip", action="store_true", help="also round-trip every bench/RESULTS.md §1 plan")
    ap.add_argument("--verbose", action="store_true", help="print each failure as it happens")
    ap.add_argument("--plot-every", type=int, default=10, help="draw every Nth valid plan (matplotlib is slow)")
    args = ap.parse_args(argv)
    rt_failed = 0
    if args.roundtrip:
        t0 = time.perf_counter()
        res = roundtrip_results_table()
        rt_failed = sum(not ok for _, ok, _ in res)
        print(f"round trip: {len(res) - rt_failed} of {len(res)} plans re-scored identically "
              f"({time.perf_counter() - t0:.0f} s)")
    if args.n <= 0:
        return 1 if rt_failed else 0
    install_limits()
    fz = Fuzzer(random.Random(args.seed), quiet=not args.verbose, plot_every=args.plot_every,
                precheck_every=args.plot_every)
    t0 = time.perf_counter()
    for i in range(args.n):
        fz.step()
        if (i + 1) % 500 == 0:
            print(f"  {i + 1} inputs, {time.perf_counter() - t0:.0f} s, failures {len(fz.failures)}", flush=True)
    print(fz.report(time.perf_counter() - t0))
    bad = (fz.counts["other_exception"] + fz.counts["timeout"] + fz.counts["memory"] + fz.counts["bad_message"]
           + fz.counts["nonsense"])
    return 1 if bad or rt_failed else 0


if __name__ == "__main__":
    sys.exit(main())
