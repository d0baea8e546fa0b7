"""Where sequence parallelism cuts the residual stream: at the first block's input, not before it.

The plan's SP section (sapp/search/sp_layout.py) may cut the sequence before the blocks: an embedding's
output (`scatter`), or a norm outside every block (BERT's / ERNIE's embeddings LayerNorm, a sequence-
parallel norm).  Model code between that cut and the first block then reads the shard's length as
the sequence's: HF builds its attention mask from the embedding output (ERNIE: mask over 8 keys,
scores over 16), adds positions for the whole sequence to a cut embedding (Pegasus), and the step
fails - or, where the numbers happen to fit, runs wrong.  Where a
sequence-parallel norm runs before the blocks (the BERT family), the emitter moves every such piece to
one cut where each block stack's first block takes its input in (`block_scatter`, a local slice;
backward all-gathers as the scatter did): the code before the blocks runs on the whole sequence, as
one process runs it.  The pieces moved are elementwise (an embedding sum, a norm): the same values,
run on t times the rows on each rank, which the plan priced at 1/t (small beside the blocks).  Embeddings
cut where their own parent sums them, with no norm before the blocks (sapp's GPT), keep the planned cut.

A vocabulary-split table moved (RoBERTa's position / token-type tables) all-reduces its partial sums
instead of reduce-scattering them (twice that op's traffic, unpriced; the tables are small).
Left as planned (nothing moved) when a module reads the shard before the blocks (it gathers
what it reads; an HF decoder gathering the encoder's output counts); and on traced pipeline stages (no
nn.ModuleList blocks to find)."""
from __future__ import annotations

import weakref

from ...errors import PlanError

# module -> {sub-module name: index of the first op it runs}, from a capture of that module (the
# shape audit's): the order forward calls them in, which registration order need not be
# (CamemBERT / XLM-RoBERTa register lm_head before roberta: by that order the head came before
# the blocks, read the shard "before" them, and the embeddings' cut stayed where the mask is built)
_CALLED = weakref.WeakKeyDictionary()


def remember_order(module, graph) -> None:
    """Keep the order `module`'s sub-modules run in, read off its captured `graph`: a module's place is
    its first op's (or its first descendant's)."""
    order = {}
    for i, node in enumerate(graph.nodes.values()):
        name = node.module or ""
        while True:
            order.setdefault(name, i)
            if not name:
                break
            name = name.rpartition(".")[0]
    _CALLED[module] = order


def module_order(module) -> dict:
    """{sub-module name: rank}: the call order remembered for `module` where known (modules it never
    ran after every one it did, in registration order), else registration order."""
    reg = {}
    for i, (n, _) in enumerate(module.named_modules(remove_duplicate=False)):
        reg.setdefault(n, i)
    called = _CALLED.get(module)
    if not called:
        return reg
    late = len(called) + len(reg)
    return {n: called.get(n, late + i) for n, i in reg.items()}


def _inside(name: str, blocks) -> bool:
    return any(name == b or name.startswith(b + ".") for b in blocks)


def _first_block_after(name: str, order: dict, blocks: list):
    """The first block (in call order, `module_order`) after `name` under its nearest ancestor holding blocks;
    None when every block there comes before it (a final norm)."""
    anc = name
    while True:
        anc = anc.rpartition(".")[0]
        under = [b for b in blocks if not anc or b.startswith(anc + ".")]
        if under:
            after = [b for b in under if order.get(b, -1) > order.get(name, -1)]
            return min(after, key=order.get) if after else None
        if not anc:
            return None


def relayout(sec: dict, module, tp_plan: dict, blocks: list) -> tuple:
    """(the SP section with the pieces before the blocks moved to the blocks' entries, what moved:
    [piece names]); `sec` itself when nothing moves.  A vocabulary-split embedding moved loses its
    `scatter`: its partial sums are all-reduced (RowwiseParallel's default) instead of reduce-scattered
    (parallel.apply_tp relayouts before choosing the styles).  `tp_plan` is not read any more."""
    if not sec or not blocks:
        return sec, []
    order = module_order(module)
    pre = {}                                   # piece -> (block whose entry takes the cut, axis)
    for key in ("scatter", "norms"):
        for name, axis in (sec.get(key) or {}).items():
            if name not in order or _inside(name, blocks):
                continue
            block = _first_block_after(name, order, blocks)
            if block is None:
                continue
            pre[name] = (block, axis)
    if not any(n in (sec.get("norms") or {}) for n in pre):
        return sec, []                          # embeddings cut where their parent sums them: as planned
    for key in ("entries", "exits"):
        for name in sec.get(key) or {}:
            if name in order and not _inside(name, blocks) and _first_block_after(name, order, blocks) is not None:
                return sec, []                  # something before the blocks reads the shard
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in sec.items()}
    for key in ("scatter", "norms"):
        out[key] = {n: a for n, a in (sec.get(key) or {}).items() if n not in pre}
    cuts = dict(sec.get("block_scatter") or {})
    for block, axis in pre.values():
        # the residual stream's sequence axis is the block's own norms' (a 2-D position table cut
        # on axis 0 says nothing about the (batch, seq, width) stream it is added to)
        inner = [a for n, a in (sec.get("norms") or {}).items() if _inside(n, [block])]
        cuts.setdefault(block, inner[0] if inner else axis)
    out["block_scatter"] = dict(sorted(cuts.items()))
    return out, sorted(pre)


def check_entries(sec: dict, mods: dict, blocks: list) -> None:
    """Refuse an entry that holds a stack of blocks (an HF encoder-decoder's decoder, planned to gather
    the encoder's sequence-split output): its gather hook takes the first positional tensor or
    `hidden_states` or the first tensor keyword, which for a decoder called with keywords is its
    token ids - the encoder's output would reach cross-attention as a shard, and without a mask
    to disagree the keys would silently be half the sequence."""
    for name in (sec or {}).get("entries") or {}:
        if name in mods and any(b.startswith(name + ".") for b in blocks):
            raise PlanError(f"sequence parallelism: {name} ({type(mods[name]).__name__}) holds a stack of blocks and "
                            f"is planned to gather one of its inputs, which sapp cannot tell apart from the others "
                            f"(an encoder-decoder's decoder reading the encoder output); search again with sp pinned "
                            f"to false (constraints sp=false)")
