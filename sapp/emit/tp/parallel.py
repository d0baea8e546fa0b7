"""Device mesh and tensor parallelism for one module (a whole model or one pipeline stage).

Mapping (plan feature -> torch runtime):
  mesh            init_device_mesh(type, (pp, dp, tp), ("pp", "dp", "tp")); rank = ((pp_i*dp)+dp_i)*tp+tp_i
  tp_modules      DTensor parallelize_module with ColwiseParallel / RowwiseParallel on mesh["tp"]
  bf16-mixed      autocast(bf16) around forward + loss.  Pipeline stages: fp32 between stages
  data parallel   sapp/emit/dp/wrap.py (DDP, the flat all-reduce, FSDP2 per ZeRO stage)
Pipeline stages are traced (torch.export) and hold InterpreterModules instead of nn.Linear: tensor
parallelism puts a copy of the original layer back before sharding it (PP x TP)."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..dp.wrap import _unflatten_into
from . import conv1d, dtensor_local, fused, mha, sp


def build_mesh(device: torch.device, pp: int, dp: int, tp: int):
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh(device.type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))


def coords(rank: int, pp: int, dp: int, tp: int) -> tuple:
    """(pp_i, dp_i, tp_i) of a rank: rank = ((pp_i * dp) + dp_i) * tp + tp_i."""
    return rank // (dp * tp), (rank // tp) % dp, rank % tp


def _partnered(name: str, styles: dict, other: str) -> bool:
    """A colwise layer feeds a rowwise one in the same parent (qkv->proj, fc1->fc2): its output can
    stay sharded.  Otherwise (an output head) it must come back Replicate."""
    parent = name.rpartition(".")[0]
    return any(n.rpartition(".")[0] == parent and s == other for n, s in styles.items() if n != name)


def _restore_leaf(module: nn.Module, name: str, original: nn.Module) -> nn.Module:
    """A pipeline stage (torch.export + unflatten) holds an InterpreterModule where the model had an
    nn.Linear/Embedding; DTensor only shards the real class, so put a copy of the original layer back
    with the stage's current weights (same call signature: one tensor in, one out)."""
    import copy
    leaf = copy.deepcopy(original)
    stand_in = module.get_submodule(name)
    state = stand_in.state_dict()
    if all(state[k].shape == v.shape for k, v in leaf.state_dict().items() if k in state):
        leaf.load_state_dict(state)
        # the stage's own parameter objects, not copies: a weight the stage also keeps elsewhere (a
        # tied table's stand-in holder) stays the same object, which `retie` then keeps tied
        for k, p in stand_in.named_parameters(recurse=False):
            if k in leaf._parameters:
                leaf._parameters[k] = p
    # else the stage was traced with a local-shape stand-in (see local_layers): the original's
    # values are the stage's, as nothing has trained yet
    parent, _, child = name.rpartition(".")
    setattr(module.get_submodule(parent) if parent else module, child, leaf)
    return leaf


def _leaf_type(m) -> bool:
    return isinstance(m, (nn.Linear, nn.Embedding)) or conv1d.is_conv1d(m)


def _tp_leaf(module, mods, name, originals):
    """The Linear/Embedding/Conv1D at `name` in `module` (a pipeline stage's traced stand-in replaced
    by a copy of the original layer), or None when it is another layer type."""
    orig = (originals or {}).get(name)
    if not _leaf_type(mods[name]) and _leaf_type(orig):
        mods[name] = _restore_leaf(module, name, orig)
    return mods[name] if _splittable(mods[name]) else None


def _splittable(m) -> bool:
    """A Linear / Embedding DTensor's styles can split: one holding sub-modules with parameters of
    their own (an HF embedding subclass with a scale or a projection inside) makes DTensor register
    dotted parameter names (KeyError "parameter name can't contain '.'").  HF's Conv1D too, with
    styles of its own (sapp/emit/tp/conv1d.py)."""
    return conv1d.is_conv1d(m) or (isinstance(m, (nn.Linear, nn.Embedding)) and not any(
        True for c in m.children() for _ in c.parameters()))


def _derived_styles(module, mods, styles, groups, originals, notes, dry: bool = False, sp_sec=None):
    """Styles of a plan whose layout came from the graph (sapp/search/tp_layout.py): a group (one
    region: column-split openers, row-split closers) is sharded whole or, when one of its layers is
    not a Linear/Embedding DTensor can split, not at all (a half-sharded region computes wrong
    values)."""
    from torch.distributed.tensor import Replicate
    # torch's Colwise/RowwiseParallel, subclassed to also split HF's Conv1D on its [in, out] layout
    ColwiseParallel, RowwiseParallel = conv1d.styles()      # noqa: N806 - torch's class names
    plan = {}
    # a weight is tied when two module objects hold it; one module reachable by two paths (Performer
    # keeps its layers under `net` and under `proj_updater.instance` too) is one module, sharded once
    owners = {}
    for n, p in module.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), set()).add(id(module.get_submodule(n.rpartition(".")[0])))
    for group in groups:
        # a bare Module in a pipeline stage only holds a tied weight another stage's layer computes
        # with (torch's pipeline copies it into each stage holding the weight): re-tied, not split
        # nn.MultiheadAttention split by heads is no DTensor style (sapp/emit/tp/mha.py, apply_tp)
        here = [n for n in group if n in mods and n in styles and type(mods[n]) is not nn.Module
                and styles[n] != "heads"]
        if not here:
            continue
        leaves = {n: (mods[n] if _splittable(mods[n]) else None) if dry
                  else _tp_leaf(module, mods, n, originals) for n in here}
        odd = [n for n, leaf in leaves.items() if leaf is None]
        tied = [n for n, leaf in leaves.items() if leaf is not None and len(owners.get(id(leaf.weight), ())) > 1
                and not _rows_of_tied_table(leaf, styles[n])]
        if tied:
            if notes is not None:
                notes.append(f"tp region {here[0]} .. runs replicated: {tied[0]}'s weight is tied to another module")
            continue
        if odd:
            if notes is not None:
                notes.append(f"tp region {here[0]} .. runs replicated: {odd[0]} is a {type(mods[odd[0]]).__name__}, "
                             f"and DTensor splits only Linear and Embedding (without sub-modules' parameters)")
            continue
        for n in here:
            style = styles[n]
            # sequence parallelism (sapp/emit/tp/sp.py) moves an entry's gather / an exit's reduction here
            kw = sp.adjust(n, style, sp_sec or {}, {})
            if dry:
                plan[n] = style
            elif style == "colwise":              # output stays split for the ops up to the closer
                plan[n] = ColwiseParallel(**kw)
            elif style == "colwise_gather":     # a lone column split (LM head): output gathered
                plan[n] = ColwiseParallel(**dict({"output_layouts": Replicate()}, **kw))
            elif style == "rowwise":            # input arrives split from the region's openers
                plan[n] = RowwiseParallel(**kw)
            else:                               # vocab: embedding rows split, partial sums reduced
                plan[n] = RowwiseParallel(**dict({"input_layouts": Replicate()}, **kw))
    return _whole_ties(module, plan, originals, notes, named=styles)


def _rows_of_tied_table(leaf, style: str) -> bool:
    """A tied table's use that splits the weight's rows (dim 0): the embedding by vocabulary, or the
    nn.Linear head column-wise.  All uses so split keep one weight, re-tied after (`retie`)."""
    return (style == "vocab" and isinstance(leaf, nn.Embedding)) or (
        style == "colwise_gather" and type(leaf) is nn.Linear)


def tied_holders(module: nn.Module, originals: dict = None) -> dict:
    """{key: [(module name, attribute)]} of the parameters two or more modules hold.  In a pipeline
    stage (`originals`: the whole model's modules) the ties are the model's: torch's pipeline gives
    a stage holding two names of one weight two objects (a layer's and a bare holder's)."""
    out = {}
    for n, p in module.named_parameters(remove_duplicate=False):
        mod, _, attr = n.rpartition(".")
        out.setdefault(id(p), []).append((mod, attr))
    if originals:
        present = {h for hs in out.values() for h in hs}
        by_weight = {}
        for mname, m in originals.items():
            for attr, p in m.named_parameters(recurse=False):
                if (mname, attr) in present:
                    by_weight.setdefault(id(p), []).append((mname, attr))
        out = by_weight
    return {k: v for k, v in out.items() if len({id(module.get_submodule(m)) for m, _ in v}) > 1}


def _whole_ties(module, plan: dict, originals, notes, named=None) -> dict:
    """A tied weight is split in every module computing with it or in none: one use split alone would
    untie them (two weights stepping apart: silently wrong).  A searched layout names every use the
    graph has (tp_layout's tied tables, `named`: the layout's styles); a module the layout does not
    name only keeps an alias (BERT's cls.predictions.bias is its decoder's bias, BART's `shared` table
    its embeddings') and is re-tied to the split weight (`retie`).  A hand-written layout (`named`
    None) must name every Linear / Embedding holding the weight."""
    for holders in tied_holders(module, originals).values():
        names = {m for m, _ in holders}
        inside = names & set(plan)
        computing = ({m for m in names if _leaf_type(module.get_submodule(m))} if named is None
                     else {m for m in names & set(named) if type(module.get_submodule(m)) is not nn.Module})
        if inside and not computing <= inside:
            for n in inside:
                plan.pop(n)
            if notes is not None:
                notes.append(f"tp: {sorted(inside)[0]} runs replicated: its weight is tied to "
                             f"{sorted(computing - inside)[0]}, which is not split by rows")
    return plan


def retie(module: nn.Module, holders: dict) -> None:
    """After parallelize_module: each holder of a weight split by rows in all its uses (and each
    module keeping an alias of it) gets the first holder's DTensor parameter (parallelize_module made
    one per module; all are Shard(0) on the tp mesh, the same values), so the uses stay one parameter
    with one gradient."""
    for pairs in holders.values():
        first = getattr(module.get_submodule(pairs[0][0]), pairs[0][1])
        for m, attr in pairs[1:]:
            sub = module.get_submodule(m)
            if getattr(sub, attr) is not first:
                setattr(sub, attr, first)


def local_layers(model: nn.Module, styles: dict, tp: int, groups) -> dict:
    """Stand-ins with this rank's shapes for the layers a derived layout splits with a sharded side
    ({name: module}), for tracing a pipeline: torch.export bakes shapes read in forward into the
    graph (HF's repeat_kv expands to the global head count), so a stage traced on full-width layers
    cannot run on split ones.  Traced on these, every later op sees local head counts; emit then
    puts the real layer back and shards it (apply_tp).  Hand-written plans (no groups): none."""
    if not groups or tp <= 1:
        return {}
    mods = dict(model.named_modules())
    plan = _derived_styles(model, dict(mods), styles, groups, None, None, dry=True)
    out = {}
    for name, style in plan.items():
        lin = mods[name]
        if conv1d.is_conv1d(lin):           # weight [in, out]: nx in, nf out features
            if style in ("colwise", "rowwise"):
                k, n = (lin.nx, lin.nf // tp) if style == "colwise" else (lin.nx // tp, lin.nf)
                out[name] = conv1d.resized(lin, k, n)
        elif style == "colwise":
            out[name] = _resized(lin, lin.in_features, lin.out_features // tp)
        elif style == "rowwise":
            out[name] = _resized(lin, lin.in_features // tp, lin.out_features)
    return out


def _resized(lin: nn.Linear, k: int, n: int) -> nn.Linear:
    """A copy of `lin` with an (n, k) weight (and n bias), of its own class: a subclass's forward
    (Falcon's `x @ self.weight.T`) runs the same ops as the layer it stands in for, so the shape
    audit's second capture lines up with the first op for op."""
    import copy
    new = copy.copy(lin)                       # the attributes, without copying the weights
    new._parameters = dict(lin._parameters)
    new._buffers, new._modules = dict(lin._buffers), dict(lin._modules)
    w = lin.weight
    new.weight = nn.Parameter(torch.zeros((n, k), dtype=w.dtype, device=w.device), requires_grad=w.requires_grad)
    if lin.bias is not None:
        new.bias = nn.Parameter(torch.zeros(n, dtype=w.dtype, device=w.device))
    new.in_features, new.out_features = k, n
    return new


def apply_tp(module: nn.Module, styles: dict, tp_mesh, notes: list = None, originals: dict = None,
             groups: list = None, sp_sec: dict = None, parts: dict = None, permuted: dict = None) -> list:
    """Shard the named Linear/Embedding layers present in `module`; returns the names sharded.
    `groups` (plans from sapp's search): the layout's regions, each sharded whole or not at all, with
    the styles meaning exactly what tp_layout derived.  Without groups (hand-written plans) a colwise
    layer keeps its output split when a rowwise sibling follows it (same parent), and other layer
    types stay replicated, with a note: still correct, only slower.  HF's Conv1D (GPT-2) is split
    like a Linear on its own [in, out] layout (sapp/emit/tp/conv1d.py).
    `originals`: the un-split model's modules by name (pipeline stages hold traced stand-ins).
    `parts`: {module: piece sizes} of fused projections split by heads: their rows are put in rank
    order before sharding (sapp/emit/tp/fused.py); `permuted` (a dict) receives their parameters."""
    from torch.distributed.tensor import Replicate
    ColwiseParallel, RowwiseParallel = conv1d.styles()      # noqa: N806 - torch's, also for Conv1D
    mods = dict(module.named_modules())
    if groups is not None:
        if sp_sec:      # cuts before the blocks moved to the blocks' input (sapp/emit/tp/sp_entry.py)
            sp_sec = sp.relayout_noted(sp_sec, module, notes)
        plan = _derived_styles(module, mods, styles, groups, originals, notes, sp_sec=sp_sec)
        heads = mha.apply(module, sorted(n for n in mods if styles.get(n) == "heads"), tp_mesh, permuted)
        mine = {n: parts[n] for n in plan if n in (parts or {})}
        cols = {n for n in mine if styles[n] == "rowwise"}     # a closer of repeated key heads' queries
        for n, sizes in mine.items():       # before DTensor splits the rows: each rank's block, its heads
            fused.permute_(mods[n], sizes, tp_mesh.size(), inputs=n in cols)
        if permuted is not None:
            permuted.update(fused.entries(mine, mods.get, tp_mesh.size(), cols))
        if plan:
            _parallelize_tied(module, tp_mesh, plan, originals)
        if sp_sec:      # sequence parallelism between the regions (plan tp_layout.sp)
            sp.apply(module, sp_sec, tp_mesh, {n: styles[n] for n in plan}, notes, originals)
        return sorted(set(plan) | set(heads))
    present = {}
    for n, s in sorted(styles.items()):
        if n not in mods:
            continue
        if _tp_leaf(module, mods, n, originals) is None:
            if notes is not None:
                notes.append(f"tp_modules[{n}] is a {type(mods[n]).__name__}; DTensor splits only Linear, "
                             f"Embedding and HF's Conv1D, so it runs replicated")
            continue
        present[n] = "rowwise" if s == "vocab" else ("colwise" if s == "colwise_gather" else s)
    plan = {}
    for name, style in present.items():
        if style == "colwise":
            keep = _partnered(name, present, "rowwise") and styles[name] != "colwise_gather"
            plan[name] = ColwiseParallel() if keep else ColwiseParallel(output_layouts=Replicate())
        else:
            fed = _partnered(name, present, "colwise")
            if isinstance(mods[name], nn.Embedding):
                plan[name] = RowwiseParallel(input_layouts=Replicate())
            else:
                plan[name] = RowwiseParallel() if fed else RowwiseParallel(input_layouts=Replicate())
    # a hand-written layout naming one use of a tied weight runs it replicated (the manifest then
    # refuses the plan): split alone it would step apart from its other use
    plan = _whole_ties(module, plan, originals, notes)
    if plan:
        _parallelize_tied(module, tp_mesh, plan, originals)
    return sorted(plan)


def _parallelize_tied(module, tp_mesh, plan: dict, originals) -> None:
    holders = {k: sorted(v, key=lambda h: h[0] not in plan) for k, v in tied_holders(module, originals).items()
               if any(m in plan for m, _ in v)}
    _parallelize(module, tp_mesh, plan)
    retie(module, holders)


def _parallelize(module, tp_mesh, plan: dict) -> None:
    """parallelize_module, the layers' outputs handed on as local tensors the model may modify in
    place (sapp/emit/tp/dtensor_local.py)."""
    from torch.distributed.tensor.parallel import parallelize_module
    dtensor_local.hand_back_local(module, plan)
    parallelize_module(module, tp_mesh, plan)
    dtensor_local.register(module, plan)


class TPPartialGrads:
    """After backward: the gradients of replicated parameters that a sharded region applies to this
    rank's part only (shape_audit.partial_params: a q_norm over head_dim on this rank's heads) are
    summed over the tp group, so every tp rank steps the same full gradient, as one process does.
    One flat all-reduce; under FSDP a gradient is this rank's dp shard, the same layout on every tp
    rank, so its local part is summed."""

    def __init__(self, params, group):
        self.params = [p for p in params if p.requires_grad]
        self.group = group

    def __call__(self):
        grads = [(p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad)
                 for p in self.params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.group)
        _unflatten_into(flat, grads)


__all__ = ["build_mesh", "coords", "apply_tp", "local_layers", "TPPartialGrads"]
