"""Plans with Megatron's tensor-parallel layout forced (every region sharded), through the joint
search and build_plan exactly as sapp.search runs them: on the tiny zoo models the sharding search
never judges tensor parallelism worth it, so the emit tests of sequence parallelism force it."""
from __future__ import annotations


def megatron_search_fn(graph, mesh, cluster, settings, level_roles=None, **kw):
    """The tp level of sapp.api's search_fn with every linear cut (emittable keeps the valid regions
    and a lone column split for the head)."""
    from sapp.search import tp_layout
    res = tp_layout.search_fn(graph, mesh, cluster, settings, level_roles=level_roles, **kw)
    if len(mesh.levels) != 1:
        return res
    tp = mesh.levels[0].size
    choice = {n: "n" for n in tp_layout.linears(graph)}
    strategies, _, _ = tp_layout.emittable(graph, choice, tp)
    return tp_layout._Result({n: (d,) for n, d in strategies.items()}, "megatron", res)


def forced_plan(model_name, *, world, constraints, global_batch=8, model_args=None, precision="fp32", cluster=None):
    import sapp
    import sapp.models as models
    from sapp.api import build_plan, capture_graph
    from sapp.search.constraints import Constraints
    from sapp.costmodel import CostSettings
    from sapp.search.joint import joint_search
    model = models.get(model_name, device="meta", **(model_args or {}))
    graph, _ = capture_graph(model)
    cl = sapp.Cluster.parse(cluster or f"cpu:gpus={world}")
    cons = Constraints.from_dict(constraints)
    settings = CostSettings(precision=precision)
    res = joint_search(graph, cl, global_batch=global_batch, constraints=cons, settings=settings,
                       search_fn=megatron_search_fn)
    return build_plan(graph, cl, res, name=model_name, global_batch=global_batch, constraints=cons,
                      settings=settings)
