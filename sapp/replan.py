"""Re-planning for another number of devices: the same model, global batch, precision, runtime and
(where they still fit) pins, searched again for a cluster scaled to the nodes that are left or were
added.  `sapp replan` shows it in advance; `sapp run --elastic` does it when torchrun's agent forms a
group of another size (sapp/emit/runtime/worker.py), then resumes the last checkpoint under the new plan
(DCP reshards it; the data order does not depend on the plan, so no sample is lost or repeated).

A world of N nodes may admit no layout at all (1,016 A100s = 8 x 127: no dp x tp x pp of them divides a
global batch of 1536), and a few nodes fewer can be faster than all of them.  So the candidates are
N, N-1, N-2, N-3 nodes, the largest smaller counts whose devices factor into a layout of the batch,
and the largest power of two <= N (`candidates`); the fastest plan wins and the spare nodes idle.  Pins the user gave are kept when a
search with them succeeds; otherwise they are dropped one at a time, device-count pins (dp, tp, pp,
cp, ep) first, and every dropped pin is said."""
from __future__ import annotations

import dataclasses
import time

from .cluster import Cluster
from .errors import SappError

DEVICE_PINS = ("dp", "pp", "tp", "cp", "ep")


@dataclasses.dataclass
class Replan:
    plan: object                    # the new Plan
    old: dict                       # the old plan's layout and prediction
    new: dict
    nodes: int                      # nodes the new plan uses (of `available`)
    available: int
    dropped_pins: list
    search_s: float
    tried: list                     # [(nodes, step time or why not)]

    def lines(self) -> list:
        o, n = self.old, self.new
        change = n["step_time_s"] / o["step_time_s"] - 1 if o["step_time_s"] else 0.0
        out = [f"old: {_layout(o)} on {o['devices']} devices: {o['step_time_s']:.4g} s/step",
               f"new: {_layout(n)} on {n['devices']} devices: {n['step_time_s']:.4g} s/step ({change:+.1%}), "
               f"searched in {self.search_s:.1f} s"]
        if self.nodes < self.available:
            out.append(f"{self.available - self.nodes} of {self.available} nodes idle: "
                       + ", ".join(f"{k} nodes {'no layout fits' if isinstance(v, str) else f'{v:.4g} s/step'}"
                                    for k, v in self.tried))
        if self.dropped_pins:
            out.append(f"pins dropped (no plan fits with them): {', '.join(self.dropped_pins)}")
        return out


def _layout(d: dict) -> str:
    p = d["parallel"]
    return (f"dp {p['dp']} tp {p['tp']} pp {p['pp']}" + (f" cp {p['cp']}" if p.get("cp", 1) > 1 else "")
            + (f" ep {p['ep']}" if p.get("ep", 1) > 1 else "") + f", {d['micro_batches']} micro-batches, zero {d['zero']}")


def summary(plan) -> dict:
    return {"parallel": dict(plan["parallel"]), "micro_batches": plan["pipeline"].get("micro_batches", 1),
            "zero": plan["zero"], "devices": plan["devices"], "step_time_s": plan["predicted"]["step_time_s"]}


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
    parameter so the worker passes its own module).  Raises SappError in one line when no plan fits,
    saying what would."""
    if search is None:
        from .api import search
    gb = int(plan["model"]["global_batch"])
    settings = plan["settings"]
    pins = dict(plan["constraints"] or {})
    if pins.get("target") == "torchtitan@0.2.2" and settings.get("runtime") == "torchtitan":
        # saved when "torchtitan" named 0.2.2's profile (its SDPA); "torchtitan" is 0.3's now
        settings = {**settings, "runtime": "torchtitan-0.2.2"}
    t0 = time.perf_counter()
    if graph is None:               # captured once for every candidate
        from . import api
        if isinstance(model, str):
            _, _, _, graph, _ = api.capture_spec(model)
        elif not hasattr(model, "nodes"):
            graph, _ = api.capture_graph(model)
    best, tried, dropped, last_err = None, [], [], None
    for nodes in ([cluster.nodes] if exact else candidates(cluster.nodes, cluster.gpus_per_node, gb,
                                                                   len(getattr(graph, "blocks", None) or ()))):
        cl = cluster.replace(nodes=nodes)
        got, why, drop = _search_keeping_pins(search, model, cl, gb, settings, pins, graph)
        tried.append((nodes, got["predicted"]["step_time_s"] if got is not None else why))
        if got is not None and (best is None or got["predicted"]["step_time_s"] < best[0]["predicted"]["step_time_s"]):
            best, dropped = (got, nodes), drop
        last_err = why or last_err
    search_s = time.perf_counter() - t0
    if best is None:
        raise SappError(f"no plan fits {cluster.devices} devices or a few nodes fewer ({last_err}); "
                        f"the job needs more nodes than {cluster.nodes}, or a smaller global batch than {gb}")
    new, nodes = best
    return Replan(plan=new, old=summary(plan), new=summary(new), nodes=nodes, available=cluster.nodes,
                  dropped_pins=dropped, search_s=search_s, tried=tried)


def _search_keeping_pins(search, model, cl, gb, settings, pins, graph):
    """(plan, None, dropped pins) or (None, why, ...): with every pin, then dropping device-count pins
    one at a time, then any pin."""
    order = [k for k in DEVICE_PINS if k in pins] + sorted(k for k in pins if k not in DEVICE_PINS)
    kept, dropped, why = dict(pins), [], None
    while True:
        try:
            # every setting the plan was priced with (plan_build's "settings" section)
            p = search(model, cl, global_batch=gb, constraints=kept or None, precision=settings.get("precision"),
                       runtime=settings.get("runtime"), optimizer=settings.get("optimizer"),
                       grad_fp32=bool(settings.get("grad_fp32")), graph=graph)
            return p, None, dropped
        except SappError as e:
            why = str(e).splitlines()[0][:200]
        if not order:
            return None, why, dropped
        k = order.pop(0)
        dropped.append(f"{k}={kept.pop(k)}")
