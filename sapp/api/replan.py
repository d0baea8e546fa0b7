"""Re-planning for another number of devices: the same model, global batch, precision, runtime and
(where they still fit) pins, searched again for a cluster scaled to the nodes that are left or were
added.  `sapp replan` shows it in advance; `sapp run --elastic` does it when torchrun's agent forms a
group of another size (sapp/emit/runtime/worker.py), then resumes the last checkpoint under the new plan
(DCP reshards it; the data order does not depend on the plan, so no sample is lost or repeated).

A world of N nodes may admit no layout at all (1,016 A100s = 8 x 127: no dp x tp x pp of them divides a
global batch of 1536), and a few nodes fewer can be faster than all of them.  So the candidates are
N, N-1, N-2, N-3 nodes, the largest smaller counts whose devices factor into a layout of the batch,
and the largest power of two <= N (`candidates`); the fastest plan wins and the spare nodes idle
(sapp/api/replan_price.py prices the candidates lazily, by bounds against the best so far, and searches
only the winner in full; sapp/api/replan_split.py prices the idle nodes as a second data-parallel group
and the plan's notes say what that costs or saves).  Pins the user gave are kept when a
search with them succeeds; otherwise they are dropped one at a time, device-count pins (dp, tp, pp,
cp, ep) first, and every dropped pin is said."""
from __future__ import annotations

import dataclasses
import time

from sapp.cluster import Cluster
from sapp.errors import SappError
from sapp.plan import summary
from sapp.api.replan_price import DEVICE_PINS, search_keeping_pins  # noqa: F401 - DEVICE_PINS: this module's name for them


@dataclasses.dataclass
class Replan:
    plan: object                    # the new Plan
    old: dict                       # the old plan's layout and prediction
    new: dict
    nodes: int                      # nodes the new plan uses (of `available`)
    available: int
    dropped_pins: list
    search_s: float
    tried: list                     # [(nodes, step time, ("above", s): slower than s, or why not)]
    search_cpu_s: float = 0.0
    idle_note: str = None           # the idle nodes and what using them as a second dp group prices

    def lines(self) -> list:
        o, n = self.old, self.new
        change = n["step_time_s"] / o["step_time_s"] - 1 if o["step_time_s"] else 0.0
        out = [f"old: {_layout(o)} on {o['devices']} devices: {o['step_time_s']:.4g} s/step",
               f"new: {_layout(n)} on {n['devices']} devices: {n['step_time_s']:.4g} s/step ({change:+.1%}), "
               f"searched in {self.search_s:.1f} s"]
        if self.nodes < self.available:
            out.append(f"{self.available - self.nodes} of {self.available} nodes idle: "
                       + ", ".join(f"{k} nodes {_tried(v)}" for k, v in self.tried))
            if self.idle_note:
                out.append(self.idle_note)
        if self.dropped_pins:
            out.append(f"pins dropped (no plan fits with them): {', '.join(self.dropped_pins)}")
        return out


def _tried(v) -> str:
    if isinstance(v, str):
        return "no layout fits"
    if isinstance(v, tuple):        # pruned by its bounds against the best count's step
        return f"> {v[1]:.4g} s/step"
    return f"{v:.4g} s/step"


def _layout(d: dict) -> str:
    p = d["parallel"]
    return (f"dp {p['dp']} tp {p['tp']} pp {p['pp']}" + (f" cp {p['cp']}" if p.get("cp", 1) > 1 else "")
            + (f" ep {p['ep']}" if p.get("ep", 1) > 1 else "") + f", {d['micro_batches']} micro-batches, zero {d['zero']}")


def scaled_cluster(plan, nodes: int = None, devices: int = None) -> Cluster:
    """The plan's cluster with `nodes` nodes (or `devices` devices: whole nodes, or one partial node)."""
    cl = Cluster.from_dict(plan["cluster"], where="the plan's cluster")
    if devices is not None:
        if devices < 1:
            raise SappError(f"--devices {devices}: give a positive number of devices")
        if devices < cl.gpus_per_node:
            return cl.replace(nodes=1, gpus_per_node=devices).validate()
        if devices % cl.gpus_per_node:
            raise SappError(f"--devices {devices} is not a multiple of the plan's {cl.gpus_per_node} devices per node; "
                            "give whole nodes (--nodes) or a multiple")
        nodes = devices // cl.gpus_per_node
    if nodes is None or nodes < 1:
        raise SappError("give the number of nodes (--nodes N) or devices (--devices N) to re-plan for, at least 1")
    return cl.replace(nodes=nodes).validate()


def candidates(nodes: int, per_node: int = 1, global_batch: int = 0, blocks: int = 0, top: int = 4) -> list:
    """Node counts to search: N, N-1, N-2, N-3; then the `top` largest counts below whose devices
    factor as dp x tp x pp with dp dividing the global batch (tp up to the devices of a node, pp up
    to 128), and the `top` largest where pp also divides the `blocks` (even stages); then the largest
    power of two.  A lost node of 2,048 leaves 2,047 = 23 x 89: no layout of a 2,048-sequence batch
    fits it or its neighbours, while 2,016 nodes (dp 32 x tp 8 x pp 63) or 1,536 (dp 512 x tp 8 x
    pp 3) do, and which is faster is the search's call."""
    out = [n for n in range(nodes, max(nodes - 4, 0), -1)]
    if global_batch:
        dps = [d for d in range(1, global_batch + 1) if global_batch % d == 0] if global_batch <= 1 << 16 else \
            [1 << k for k in range(global_batch.bit_length()) if global_batch % (1 << k) == 0]
        tps = [t for t in (1, 2, 4, 8, 16) if t <= per_node]
        for pps in (range(1, 129), [p for p in range(1, 129) if blocks and blocks % p == 0]):
            fits = {dp * tp * pp // per_node for dp in dps for tp in tps for pp in pps
                    if dp * tp * pp <= nodes * per_node and (dp * tp * pp) % per_node == 0}
            out += sorted(fits - set(out), reverse=True)[:top]
    p2 = 1 << (nodes.bit_length() - 1)
    return out + ([p2] if p2 not in out else [])


def replan(model, plan, cluster: Cluster, *, graph=None, search=None, exact: bool = False) -> Replan:
    """The fastest plan for `cluster` (or a few nodes fewer of it; `exact`: all of it, as a running
    group whose every rank trains needs) keeping `plan`'s global batch, precision, runtime, optimizer, gradient width and pins.  `model`: what sapp.search takes; `search`: sapp.api.search (a
    parameter so the worker passes its own module; given, every candidate is searched in full).
    Raises SappError in one line when no plan fits, saying what would."""
    lazy = search is None
    if search is None:
        from sapp.api import search
    gb = int(plan["model"]["global_batch"])
    settings = plan["settings"]
    pins = dict(plan["constraints"] or {})
    if pins.get("target") == "torchtitan@0.2.2" and settings.get("runtime") == "torchtitan":
        # saved when "torchtitan" named 0.2.2's profile (its SDPA); "torchtitan" is 0.3's now
        settings = {**settings, "runtime": "torchtitan-0.2.2"}
    t0, c0 = time.perf_counter(), time.process_time()
    if graph is None:               # captured once for every candidate
        from sapp import api
        if isinstance(model, str):
            _, _, _, graph, _ = api.capture_spec(model)
        elif hasattr(model, "nodes"):
            # a captured OpGraph is its own graph, as api.search takes it: the lazy pricing
            # (replan_price) cuts and prices the graph itself and the candidates count its blocks
            graph = model
        else:
            graph, _ = api.capture_graph(model)
    counts = ([cluster.nodes] if exact else candidates(cluster.nodes, cluster.gpus_per_node, gb,
                                                        len(getattr(graph, "blocks", None) or ())))
    clusters = [cluster.replace(nodes=n) for n in counts]
    idle_note = None
    if lazy:
        best, tried, dropped, last_err, idle_note = _lazy(search, model, graph, clusters, gb, settings, pins,
                                                          cluster)
    else:
        best, tried, dropped, last_err = _every(search, model, graph, clusters, gb, settings, pins)
    search_s = time.perf_counter() - t0
    if best is None:
        raise SappError(f"no plan fits {cluster.devices} devices or a few nodes fewer ({last_err}); "
                        f"the job needs more nodes than {cluster.nodes}, or a smaller global batch than {gb}")
    new, nodes = best
    if idle_note:
        new._d["notes"].append(idle_note)
    return Replan(plan=new, old=summary(plan), new=summary(new), nodes=nodes, available=cluster.nodes,
                  dropped_pins=dropped, search_s=search_s, tried=tried, search_cpu_s=time.process_time() - c0,
                  idle_note=idle_note)


def _search_target(model, graph):
    """What api.search is given: the captured graph for a zoo name (whose module the search would build
    again per call and never check: runnable._zoo_model; its plan names the graph's name, the same
    name), the model itself otherwise (an HF config or factory is built and checked as before)."""
    from sapp.models.resolve import kind_of
    if isinstance(model, str) and graph is not None and kind_of(model) == "zoo" and graph.name == model:
        return graph
    return model


def _lazy(search, model, graph, clusters, gb, settings, pins, cluster):
    """(best, tried, dropped pins, last error, the note on idle nodes) by replan_price's lazy pricing."""
    from sapp.api.replan_price import Pricer, fastest
    from sapp.api.replan_split import idle_note, price_split
    pricer = Pricer(search, _search_target(model, graph), graph, gb, settings, pins)
    counts = fastest(pricer, clusters)
    tried = [(c.cl.nodes, c.value if c.kind in ("lb", "exact") else (("above", c.value) if c.kind == "above"
                                                                     else c.why)) for c in counts]
    won = [c for c in counts if c.kind == "exact"]
    if not won:
        return None, tried, [], next((c.why for c in reversed(counts) if c.why), None), None
    c = min(won, key=lambda c: c.key())
    note, idle = None, cluster.nodes - c.cl.nodes
    if idle:
        name = model if isinstance(model, str) else getattr(graph, "name", "MODEL")
        note = idle_note(name, cluster, c.cl.nodes, idle, c.value, price_split(pricer, c, idle), gb)
    return (c.plan, c.cl.nodes), tried, c.dropped, None, note


def _every(search, model, graph, clusters, gb, settings, pins):
    """Every candidate searched in full (a caller's own `search`)."""
    best, tried, dropped, last_err = None, [], [], None
    for cl in clusters:
        got, why, drop = search_keeping_pins(search, model, cl, gb, settings, pins, graph)
        tried.append((cl.nodes, got["predicted"]["step_time_s"] if got is not None else why))
        if got is not None and (best is None or got["predicted"]["step_time_s"] < best[0]["predicted"]["step_time_s"]):
            best, dropped = (got, cl.nodes), drop
        last_err = why or last_err
    return best, tried, dropped, last_err
