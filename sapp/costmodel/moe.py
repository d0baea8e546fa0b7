"""Mixture-of-Experts under expert parallelism (EP): what changes when the experts of each MoE layer
are spread over `ep` data-parallel ranks.  Pure: plain numbers in, seconds and bytes out.

Layout (Megatron-Core's, and what sapp/emit/ep/experts.py runs): a stage's dp ranks form dp/ep EP groups of
`ep` consecutive dp ranks; rank j of a group holds experts [j·E/ep, (j+1)·E/ep).  Each rank routes
its own tokens (router, top-k, sort by expert: priced in the captured graph like any op), sends every
routed row to the rank holding its expert (all-to-all *dispatch*), runs its experts' grouped GEMMs on
the rows it receives, and sends the results back (all-to-all *combine*); backward runs the same two
all-to-alls on the gradients.  Experts use no tensor parallelism (expert TP = 1).  The expert
parameters' gradients are complete within an EP group (every token that met an expert reached its
owner), so they are all-reduced only over the *expert-DP* group: the dp/ep ranks holding the same
experts; their weights, gradients and optimizer states are 1/ep of the layer's experts, ZeRO-sharded
over expert-DP.

Load.  Routed rows per rank per micro-batch have mean T·k (T local tokens, k = top-k): each of the ep
ranks sends T·k rows spread over E experts, E/ep of them local.  The step waits for the busiest rank,
so expert compute is priced at `load` × the mean, where
  - dropless routing (capacity_factor 0, Megatron-Core's default): load = `imbalance`, the busiest
    EP rank's rows over the mean.  A setting (CostSettings.moe_imbalance, default
    DEFAULT_IMBALANCE = 1.0: routing kept balanced by an auxiliary loss, Mixtral / DeepSeek-V3's
    practice); measured routers run 1.05-1.3 early in training;
  - a capacity factor c > 0: every expert computes capacity = c · mean rows (short groups padded,
    overflow dropped), so load = c whatever the imbalance.
All-to-all on real links: the EP group's members inside one node exchange over NVLink, the rest over
the network, concurrently; the slower part sets the time (REFERENCE.md §2's α-β all-to-all on each).
Two published refinements (DeepSeek-V3 technical report, arXiv 2412.19437), priced where the model
says it routes that way (its config's `topk_group`, `dispatch_fp8`):
  - node-limited routing with hierarchical dispatch (§2.1.2 "Node-Limited Routing", §3.2.2): a token's
    experts lie on at most M nodes (`topk_group` of `n_group` expert groups); it crosses the network
    once per target node (to the GPU of its own in-node index there) and is forwarded over NVLink to
    the GPUs holding its experts, so network bytes are bounded by M copies of a token, not k;
  - FP8 dispatch (§3.3.2 "Low-Precision Communication"): the rows sent to the experts (the forward
    dispatch, and in backward the gradient sent to the experts' down projections) are 1 byte an
    element; both combines stay bf16.
Expert GEMMs under EP: a rank holds E/ep experts and runs T·k·ep/E rows through each, so the weights it
reads are 1/ep of the ep = 1 profile's, which prices every expert's weights read by every rank: at
small rows per expert that profile is memory bound (`expert_gemm_delta` reprices both)."""
from __future__ import annotations

import dataclasses

from .fp8 import WEIGHT_CACHE_BYTES, grouped_fp8
from .gradsync import param_sync
from .primitives import _alpha_beta, collective_time, compute_time, model_state_bytes

DEFAULT_IMBALANCE = 1.0


def expert_load(capacity_factor: float = 0.0, imbalance: float = DEFAULT_IMBALANCE) -> float:
    """The busiest EP rank's routed rows over the mean (see the module text)."""
    return float(capacity_factor) if capacity_factor > 0 else float(imbalance)


def routed_rows(tokens: float, top_k: int, experts: int, ep: int, capacity_factor: float = 0.0,
                imbalance: float = DEFAULT_IMBALANCE) -> dict:
    """Rows one EP rank's experts compute per micro-batch when each rank routes `tokens` tokens:
    {"per_expert": rows of one expert, "per_rank": rows on the busiest rank}."""
    load = expert_load(capacity_factor, imbalance)
    per_expert = ep * tokens * top_k / experts * load
    return {"per_expert": per_expert, "per_rank": per_expert * experts / ep}


def ep_local(ep: int, tp: int, gpus_per_node: int) -> int:
    """Members of one EP group inside a node (the group is ep consecutive dp ranks, tp apart)."""
    return max(1, min(ep, gpus_per_node // max(1, tp)))


def all_to_all_time(nbytes: float, ep: int, local: int, cluster) -> float:
    """One all-to-all of a rank's `nbytes` send buffer over an EP group of `ep` ranks, `local` of them
    in each node: (local-1) peers over the intra-node link and (ep-local) over the network, at once."""
    if ep <= 1 or nbytes <= 0:
        return 0.0
    if local >= ep:
        return collective_time("all_to_all", nbytes, ep, "intra", cluster)
    a_i, b_i = _alpha_beta("all_to_all", "intra", cluster)
    a_n, b_n = _alpha_beta("all_to_all", "inter", cluster)
    intra = (local - 1) * a_i + nbytes * (local - 1) / ep / b_i if local > 1 else 0.0
    inter = (ep - local) * a_n + nbytes * (ep - local) / ep / b_n
    return max(intra, inter)


def node_limited_time(tokens: float, top_k: int, row_bytes: float, ep: int, local: int, nodes_reached: int,
                      cluster) -> float:
    """One hierarchical all-to-all (DeepSeek-V3 §3.2.2) of a rank's `tokens` tokens whose k routed rows
    of `row_bytes` lie on at most `nodes_reached` of the EP group's ep / local nodes: each token crosses
    the network once per target node other than its own (balanced routing: of the M nodes a token
    reaches, (N - 1) / N are remote), then every routed row not already on its expert's GPU is
    forwarded over NVLink; the two links run at once and the slower sets the time."""
    if ep <= 1 or tokens <= 0:
        return 0.0
    N = max(1, ep // max(1, local))
    if N <= 1:
        return all_to_all_time(tokens * top_k * row_bytes, ep, local, cluster)
    M = max(1, min(N, nodes_reached))
    a_i, b_i = _alpha_beta("all_to_all", "intra", cluster)
    a_n, b_n = _alpha_beta("all_to_all", "inter", cluster)
    inter = (min(M, N - 1)) * a_n + tokens * M * (N - 1) / N * row_bytes / b_n
    intra = ((local - 1) * a_i + tokens * top_k * (local - 1) / local * row_bytes / b_i) if local > 1 else 0.0
    return max(intra, inter)


def nodes_reached(experts: int, ep: int, local: int, n_group: int, topk_group: int) -> int:
    """Nodes of the EP group a token's experts can lie on under group-limited routing (`topk_group` of
    `n_group` consecutive expert groups; 0: no limit, every node): the chosen groups' nodes."""
    N = max(1, ep // max(1, local))
    if not (n_group and topk_group) or n_group <= 0:
        return N
    per_group = max(1, -(-N // n_group))          # nodes one expert group spans (groups larger than a node)
    return min(N, topk_group * per_group)


def dispatch_combine_time(tokens: float, top_k: int, hidden: int, act_bytes: float, ep: int, local: int,
                          cluster, routing=None) -> tuple:
    """(forward s, backward s) of one MoE layer's all-to-alls per micro-batch: dispatch + combine in
    forward, their gradients in backward; each moves the rank's T·k rows of `hidden` values.
    `routing` (the model's, None: plain all-to-all at `act_bytes`): {"nodes": nodes a token reaches
    (hierarchical dispatch, node_limited_time), "dispatch_bytes": bytes an element of the rows sent to
    the experts, forward and in backward}."""
    if not routing:
        one = all_to_all_time(tokens * top_k * hidden * act_bytes, ep, local, cluster)
        return 2 * one, 2 * one
    d_bytes = routing.get("dispatch_bytes") or act_bytes
    if routing.get("nodes"):
        leg = lambda b: node_limited_time(tokens, top_k, hidden * b, ep, local, routing["nodes"], cluster)  # noqa: E731
    else:
        leg = lambda b: all_to_all_time(tokens * top_k * hidden * b, ep, local, cluster)  # noqa: E731
    one = leg(d_bytes) + leg(act_bytes)        # dispatch (maybe FP8) + combine (bf16)
    return one, one


def router_flops(tokens: float, hidden: int, experts: int) -> float:
    """Forward FLOPs of the router's linear layer (backward: twice that)."""
    return 2.0 * tokens * hidden * experts


def permute_bytes(tokens: float, top_k: int, hidden: int, act_bytes: float, ep: int = 1) -> float:
    """Memory traffic of one forward's row permutations: gather the rows into expert order and scatter
    them back (read + write each); under EP also the received rows re-sorted by local expert and
    back.  Backward moves the same."""
    passes = 2 + (2 if ep > 1 else 0)
    return passes * 2.0 * tokens * top_k * hidden * act_bytes


def expert_gemm_flops(rows: float, hidden: int, expert_ffn: int) -> float:
    """Forward FLOPs of a SwiGLU expert over `rows` rows: [rows, h]·[h, 2f] and [rows, f]·[f, h]."""
    return 2.0 * rows * hidden * 2 * expert_ffn + 2.0 * rows * expert_ffn * hidden


def moe_layer_time(tokens, hidden, experts, top_k, expert_ffn, ep, local, cluster, act_bytes=2.0,
                   capacity_factor=0.0, imbalance=DEFAULT_IMBALANCE) -> dict:
    """One MoE layer's forward and backward seconds per micro-batch on the busiest EP rank, by part
    (router GEMM, permutations, expert GEMMs at the routed load, all-to-alls)."""
    rows = routed_rows(tokens, top_k, experts, ep, capacity_factor, imbalance)["per_rank"]
    rf = router_flops(tokens, hidden, experts)
    ef = expert_gemm_flops(rows, hidden, expert_ffn)
    pb = permute_bytes(tokens, top_k, hidden, act_bytes, ep)
    a_f, a_b = dispatch_combine_time(tokens, top_k, hidden, act_bytes, ep, local, cluster)
    fwd = {"router": compute_time(rf, 0.0, cluster), "permute": compute_time(0.0, pb, cluster),
           "experts": compute_time(ef, 0.0, cluster), "all_to_all": a_f}
    bwd = {"router": compute_time(2 * rf, 0.0, cluster), "permute": compute_time(0.0, pb, cluster),
           "experts": compute_time(2 * ef, 0.0, cluster), "all_to_all": a_b}
    return {"fwd": fwd, "bwd": bwd, "fwd_s": sum(fwd.values()), "bwd_s": sum(bwd.values()), "rows": rows}


def _gemm_s(flops: float, nbytes: float, cluster, settings, elems=None) -> tuple:
    """(forward s, backward s) of a GEMM as costmodel.nodes.node_cost prices a matmul (backward: twice
    the FLOPs and the bytes); `elems` (X, W, Y element counts) where the experts run in FP8: as node_cost
    prices an FP8 grouped GEMM (costmodel/fp8.py fp8_gemm_times, its casts included)."""
    from .fp8 import fp8_gemm_times, grouped_fp8, te_casts
    from .primitives import kernel_efficiency
    ov = getattr(cluster, "gemm_memory_overlap", 1.0)
    if elems is not None and grouped_fp8(settings):
        f, b, _ = fp8_gemm_times(flops, 2 * flops, *elems, te_casts(settings.fp8, *elems), cluster, settings, True, ov)
        return f, b
    return (compute_time(flops, nbytes, cluster, efficiency=kernel_efficiency("matmul", False, cluster, settings),
                         overlap=ov),
            compute_time(2 * flops, 2 * nbytes, cluster, efficiency=kernel_efficiency("matmul", True, cluster, settings),
                         overlap=ov))


def _gemm_sides(gemm, elem, mbs: float, ep: int, tp: int, load: float, settings) -> tuple:
    """((FLOPs, bytes, FP8 elements or None) of the ep = 1 profile's GEMM, the same of the EP rank's) for
    one expert GEMM (expert_gemm_delta)."""
    fl, wb, rb = gemm
    e0 = e1 = None
    if elem is not None:
        x, y = elem
        w = wb / settings.weight_bytes
        e0, e1 = (x * mbs, w, y * mbs), (x * mbs * load / tp, w / (ep * tp), y * mbs * load / tp)
    return (fl * mbs, wb + rb * mbs, e0), (fl * mbs * load / tp, wb / (ep * tp) + rb * mbs * load / tp, e1)


def expert_gemm_delta(gemms, mbs: float, ep: int, tp: int, load: float, cluster, settings, elems=None) -> tuple:
    """(forward s, backward s) EP changes in a block's expert GEMMs per micro-batch of `mbs` samples:
    the ep = 1 profile runs every expert's weights over the rank's own rows; an EP rank reads 1/(ep tp)
    of them and runs `load`/tp x its rows (the busiest rank).  `gemms`: per GEMM (forward FLOPs a
    sample, weight bytes, other bytes a sample); `elems`: per GEMM (X, Y elements a sample), for the
    FP8 experts of Transformer Engine's recipes (both sides priced by fp8_gemm_times, as node_cost
    priced the profile's; X and Y taken 1/tp under expert-tp as the bytes are)."""
    df = db = 0.0
    for i, g in enumerate(gemms):
        before, after = _gemm_sides(g, elems[i] if elems else None, mbs, ep, tp, load, settings)
        f0, b0 = _gemm_s(*before[:2], cluster, settings, before[2])
        f1, b1 = _gemm_s(*after[:2], cluster, settings, after[2])
        df, db = df + f1 - f0, db + b1 - b0
    return df, db


def expert_wgrad_s(gemms, mbs: float, ep: int, tp: int, load: float, cluster, settings, elems=None) -> float:
    """The weight-gradient half of the experts' backward on the EP rank (their forward's FLOPs), priced
    as expert_gemm_delta prices that rank's GEMMs (FP8 under Transformer Engine's recipes)."""
    out = 0.0
    for i, g in enumerate(gemms):
        after = _gemm_sides(g, elems[i] if elems else None, mbs, ep, tp, load, settings)[1]
        out += _gemm_s(*after[:2], cluster, settings, after[2])[1] / 2
    return out


def paired_hidden(a_f: float, a_b: float, f_compute: float, b_compute: float, dw: float = 0.0) -> tuple:
    """(forward s, backward s) of all-to-all hidden when a forward runs beside another micro-batch's
    backward (Megatron-Core's --overlap-moe-expert-parallel-comm, pipeline/overlap.py): the forward's
    dispatch/combine (`a_f`) behind the backward's compute, the backward's (`a_b`) behind the forward's
    compute plus, under --delay-wgrad-compute, its own expert weight-gradient GEMMs (`dw`, which then
    run beside its dispatch).  Each part exposes max(0, a2a - window), never negative; both all-to-alls
    share the one link, so the pair never takes less than a_f + a_b in all."""
    a_f, a_b = max(0.0, a_f), max(0.0, a_b)
    hf = min(a_f, max(0.0, b_compute))
    hb = min(a_b, max(0.0, f_compute) + max(0.0, dw))
    # the link serialises the two: compute f + b (dw is inside b) must cover a_f + a_b to hide both
    over = (hf + hb) - max(0.0, f_compute + b_compute)
    if over > 0:
        hb = max(0.0, hb - over)
    return hf, hb


def expert_state_bytes(expert_params: float, dp: int, ep: int, zero: int, settings) -> dict:
    """Weights, gradients and optimizer states per device for a layer set's `expert_params`: 1/ep of
    them per EP rank, ZeRO-sharded over the expert-DP group of dp/ep ranks."""
    return model_state_bytes(expert_params / ep, max(1, dp // ep), zero, settings)


def expert_sync_time(expert_params: float, dp: int, ep: int, link: str, cluster, settings) -> float:
    """Bandwidth part of the expert gradients' all-reduce per step (ZeRO-0): 1/ep of the experts over
    the expert-DP group of dp/ep ranks (the latency is the bucket's, paid once a stage)."""
    edp = max(1, dp // ep)
    if edp <= 1 or expert_params <= 0:
        return 0.0
    nbytes = expert_params / ep * settings.reduce_bytes
    return (collective_time("all_reduce", nbytes, edp, link, cluster)
            - 2 * (edp - 1) * _alpha_beta("all_reduce", link, cluster)[0])


def expert_tp_gather(rows: float, hidden: int, act_bytes: float, tp: int, cluster) -> float:
    """Seconds per micro-batch direction of expert tensor parallelism's row exchange: the rows an EP rank
    received all-gathered over its tp group before the experts (reduce-scattered after them), `rows`
    being the tp group's T·k; 0 at tp 1."""
    if tp <= 1 or rows <= 0:
        return 0.0
    nbytes = rows * hidden * act_bytes
    return collective_time("all_gather", nbytes, tp, "intra", cluster) + \
        collective_time("reduce_scatter", nbytes, tp, "intra", cluster)


def ep_unit_delta(facts: dict, *, dp: int, tp: int, ep: int, mbs: int, zero: int, cluster, settings,
                  stage_devices: int, etp: int = 0) -> dict:
    """What EP changes in one block's priced numbers against the ep = 1 profile (every dp rank holding
    every expert, its expert gradients all-reduced over all dp): per micro-batch seconds added to
    forward and backward (all-to-alls, the EP re-sort, expert GEMMs at the routed load), per-step
    gradient-sync seconds (expert gradients over expert-DP instead of dp), model-state bytes.
    `facts`: the block's MoE layers as captured, per sample: {"rows", "hidden", "top_k",
    "expert_flops" (forward), "expert_params", "capacity_factor"}.
    Under tensor parallelism (tp > 1, sequence parallel: Megatron-Core's layout with expert-tp = tp, its
    default) the profile holds every expert whole on every tp rank and runs the micro-batch's routed
    rows through them on each; Megatron splits each expert's ffn over the tp ranks instead: a rank
    dispatches its 1/tp of the tokens over the ep ranks of its tp index, all-gathers the received rows
    over tp (reduce-scatter on the way back) and runs 1/tp of every local expert on them, so expert
    FLOPs and expert states are 1/tp of the profile's (the row exchange: expert_tp_gather).  What a rank
    keeps for backward in the experts' ffn width (the up/gate outputs the activation reads, the down
    GEMM's input: `ffn_row_elems` a routed row) is 1/tp of it too, on the same gathered rows (Megatron-Core's
    GroupedMLP / SequentialMLP under expert-tp: each rank's linear_fc1 / linear_fc2 shards are ffn/tp
    wide): "act_per_sample", bytes a sample (negative), for the no- and selective-recomputation stashes.
    `etp` 1 beside tp > 1 (Megatron's --expert-tensor-parallel-size 1, --expert-model-parallel-size
    ep x tp): the same tp x ep ranks hold the experts whole, E/(ep tp) each; a rank dispatches its 1/tp of
    the tokens over all ep x tp of them (no row exchange over tp) and keeps 1/tp of the routed rows at the
    hidden width too; FLOPs, states and the expert-DP sync are those of etp = tp.  0: etp = tp.
    "a2a_s": the (forward, backward) all-to-all seconds inside fwd_s / bwd_s; "dw_s": the experts'
    weight-gradient seconds inside the backward (what --delay-wgrad-compute moves: `paired_hidden`)."""
    zero_delta = {"fwd_s": 0.0, "bwd_s": 0.0, "a2a_s": (0.0, 0.0), "dw_s": 0.0, "sync_s": 0.0, "act_per_sample": 0.0,
                  "states": {"params": 0.0, "grads": 0.0, "optimizer": 0.0}}
    if ep <= 1 or not facts:
        return zero_delta
    gpn = cluster.gpus_per_node
    local = ep_local(ep, tp, gpn)
    whole = etp == 1 and tp > 1         # experts whole on each of the ep x tp ranks
    group = ep * tp if whole else ep    # the ranks one all-to-all spans
    if whole:
        local = ep_local(group, 1, gpn)
    act = 2.0 if settings.mixed else 4.0
    rows = facts["rows"] * mbs                            # T·k routed rows this rank sends
    tokens = rows / facts["top_k"]
    routing = _routing(facts, ep, local)
    a_f, a_b = dispatch_combine_time(tokens / tp, facts["top_k"], facts["hidden"], act, group, local, cluster, routing)
    a_f, a_b = a_f + expert_tp_gather(rows, facts["hidden"], act, 1 if whole else tp, cluster), \
        a_b + expert_tp_gather(rows, facts["hidden"], act, 1 if whole else tp, cluster)
    resort = compute_time(0.0, permute_bytes(tokens, facts["top_k"], facts["hidden"], act, ep)
                          - permute_bytes(tokens, facts["top_k"], facts["hidden"], act, 1), cluster)
    load = expert_load(facts.get("capacity_factor", 0.0), getattr(settings, "moe_imbalance", DEFAULT_IMBALANCE))
    if facts.get("gemms"):
        # the busiest rank's rows (or fewer), 1/tp of each expert, 1/(ep tp) of the weights read
        elems = facts.get("gemm_elems")
        e_f, e_b = expert_gemm_delta(facts["gemms"], mbs, ep, tp, load, cluster, settings, elems)
        dw = expert_wgrad_s(facts["gemms"], mbs, ep, tp, load, cluster, settings, elems)
    else:
        ef = facts["expert_flops"] * mbs * (load / tp - 1.0)
        e_f = compute_time(ef, 0.0, cluster) if ef > 0 else -compute_time(-ef, 0.0, cluster)
        e_b = 2 * e_f
        dw = compute_time(facts["expert_flops"] * mbs * load / tp, 0.0, cluster)
    S = stage_devices
    dp_link = "inter" if S > gpn else "intra"
    edp_link = "inter" if (S > gpn and ep * tp < S and ep * tp * max(1, dp // ep) > gpn) else "intra"
    P = facts["expert_params"]
    before = model_state_bytes(P, dp, zero, settings)
    after = expert_state_bytes(P / tp, dp, ep, zero, settings)
    # the experts' share of the profile's gradient sync (gradsync.param_sync, as the profile prices
    # every parameter) swapped for 1/(ep x tp) of them over expert-DP
    zs = dataclasses.replace(settings, zero=zero)
    full = param_sync(P, dp, dp_link, cluster, zs)[0]
    mine = param_sync(P / ep / tp, max(1, dp // ep), edp_link, cluster, zs)[0]
    act_delta = -(1.0 - 1.0 / tp) * facts["rows"] * _row_kept_bytes(facts, whole, act, settings)
    states = {k: after[k] - before[k] for k in before}
    if grouped_fp8(settings):   # the FP8 weight copies of the experts a rank holds: 1/(ep tp) of them too
        states["params"] += WEIGHT_CACHE_BYTES.get(settings.fp8, 0.0) * (P / (ep * tp) - P)
    return {"fwd_s": a_f + resort + e_f, "bwd_s": a_b + resort + e_b, "a2a_s": (a_f, a_b), "dw_s": dw,
            "sync_s": mine - full, "act_per_sample": act_delta, "states": states}


def _routing(facts, ep, local):
    """The model's routing as dispatch_combine_time takes it (None: plain all-to-all at bf16)."""
    nodes = nodes_reached(facts.get("experts", 1), ep, local, facts.get("n_group", 0), facts.get("topk_group", 0)) \
        if facts.get("topk_group") else 0
    fp8 = 1.0 if facts.get("dispatch_fp8") else None
    return {"nodes": nodes, "dispatch_bytes": fp8} if (nodes or fp8) else None


def _row_kept_bytes(facts, whole: bool, act: float, settings) -> float:
    """Bytes a routed row keeps for backward in the experts' ffn width (and at the hidden width when the
    experts are whole, etp 1): the down GEMM's input (`act_out_share` of the ffn elements) and the up
    GEMM's rows are kept as Transformer Engine's FP8 copy under its recipes (costmodel/memory.py)."""
    from .fp8 import CACHE_WIDTH, grouped_fp8
    ffn = facts.get("ffn_row_elems", 0.0)
    cw = CACHE_WIDTH.get(settings.fp8, act) if grouped_fp8(settings) else act
    down = facts.get("act_out_share", 0.0) * ffn
    return (ffn - down) * act + down * cw + whole * facts["hidden"] * cw
