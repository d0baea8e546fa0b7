"""The linears of an operator graph that tensor parallelism may split, read by both the tensor-parallel
layout (tp_layout.py) and the sequence-parallel one (sp_layout.py).  Pure Python over the OpGraph."""
from __future__ import annotations


def linear_weight(node):
    """The weight operand of a linear `x[..., k] . W[n, k]` (a 2-D parameter over (n, k)), or None.
    `addmm(bias, x, W[k, n])` is a linear too: HF's Conv1D (GPT-2's layers) stores its weight
    transposed, and the emitter splits it along the same n / k (sapp/emit/tp/conv1d.py)."""
    if node.kind != "matmul" or not node.module:
        return None
    for op in node.operands:
        if op.param is not None and (tuple(op.dims) == ("n", "k") or (
                tuple(op.dims) == ("k", "n") and str(node.target).startswith("aten.addmm"))):
            return op
    return None


def param_uses(graph) -> dict:
    uses = {}
    for node in graph.nodes.values():
        for p in set(node.params):
            uses[p] = uses.get(p, 0) + 1
    return uses


def nested_holders(graph) -> set:
    """Modules with a sub-module that holds parameters of its own (an HF embedding with a norm inside):
    DTensor's Linear / Embedding styles cannot split such a module, so the emitter could not run what
    the search would price."""
    holders = {node.module for node in graph.nodes.values() if node.module and node.params}
    out = set()
    for m in holders:
        parts = m.split(".")
        out.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return out


def tied_tables(graph) -> list:
    """[(param, [embedding nodes], [linear nodes])] for each weight shared by an embedding table and
    linears over the same (vocabulary, hidden) layout (GPT-2's wte / lm_head, BERT's word embedding /
    decoder, T5's shared table): Megatron's layout splits such a table by vocabulary in both uses,
    rows of one weight, so the two stay one parameter.  Every user must be a vocabulary-split-able
    embedding or an (n, k) linear of a module without parameter-holding sub-modules."""
    nested = nested_holders(graph)
    users = {}
    for name, node in graph.nodes.items():
        for p in set(node.params):
            users.setdefault(p, []).append(name)
    out = []
    for p, names in users.items():
        if len(names) < 2:
            continue
        embs, heads = [], []
        for n in names:
            node = graph.nodes[n]
            w = linear_weight(node)
            if not node.module or node.module in nested:
                break
            if node.kind == "embedding" and any(d.name == "v" for d in node.dims):
                embs.append(n)
            elif w is not None and w.param == p and tuple(w.dims) == ("n", "k"):
                heads.append(n)
            else:
                break
        else:
            if embs and heads:
                out.append((p, embs, heads))
    return out


def linears(graph) -> list:
    """Linears whose weight no other op reads.  A weight tied to another module (BERT's decoder =
    the word embedding) is not split: splitting one of its users would untie the two; nor is a
    linear module holding sub-modules with parameters (`nested_holders`), nor a matmul whose weight
    is not its module's own (`own_weight`)."""
    uses = param_uses(graph)
    nested = nested_holders(graph)
    return [n for n, node in graph.nodes.items()
            if (w := linear_weight(node)) is not None and uses.get(w.param) == 1 and node.module not in nested
            and own_weight(node, w)]


def own_weight(node, w) -> bool:
    """Whether the linear's weight is its module's own `weight`: the emitter splits a layer through
    the module holding it (DTensor's styles shard `module.weight` of a Linear, Embedding or Conv1D).
    nn.MultiheadAttention applies `in_proj_weight` and `out_proj.weight` in its own forward: splitting
    "the module" there would split nothing, so such a matmul is no linear tensor parallelism may cut."""
    return w.param == f"{node.module}.weight"


# ops a vocab-split lookup's rows may pass through inside their own module before its output is summed
# over tp (a Partial DTensor there): a cast, a view, a product with a 0-d factor (Gemma's embed_scale)
_SCALES = {"aten.mul.Tensor", "aten.div.Tensor", "aten.mul.Scalar", "aten.div.Scalar"}
_KEEPS = {"aten._to_copy.default", "aten.view.default", "aten._unsafe_view.default", "aten.alias.default",
          "aten.clone.default"}


def lookup_tail(graph, name: str, consumers: dict = None) -> str:
    """'' when the embedding node `name`'s rows leave its module as looked up (scaled, cast), else the
    first other op its own forward applies to them: T5Gemma2's `rows[ids == eoi] = self.eoi_embedding`
    (aten.index_put), which under a vocab split writes a replicated value into a tensor summed over tp
    (DTensor refuses it in the backward: 'mixed torch.Tensor and DTensor')."""
    consumers = consumers if consumers is not None else graph.consumers()
    mod, todo, seen = graph.nodes[name].module, [name], set()
    while todo:
        n = todo.pop()
        for c, i in consumers.get(n, ()):
            node = graph.nodes[c]
            if c in seen or node.module != mod:
                continue
            seen.add(c)
            t = str(node.target)
            others = [o for j, o in enumerate(node.operands) if j != i]
            if t in _KEEPS or (t in _SCALES and all(len(o.shape) == 0 for o in others)):
                todo.append(c)
                continue
            return t
    return ""
