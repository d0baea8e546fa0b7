"""What the manifest reads a plan's stages and split layers by, without the manifest's re-pricing
(which imports sapp.api): shared by the emitter's manifest (manifest.py) and the search's runnable
check (sapp/emit/runnable.py), so both compare the same things."""
from __future__ import annotations

from torch import nn

from ..tp import conv1d


def _stage_blocks(mod, blocks) -> list:
    """The blocks a stage runs as a plan lists them: the outermost ones, sorted (a stage's set of
    blocks; the plan lists them in the order capture met them).  `blocks` (capture's candidates,
    capture/blocks.container_children) also names blocks nested in blocks (T5's
    `encoder.block.0.layer.0`); capture assigns each operator to its outermost block, and the plan's
    stages list those.  A traced stage module holds a block's module also where it only reads one of
    its weights (get_attr) or runs copies of its position-only ops (stage_local.py: Llama 4's complex
    rotary table cast in `layers.0.self_attn`, GraniteMoeHybrid's `rotary_embs.0`): that stage does
    not run the block."""
    names = dict(mod.named_modules())
    traced = bool(_graphs(mod))
    present = [b for b in blocks if b in names and (not traced or _runs(names[b]))]
    return sorted(b for b in present if not any(b.startswith(o + ".") for o in present))


def stage_candidates(prog) -> list:
    """The names a stage's blocks are read by: capture's block candidates (the children of the
    model's containers), or, in a model without containers (a flat CNN, an LSTM language model),
    the search's pipeline units that name modules (pipeline/units.split_units: the modules that start
    a key operator; its "prologue" is no module and is not compared).

    A container child the plan's stages list nowhere while they list others is glue to the plan: a
    block called again after other blocks ran (HRM's L and H stacks alternating over their cycles,
    pipeline/units._merge_reused) is one glue unit with everything between its calls, never a stage
    start nor a stage's listed block; its module runs in whichever stage holds that glue.  Reading it
    as a block would make every such plan differ from what is emitted ("stages: plan ['pre.1'],
    emitted ['high.0', ..., 'pre.1']"), so it is left out here, alike on both sides."""
    plan = getattr(prog, "plan", None)
    stages = (plan.pipeline.get("stages") or []) if plan is not None else []
    listed = {b for st in stages for b in st.get("blocks") or []}
    if prog.stage_block_list:
        kept = [b for b in prog.stage_block_list if b in listed or any(b.startswith(o + ".") for o in listed)]
        return kept if kept else prog.stage_block_list
    return sorted(b for b in listed if b in (prog.full_modules or {}))


def _graphs(mod) -> list:
    from torch import fx
    return [g for g in (getattr(m, "graph", None) for m in mod.modules()) if isinstance(g, fx.Graph)]


def _runs(mod) -> bool:
    """Whether a module of a traced stage runs an operator of its own: any op of its graphs (the
    stage's InterpreterModules) that is not a stage-local copy.  (A module that only holds a buffer
    other ops read has no graph.)  In an eager stage every module present runs."""
    from ..pp.stage_local import COPY
    return any(n.op in ("call_function", "call_method") and not n.meta.get(COPY) for g in _graphs(mod) for n in g.nodes)


def priced_tp(plan, types: dict) -> dict:
    """{module: style} of the layers whose weights the plan's operators split over the tp level -- what
    the cost model priced as sharded, whether or not tp_modules names them: a Linear split on its
    output features (n) is colwise, on its input features (k) rowwise; an Embedding split on the
    vocabulary (v) is vocab, on the hidden size (h) colwise."""
    if plan.parallel["tp"] <= 1:
        return {}
    roles = list((plan._d.get("mesh") or {}).get("roles") or [])
    if "tp" not in roles:
        return {}
    lv = roles.index("tp")
    out = {}
    for op in (plan._d.get("operators") or {}).values():
        split, mod = op.get("split") or [], op.get("module")
        d = split[lv] if lv < len(split) else None
        t = types.get(mod)
        if d is None or t is None:
            continue
        if (issubclass(t, nn.Linear) or conv1d.is_conv1d_class(t)) and op.get("kind") == "matmul":
            style = "colwise" if d.startswith("n") else ("rowwise" if d.startswith("k") else None)
        elif issubclass(t, nn.Embedding) and op.get("kind") == "embedding":
            style = "vocab" if d == "v" else ("colwise" if d == "h" else None)
        else:
            style = None
        if style:
            out.setdefault(mod, style)
    return out
