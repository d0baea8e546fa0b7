"""The operator graph every stage after capture works on.  Pure Python: no torch here.

Each operator is described by an *iteration space* (einsum style): named dims with sizes, and for
every operand and for the output, which op dim each tensor axis runs over.  Sharding an op dim `d`
across a mesh axis then means, uniformly for every op kind:
  - compute is divided by the axis size;
  - an operand (activation or parameter) that has `d` is sharded on that axis, one that lacks it is
    replicated on it;
  - the output is sharded where it has `d` and Partial (needs a sum) where it lacks it (`d` is a
    contraction dim, e.g. `k` of a matmul or the vocabulary of an embedding lookup).
Dims marked `splittable=False` (softmax/normalisation axes, conv spatial axes) are never split.  Dims
marked `batch=True` follow the data batch (they are what data parallelism splits).

`saves` lists what the op keeps for its backward pass: "in<i>" (operand i, counted once per producer
even if several consumers save it; parameter operands are not activations), "out" (its own output) or
"mask" (a 1-byte-per-element mask the size of its output, e.g. dropout).

Dim names capture gives and the search and emitter rely on (sapp/capture/ops.py):
  linear / matmul x[..., k] W[n, k]       leading `b0, b1, ...` (the data batch's `batch=True`), `n` out, `k` contraction
  batched matmul A[.., m, k] B[.., k, n]  `b0..`, `m`, `n`, `k`
  embedding W[v, h], ids [b0, b1]         `b0, b1`, `v` vocabulary (a contraction: split, the output is Partial), `h`
  grouped expert GEMM x[R, k] W[E, k, n]  `b0` routed rows (tokens x top-k), `n`, `k`, `e` experts; FLOPs 2 R k n
  conv x[N, C, H, W] w[O, C, kh, kw]      `b0`, `o`, `c` (contraction), spatial dims not splittable
  LSTM / GRU / RNN unit                   `b0`, `t`, `h`, `i` (only `b0` splits)
  attention (SDPA)                        `b0, b1` batch and heads, `m` queries, `n` keys, `k` / `j` head dims
  gather / index / sort / topk / cumsum   output axes `a0, ...`; the indexed, ranked or scanned axis whole unless
                                          it carries the data batch
  element-wise / norm / softmax / view    output axes `a0, a1, ...`; normalised and softmax axes not splittable
  loss                                    `b0..` per-sample dims, `v` classes
The zoo GPT's `qkv` output rows are grouped per head as [q|k|v], so a column shard holds whole heads.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
    "int8": 1, "uint8": 1, "bool": 1, "complex32": 4, "complex64": 8, "complex128": 16,
}

OP_KINDS = (
    "input", "matmul", "conv", "embedding", "attention", "elementwise", "norm", "softmax", "dropout",
    "reduction", "view", "pool", "loss", "other",
)
# Operators whose strategy is searched first (the "key" operators); the rest follow by propagation.
KEY_KINDS = ("matmul", "conv", "embedding", "attention", "loss")


class _Sized:
    """numel / nbytes of anything with `shape` and `dtype`."""

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES.get(self.dtype, 4)


@dataclass(frozen=True)
class Dim:
    name: str
    size: int
    splittable: bool = True
    batch: bool = False


@dataclass(frozen=True)
class Operand(_Sized):
    """One input of an op.  Exactly one of `producer` (activation from another node) or `param`
    (a parameter/buffer qualname) is set; constants have neither and are ignored by the cost model."""
    shape: tuple
    dtype: str
    dims: tuple                  # op dim name (or None) per tensor axis
    producer: str | None = None
    param: str | None = None


@dataclass(frozen=True)
class TensorSpec(_Sized):
    shape: tuple
    dtype: str
    dims: tuple                  # op dim name (or None) per axis


@dataclass
class OpNode:
    name: str                    # unique (the fx node name)
    kind: str                    # one of OP_KINDS
    target: str                  # e.g. "aten.mm.default"
    dims: tuple                  # tuple[Dim], the iteration space
    operands: tuple              # tuple[Operand]
    out: TensorSpec
    flops: float = 0.0           # forward FLOPs at the captured batch
    bytes: float = 0.0           # forward bytes read + written at the captured dtypes
    saves: tuple = ()            # what backward keeps: "in<i>", "out", "mask"
    module: str = ""             # qualname of the innermost nn.Module it came from
    block: str | None = None     # qualname of the repeated block it belongs to (e.g. "layers.3")
    extra: dict = field(default_factory=dict)   # kind-specific facts (e.g. softmax axis, eps)

    def dim(self, name: str) -> Dim:
        for d in self.dims:
            if d.name == name:
                return d
        raise KeyError(name)

    @property
    def params(self) -> tuple:
        return tuple(o.param for o in self.operands if o.param is not None)

    @property
    def producers(self) -> tuple:
        return tuple(o.producer for o in self.operands if o.producer is not None)


@dataclass(frozen=True)
class ParamInfo(_Sized):
    name: str
    shape: tuple
    dtype: str
    module: str = ""
    trainable: bool = True
    sparse_grad: bool = False    # embedding with sparse=True (host placement candidates)


@dataclass
class OpGraph:
    """Nodes in topological order.  `blocks` maps a block qualname to its node names in order;
    `block_groups` lists groups of structurally identical blocks (searched once, strategy shared)."""
    name: str
    nodes: dict                       # name -> OpNode, insertion = topological order
    params: dict                      # qualname -> ParamInfo
    outputs: tuple = ()               # names of nodes whose value is the model output / loss
    batch_size: int = 1               # the batch the graph was captured at
    blocks: dict = field(default_factory=dict)       # block qualname -> [node names]
    block_groups: list = field(default_factory=list)  # [[block qualname, ...], ...]
    meta: dict = field(default_factory=dict)          # model facts (config, seq len, ...)

    # ---- queries -------------------------------------------------------------------------------
    def __len__(self):
        return len(self.nodes)

    def __iter__(self):
        return iter(self.nodes.values())

    def consumers(self) -> dict:
        """name -> list of (consumer name, operand index)."""
        out = {n: [] for n in self.nodes}
        for node in self.nodes.values():
            for i, op in enumerate(node.operands):
                if op.producer is not None:
                    out[op.producer].append((node.name, i))
        return out

    def edges(self):
        """(producer, consumer, operand index) for every activation edge, in a stable order."""
        for node in self.nodes.values():
            for i, op in enumerate(node.operands):
                if op.producer is not None:
                    yield op.producer, node.name, i

    def total_flops(self) -> float:
        return sum(n.flops for n in self.nodes.values())

    def param_count(self) -> int:
        return sum(p.numel for p in self.params.values() if p.trainable)

    def to_networkx(self):
        import networkx as nx
        g = nx.DiGraph()
        for n in self.nodes.values():
            g.add_node(n.name, kind=n.kind, target=n.target, shape=n.out.shape, flops=n.flops,
                       module=n.module, block=n.block, params=n.params)
        for u, v, i in self.edges():
            g.add_edge(u, v, operand=i, shape=self.nodes[v].operands[i].shape)
        return g

    def flops_per_sample(self) -> float:
        """Forward FLOPs of one sample (the graph at batch 1): what a plan records as
        model.flops_per_sample and `sapp run` checks against the model it captures."""
        return self.rebatch(1).total_flops()

    def fingerprint(self) -> str:
        """Structure hash, independent of the batch size, so a plan can be checked against a model."""
        h = hashlib.sha256()
        for n in self.nodes.values():
            dims = [(d.name, "B" if d.batch else d.size, d.splittable) for d in n.dims]
            h.update(json.dumps([n.kind, n.target, dims, list(n.params)], separators=(",", ":")).encode())
        for p in sorted(self.params):
            h.update(json.dumps([p, list(self.params[p].shape)]).encode())
        return h.hexdigest()[:16]

    # ---- transformations -----------------------------------------------------------------------
    def rebatch(self, batch: int) -> "OpGraph":
        """The same graph at another batch size: batch dims, shapes, FLOPs and bytes scale linearly
        (every op is linear in the batch).  Parameters are unchanged."""
        if batch == self.batch_size:
            return self
        if batch <= 0:
            raise ValueError(f"batch must be positive, got {batch}")
        r = batch / self.batch_size

        def scale_shape(shape, dims, node_dims):
            out = list(shape)
            for ax, dn in enumerate(dims):
                if dn is not None and node_dims[dn].batch:
                    out[ax] = max(1, round(shape[ax] * r))
            return tuple(out)

        nodes = {}
        for n in self.nodes.values():
            nd = {d.name: d for d in n.dims}
            dims = tuple(Dim(d.name, max(1, round(d.size * r)), d.splittable, d.batch) if d.batch else d
                         for d in n.dims)
            ops = tuple(Operand(scale_shape(o.shape, o.dims, nd), o.dtype, o.dims, o.producer, o.param)
                        for o in n.operands)
            out = TensorSpec(scale_shape(n.out.shape, n.out.dims, nd), n.out.dtype, n.out.dims)
            has_batch = any(d.batch for d in n.dims)
            f = r if has_batch else 1.0
            # Parameter traffic does not depend on the batch -- except for a lookup, which reads only
            # the touched rows (capture counts ids + rows, not the table).  The activation part scales
            # with the activations actually moved, so operands without a batch axis stay constant.
            param_bytes = 0 if n.kind == "embedding" else sum(o.nbytes for o in n.operands if o.param is not None)
            old_act = sum(o.nbytes for o in n.operands if o.param is None) + n.out.nbytes
            new_act = sum(o.nbytes for o in ops if o.param is None) + out.nbytes
            act_ratio = new_act / old_act if old_act else f
            nbytes = param_bytes + max(0.0, n.bytes - param_bytes) * act_ratio
            nodes[n.name] = OpNode(n.name, n.kind, n.target, dims, ops, out, n.flops * f, nbytes,
                                   n.saves, n.module, n.block, dict(n.extra))
        return OpGraph(self.name, nodes, dict(self.params), self.outputs, batch,
                       {k: list(v) for k, v in self.blocks.items()},
                       [list(g) for g in self.block_groups], dict(self.meta))

    def subgraph(self, names) -> "OpGraph":
        """Induced subgraph on `names` (kept in topological order).  Operands whose producer lies
        outside become graph inputs of the subgraph (producer=None, shape kept)."""
        wanted = set(names)
        keep = [n for n in self.nodes if n in wanted]
        ks = set(keep)
        nodes = {}
        for name in keep:
            n = self.nodes[name]
            ops = tuple(o if (o.producer is None or o.producer in ks)
                        else Operand(o.shape, o.dtype, o.dims, None, o.param) for o in n.operands)
            nodes[name] = OpNode(n.name, n.kind, n.target, n.dims, ops, n.out, n.flops, n.bytes,
                                 n.saves, n.module, n.block, dict(n.extra))
        used = {p for n in nodes.values() for p in n.params}
        blocks = {b: [x for x in v if x in ks] for b, v in self.blocks.items()}
        blocks = {b: v for b, v in blocks.items() if v}
        groups = [[b for b in g if b in blocks] for g in self.block_groups]
        return OpGraph(self.name, nodes, {p: self.params[p] for p in self.params if p in used},
                       tuple(o for o in self.outputs if o in ks), self.batch_size, blocks,
                       [g for g in groups if g], dict(self.meta))
