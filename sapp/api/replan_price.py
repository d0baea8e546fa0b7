"""The candidate node counts of a re-plan (sapp/api/replan.py), priced lazily.

Searching every candidate in full (12 for 127 A100 nodes of GPT-3 175B) cost 8x the search it
replaces: each api.search built the zoo module again (0.8 s for 175B, unused: zoo models skip the
emitter's pre-step checks) and priced every candidate exactly, though only the fastest is kept.
Here each count is priced by the joint search with the best step so far as its `cutoff`
(configurations whose bound is above it are pruned unpriced; a count that cannot beat it answers
"above"), and only the winner is searched by api.search to build its plan.  Each count keeps its own
joint-search caches (the stage profiles price the cluster), so the plan's search reuses the profiles
its pricing built.  The counts share the tp layouts, units, stage profiles and graph cache (as
search/hetero.uniform_baseline shares the first two): a cluster that differs in its node count only
prices a (dp, tp, sp, micro-batch) profile alike, since nothing under build_profile reads the node
count (the pipeline depth and the dp sync over nodes are priced per configuration, search/joint/
numbers.py), and the memos that read the cluster's figures key on id(cluster).

The joint search's step is a lower bound of api.search's (which only drops configurations: the
emitter's checks, SP the whole graph cannot place), so the pick is made as the full search made it:
the count with the lowest (step, position) among exact steps, re-pricing any count whose lower bound
or cutoff could still beat it.  A count whose pinned search is cut is searched without the cutoff:
"above" could also mean "nothing fits with these pins", where the pins are dropped one at a time as
before."""
from __future__ import annotations

import math

from sapp.errors import SappError

DEVICE_PINS = ("dp", "pp", "tp", "cp", "ep")


def pin_order(pins) -> list:
    """The order pins are dropped in when no plan fits with them: device-count pins first."""
    return [k for k in DEVICE_PINS if k in pins] + sorted(k for k in pins if k not in DEVICE_PINS)


def search_keeping_pins(search, model, cl, gb, settings, pins, graph, caches=None):
    """(plan, None, dropped pins) or (None, why, ...): with every pin, then dropping device-count pins
    one at a time, then any pin."""
    order = pin_order(pins)
    kept, dropped, why = dict(pins), [], None
    extra = {} if caches is None else {"caches": caches}
    while True:
        try:
            # every setting the plan was priced with (plan_build's "settings" section)
            p = search(model, cl, global_batch=gb, constraints=kept or None, precision=settings.get("precision"),
                       runtime=settings.get("runtime"), optimizer=settings.get("optimizer"),
                       grad_fp32=bool(settings.get("grad_fp32")), graph=graph, **extra)
            return p, None, dropped
        except SappError as e:
            why = str(e).splitlines()[0][:200]
        if not order:
            return None, why, dropped
        k = order.pop(0)
        dropped.append(f"{k}={kept.pop(k)}")


class Count:
    """One candidate node count: its cluster (one object: the caches are checked by identity), its
    caches, and what is known of its step: kind "exact" (api.search's plan), "lb" (the joint search's
    step, a lower bound of api.search's), "above" (the step is above `value`) or "none" (nothing fits)."""

    def __init__(self, index, cluster, common):
        self.index, self.cl = index, cluster
        self.caches = dict(common)          # its own dict ("for": this cluster) over the shared ones
        self.kind, self.value, self.plan, self.why = None, math.inf, None, None
        self.kept, self.dropped, self.res = None, [], None

    def key(self):
        return (self.value, self.index)


class Pricer:
    def __init__(self, search, target, graph, gb, settings, pins):
        from sapp import api
        from sapp.search.constraints import Constraints
        from sapp.costmodel import CostSettings
        from sapp.pipeline.units import split_units
        self.search, self.target, self.graph, self.gb, self.settings, self.pins = \
            search, target, graph, gb, settings, dict(pins)
        self.Constraints, self.CostSettings, self.search_fn = Constraints, CostSettings, api.tp_search_fn()
        # one set for every count: no key of them reads the node count (the stage profiles price one
        # node's links and the per-device figures; memos of the cluster's figures key on id(cluster))
        self.common = {"strategies": {}, "units": split_units(graph), "profiles": {}, "graph": {}}
        self.joint_searches = self.plan_searches = 0
        self._work = None               # device-seconds of one sample at the best kernel rate (below)

    def cost_settings(self, cl):
        # exactly what api.search prices with (its CostSettings line), so the caches and results agree
        s = self.settings
        return self.CostSettings(precision=s.get("precision") or cl.precision, runtime=s.get("runtime") or "eager",
                                 dropout_noise=not cl.fused_dropout, optimizer=s.get("optimizer") or "adam",
                                 grad_fp32=bool(s.get("grad_fp32")))

    def price(self, c: Count, cutoff):
        """Fill c.kind/value by the joint search under `cutoff` (None: exactly), dropping pins as
        search_keeping_pins does where nothing fits with them."""
        from sapp.search.constraints import check_target_runtime
        from sapp.search.joint import joint_search
        if not self.pins and cutoff is not None and self.floor(c.cl) > cutoff:
            # every configuration's analytic bound is at least this floor: the search would stop at
            # its first look (joint_search's cutoff test), so it is not started
            c.kind, c.value, c.kept, c.why = "above", cutoff, {}, None
            return
        order, kept, dropped = pin_order(self.pins), dict(self.pins), []
        while True:
            try:
                cons = self.Constraints.from_dict(kept or None)
                # api.search refuses a runtime the pinned target does not run before it prices: so here
                check_target_runtime(cons.target, self.settings.get("runtime"))
                self.joint_searches += 1
                res = joint_search(self.graph, c.cl, global_batch=self.gb, constraints=cons,
                                   settings=self.cost_settings(c.cl), search_fn=self.search_fn,
                                   caches=c.caches, cutoff=cutoff)
            except SappError as e:
                c.why = str(e).splitlines()[0][:200]
                if not order:
                    c.kind, c.value = "none", math.inf
                    return
                k = order.pop(0)
                dropped.append(f"{k}={kept.pop(k)}")
                continue
            if res is None and kept and cutoff is not None:
                cutoff = None               # cut, or nothing fits with these pins: which, decides the pins
                continue
            c.kept, c.dropped, c.why = kept, dropped, None
            if res is None:
                c.kind, c.value = "above", cutoff
            else:
                c.kind, c.value, c.res = "lb", res.step_time_s, res
            return

    def floor(self, cl) -> float:
        """The perfectly split compute of the global batch on `cl`: the term every analytic_bound of
        the joint search starts from (search/joint/bounds.py; context.work_per_sample, the same for
        every node count: it reads the per-device figures only)."""
        if self._work is None:
            from sapp.search.joint.context import SearchContext
            ctx = SearchContext(self.graph, cl, self.gb, self.Constraints.from_dict(None), self.cost_settings(cl),
                                self.search_fn, None)
            self._work = ctx.work_per_sample
        return self._work * self.gb / cl.devices

    def confirm(self, c: Count):
        """api.search's plan for c with the pins its pricing kept; where that refuses, the full
        pin-dropping walk from every pin (what the search of this count alone did)."""
        self.plan_searches += 1
        p = self._plan_of_result(c)
        if p is not None:
            c.plan, c.why, c.kind, c.value = p, None, "exact", p["predicted"]["step_time_s"]
            return
        p, why, dropped = search_keeping_pins(self.search, self.target, c.cl, self.gb, self.settings, c.kept,
                                              self.graph, c.caches)
        if p is not None:
            c.dropped = c.dropped + dropped
        else:
            p, why, c.dropped = search_keeping_pins(self.search, self.target, c.cl, self.gb, self.settings,
                                                    self.pins, self.graph, c.caches)
        c.plan, c.why = p, why
        c.kind, c.value = ("exact", p["predicted"]["step_time_s"]) if p is not None else ("none", math.inf)


    def _plan_of_result(self, c: Count):
        """The plan api.search builds from c's priced result, for a captured graph (nothing to build or
        check: runnable.first_runnable returns its first result) where api.search would take the
        result as it is: no SP section the whole graph cannot place, no placement pins to parse.
        None: api.search decides (the caller runs it)."""
        from sapp.api import _sp_chosen, check_prediction
        from sapp.capture.ir import OpGraph
        from sapp.plan.build import build_plan, operator_section
        if c.res is None or not isinstance(self.target, OpGraph) or self.target is not self.graph:
            return None
        cons = self.Constraints.from_dict(c.kept or None)
        if cons.placement:
            return None
        res = c.res
        section = operator_section(self.graph, res.profile) if _sp_chosen(res) else None
        if section is not None and section[2].get("sp", {}).get("unsupported"):
            return None
        res.sapp_section = section
        check_prediction(res.step_time_s, res.mfu)
        plan = build_plan(self.graph, c.cl, res, name=self.graph.name or "graph", global_batch=self.gb,
                          constraints=cons, settings=self.cost_settings(c.cl), section=section, model_args=None)
        plan._timing = {"capture_s": 0.0, "search_s": 0.0}
        return plan


def fastest(pricer: Pricer, clusters) -> list:
    """The Counts of `clusters` (candidate order) with the fastest one confirmed: the one with the
    lowest (api.search step, position), as searching each in full picks it."""
    counts = [Count(i, cl, pricer.common) for i, cl in enumerate(clusters)]
    for c in counts:
        known = [d.key() for d in counts if d.kind in ("lb", "exact")]
        pricer.price(c, min(known)[0] if known else None)
    while True:
        exact = [c for c in counts if c.kind == "exact"]
        best = min(exact, key=Count.key) if exact else None
        bar = best.key() if best else (math.inf, len(counts))
        # what could still beat the best exact plan: a lower bound under it, a cutoff under its step
        open_ = [c for c in counts if (c.kind == "lb" and c.key() < bar) or (c.kind == "above" and c.value < bar[0])]
        if not open_:
            return counts
        c = min(open_, key=Count.key)
        if c.kind == "lb":
            pricer.confirm(c)
        else:
            pricer.price(c, bar[0] if best else None)
