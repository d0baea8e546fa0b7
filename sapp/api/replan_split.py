"""The idle nodes of a re-plan, priced as a second data-parallel group (sapp/api/replan.py).

Where no uniform layout fits the node count (127 A100 nodes: no dp x tp x pp of 1,016 devices
divides a batch of 1536), the fastest uniform plan leaves nodes idle.  Those nodes can still train
as a data-parallel group of their own with an uneven batch share (search/hetero.py, the mixed-cluster
split: each group its own layout, the gradients all-reduced between the groups).  That split is
priced here with hetero's own walk (`_free`), its group searches sharing the re-plan's caches (the
winning count's stage profiles, which no node count reaches: sapp/api/replan_price.py) and bounded by
the uniform step, so a split that cannot beat it costs bounded searches only.  The winning count's
nodes keep the plan's layout (its dp, tp, pp, cp, ep pinned at every share they are priced at;
shares in multiples of its dp): pricing them free at a new share was a whole search whose top micro-batch
samples and dp divisors are new (0.45-0.49 of the 0.65 CPU-s the split cost for GPT-3 175B on 127
nodes; pinned, 0.1), and the step it prices is that of a mixed plan which reshards nothing on them.
On that case the pinned price equals the free one (the free search keeps the layout at 1488 of 1536
samples).  The result is a sentence for the plan's notes: the idle nodes and what using them prices,
faster or slower, and the `sapp search --cluster A+B` that writes a mixed plan (a plan with `groups`,
which `sapp run` runs; it searches every group's layout, so it prices at most as much at these shares)."""
from __future__ import annotations

import math


def price_split(pricer, won, idle: int):
    """(step, shares, sync seconds) of the winning count's cluster `won.cl` beside `idle` nodes of
    the same kind, or (inf, None, 0) where no split fits."""
    from sapp.cluster.groups import MixedCluster
    from sapp.errors import SappError
    from sapp.search import hetero
    rest = won.cl.replace(nodes=idle, name=f"{won.cl.name}-idle")
    try:
        mc = MixedCluster.build([won.cl, rest])
    except SappError:
        return math.inf, None, 0.0
    settings = pricer.cost_settings(won.cl)
    pr = hetero.GroupPricer(pricer.graph, mc, pricer.Constraints.from_dict(won.kept or None), settings,
                            pricer.search_fn)
    # the big group is the winning count's cluster object: its caches (owned by that object) go on;
    # the idle group gets its own dict over the shared profiles
    pr.shared = [won.caches, dict(pricer.common)]
    gb, dp = pricer.gb, 1
    if won.res is not None and won.kind == "exact":
        # the big group alone at the whole batch is the winning count's own priced result (the same
        # search: its cluster object, caches, kept pins and settings), not searched again; at the other
        # shares it keeps that result's layout
        pr.cache[(0, gb)] = won.res
        c = won.res.config
        keep = {"dp": c.dp, "tp": c.tp, "pp": c.pp, **({"cp": c.cp} if c.cp > 1 else {}),
                **({"ep": c.ep} if c.ep > 1 else {})}
        pr.group_cons = [pricer.Constraints.from_dict({**(won.kept or {}), **keep}), pr.cons]
        dp = c.dp if gb % c.dp == 0 else 1
    q = dp * hetero.quantum(gb // dp, 2)
    step, shares = hetero._free(pr, pricer.graph, mc, settings, gb // q, q)
    pricer.joint_searches += pr.searches
    if not math.isfinite(step):
        return math.inf, None, 0.0
    shares = tuple(s * q for s in shares)
    used = [g for g, b in enumerate(shares) if b > 0]
    return step, shares, hetero.sync_s(pricer.graph, mc, settings, used)


def idle_note(model_name, base, won_nodes, idle, uniform_step, split, gb) -> str:
    """The note on the idle nodes: what a second data-parallel group on them prices."""
    step, shares, sync = split
    head = f"{idle} of {won_nodes + idle} nodes idle"
    if shares is None:
        return (f"{head}: no layout fits them as a second data-parallel group beside the {won_nodes} "
                f"(nothing of the model fits {idle * base.gpus_per_node} devices at any batch share)")
    if shares[1] == 0:
        return (f"{head}: as a second data-parallel group beside the {won_nodes} they get no batch share in "
                f"the best split (every share they were priced at, with the cross-group gradient all-reduce, "
                f"is slower than this plan's {uniform_step:.4g} s/step)")
    change = step / uniform_step - 1
    spec = "+".join(f"{base.name}:gpus={base.gpus_per_node},nodes={n}" for n in (won_nodes, idle))
    verdict = "faster" if change < 0 else "slower"
    return (f"{head}: using them as a second data-parallel group ({won_nodes} + {idle} nodes, the {won_nodes} at "
            f"this plan's layout, batch shares "
            f"{shares[0]} + {shares[1]}, cross-group gradient all-reduce {sync:.3g} s) prices {step:.4g} s/step, "
            f"{abs(change):.1%} {verdict} than this plan's {uniform_step:.4g} s"
            + (f"; that mixed plan (a plan with `groups`, which `sapp run` runs; `sapp run --elastic` re-plans "
               f"one-kind plans only, so this plan stays one kind) is `sapp search --model {model_name} "
               f"--cluster {spec} --batch {gb} --out PLAN`" if change < 0 else ""))
