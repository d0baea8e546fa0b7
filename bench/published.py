"""Published training runs, predicted vs published: `python -m bench.published [--only TEXT] [--write]
[--runtime fused|eager] [--no-free]`.

Each row is a public run with a published figure (TF/GPU, a step or layer time).  sapp prices the
run PINNED to the published configuration (tp, pp, dp, ZeRO, micro-batch size, recompute as given)
and, for reference, what the free search would pick on the same cluster and batch.  `--write`
replaces the generated body of the "Published runs" section of bench/RESULTS.md (bench/results.py).

Rows live in ROWS (a list of `Row` dataclasses); other modules add theirs: `bench/published_moe.py`
and `bench/published_sp.py`, if present, are imported and their `ROWS` appended.  A row needing a
strategy sapp cannot express yet says so in `needs` (it is priced as well as possible without it and
marked in the table).  The runtime profile (`CostSettings.runtime`, docs/ARCHITECTURE.md "Runtime
profiles") is one setting for every row: no per-row correction.

How the rows are configured and priced, and what is left (the figures are bench/RESULTS.md's "Published runs"):

Every row is priced PINNED to the published configuration (tp, pp, dp; ZeRO-1 = Megatron's distributed
optimizer; micro-batch 1 where the source says so; the recomputation the source used) on the datasheet
preset of its GPU, with one runtime profile for all rows (`--runtime`, default `fused`: Megatron-Core's
fused kernels, docs/ARCHITECTURE.md "Runtime profiles") plus the flags the row's source says it set:
the Megatron-LM README's weak-scaling runs set `--tp-comm-overlap` (priced with the
`fused+tp-overlap` profile: tensor-parallel collectives pipelined against their GEMMs,
costmodel/tp_overlap.py) and `--overlap-grad-reduce --overlap-param-gather` (the fused profile's
distributed-optimizer overlap: reduce-scatter behind the last backward, parameter all-gather behind
the next first forward).  The "eager runtime" column is the same configuration priced as torch eager
under autocast, to show what the profile changes.  The last column is what sapp's free search picks
for the same model, cluster and batch.  "[needs sp]": the run used sequence parallelism, pinned on
here (2021 rows and Korthikanti's baseline / full-recompute rows pin it off; 2021 rows pin ZeRO 0: no
distributed optimizer then).  The 2021 rows take Table 2's own configuration: its model-parallel size
(96 = t8 x p12 for 175B, 280 = t8 x p35 for 530B; Table 1's t8 x p8 175B run is another run) and
micro-batch size 1.  Schedules: the README names no interleaving for its weak-scaling runs,
so they are priced with Megatron's default schedule (plain 1F1B, no
--num-layers-per-virtual-pipeline-stage); the 2021 rows (the paper's interleaved schedule) leave the
depth to the search.  The weak-scaling shapes (heads, hidden, layers) are the README's model table's;
Korthikanti Table 4 is one layer (the 2-layer run minus the 1-layer run, forward + backward per
micro-batch).

Compute is priced by kernel (docs/ARCHITECTURE.md "Compute efficiency by kernel"; one model for every
row): dense GEMMs on the summed roofline (arithmetic at 80% of peak + operand/output traffic at 80% of
the memory bandwidth: the arithmetic-intensity dependence the Megatron-LM README gives for its weak
scaling), flash attention on Hopper at the cuDNN kernel's published 518 / 499 TFLOP/s (forward /
backward, FlashAttention-3 paper, July 2024) for runs made since, and at FlashAttention-2's 319 / 310
(the same figure) for the H100 runs made before it (the README's weak scaling, committed 2024-07-15;
Llama 3 405B: H100_2024H1_ATTENTION beside the rows), and the fused profile's loss as Megatron-Core's vocab-parallel
cross entropy runs it: fp32, one kernel a pass (cast, max, subtract, exp, sum, divide; backward
multiply and cast back: 38 + 14 bytes a logit element, costmodel/nodes.py).

How close, and what is left (from the breakdown column; no row is corrected):
- Every row is within ±10% (22 of 22).  Closest to the edge: 2021 175B on 1536 GPUs at +9.5% and
  weak scaling 119B at +8.6%, predicted fast; 16B (t=4) at -5.7%, predicted slow.  The attention kernel
  of the runs' date is what moved the H100 rows (issue 54): its share of a step is about s / 6h (33% of
  the 1.7B row's FLOPs, 4% of the 462B row's, 40% of Llama 3 at 131K), so the preset's later kernel made
  the small-h and long-sequence rows fast and a one-row calibration could not carry over (1.7B +7.5%,
  119B +11.2%, Llama 3 131K +30.2% at the cuDNN figures; bench/calibrated_families.py).
- Not settled by this table: data-parallel groups that hold several ranks in a node (t < 8 here)
  are priced as one ring on one NIC per GPU.  NCCL's rings leave a node through all of its NICs, so
  such a group's cross-node bandwidth is k NICs' worth (multi-node all-reduce bus bandwidth is the
  node's NIC aggregate, NVIDIA/nccl-tests#119).  Priced two-level (tried, not adopted), the t=1 and
  t=2 rows' gradient sync all but vanishes and they come out +23.6% and +15.6% too fast: the summed
  roofline is too generous to their small GEMMs, by more than the flat ring hides.  Settling it needs
  GEMM timings by shape on an H100.

Llama 3 405B rows (Dubey et al. 2024, Table 4; a Llama-3-405B-like HF LlamaConfig, fused runtime):
pinned to Table 4's tp 8, cp, pp 16, dp and section 3.3.2's settings: FSDP without resharding after
forward (ZeRO-2), interleaving whose first / last chunk holds only the embedding / the head and loss
(one layer a chunk: V = 8), Table 4's batch per DP as micro-batches of one sequence, no recomputation at
8K ("without activation checkpointing"; at 131K the search's choice), and SP (not named by the paper;
8K without checkpointing needs the residual stream sharded).  bench/published.py gives the reasons
beside the rows.  Predicted fast: +6.1% / +5.1% at 8K tokens, +4.3% at 131K (at the preset's cuDNN
attention figures +8.7% / +7.6% / +30.2%).
- What these rows rest on: capture prices an HF decoder's attention as eager and every fused stack run
  it, causal GQA (sapp.models.hf.eager_masks), not as torch.export traces it (a materialised causal mask,
  a non-causal attention over the whole s^2, 16x copies of the 8 KV heads).  The paper's own settings are
  priced as stated: no recomputation at 8K, ZeRO-2, interleaving with V = 8 and the embedding / head alone
  in the end chunks (the bubble at m = 16: 0.74 s; 1.7 s at v = 4).  At 131K the tp level splits the LM
  head over the tp ranks (Megatron's layout), which keeps the last stage as light as the others.
- Memory: the 8K rows are priced as run (ran_as_pinned) although sapp's estimate is 93.9 / 85.5 GB per
  device against the 80 GB they ran in.  sapp counts, per layer and micro-batch, the attention output's
  transposed copy (34 MB at tp8 + SP; Megatron's flash output is s-major, one tensor), 4.8 GB over the 141
  layer-micro-batches an interleaved stage holds at V = 8, plus FSDP2's
  unsharded gradient accumulators under a pipeline (6.4 GB at 8,192 GPUs); the rest of the excess is the
  paper's own memory work (deallocating stage inputs and outputs, TORCH_NCCL_AVOID_RECORD_STREAMS), not
  priced.  The free search keeps the capacity, hence its "speed-up" below 1 on those two rows.
- FLOP convention: TF/GPU counts the whole s^2 (PaLM's 6N + 12LHQT; the paper cites Chowdhery et al.
  for its MFU).  Counting only the causal half (6N + 6LHQT: x0.962 at 8K, x0.714 at 131K) would read
  449 / 414 / 353 (+4.5 / +3.5 / -7.0%).  sapp's 131K / 8K step ratio at 16,384 GPUs (11.73 / 6.25 s =
  1.88) lies between the table's whole-s^2 reading (2.27) and its causal one (1.69); neither settles it.
- The 131K row rests on attention, 40% of its priced compute (6% at 8K): priced at FlashAttention-2's
  H100 figures (319 / 310 TFLOP/s, 0.62x of the preset's cuDNN 518 / 499), the kernel of the run's date
  (pre-training in the first half of 2024, before FlashAttention-3 and that cuDNN kernel were
  published; Meta's torchtitan ran SDPA's FlashAttention-2 on H100 still in Dec 2024).  The paper names
  neither its kernel nor, at 131K, its recomputation (every layer recomputed: about +11%).  Also not priced: the document mask's computation
  imbalance between micro-batches (the paper's reason for asynchronous p2p), FP32 gradient
  reduce-scatter (section 3.3.2; it would add 0.2-0.4 s of exposed DP sync), asynchronous p2p (sapp
  charges the sends to the sender: 0.17-0.35 s) and a vocabulary-parallel loss (sapp gathers the logits
  and runs the 128K-vocabulary cross entropy on every tp rank)."""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import sys
import time
from dataclasses import dataclass, field

# ---- the rows ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    group: str                 # table section ("Megatron-LM H100 weak scaling", ...)
    name: str                  # row label
    model: str                 # zoo name the shape starts from
    config: dict               # zoo overrides (the shape of the published model)
    cluster: str               # Cluster spec string
    global_batch: int          # samples per step
    pins: dict                 # sapp constraints: the published configuration
    metric: str                # "tf_per_gpu_model" | "tf_per_gpu_hw_recompute" | "layer_ms" | "tokens_per_gpu"
    published: float           # the published figure in the metric's unit
    source: str                # where the figure is printed
    needs: str = ""            # a strategy the run used that sapp does not price yet ("" = none)
    note: str = ""
    free: bool = True          # also price the free search's choice
    # the source ran Megatron-Core's --tp-comm-overlap: priced with the "fused+tp-overlap" runtime when
    # the table's runtime is "fused" (a flag the run states, like its sp pin; not a correction)
    tp_comm_overlap: bool = False
    # the source states that the pinned configuration ran as given (Llama 3: no activation checkpointing
    # at 8K tokens): priced even where sapp's memory estimate exceeds the device, which the fits column
    # then shows, instead of letting that estimate force recomputation the run did not do.  Pinned only;
    # the free search keeps the capacity.
    ran_as_pinned: bool = False
    # cost settings the source states the run used (CostSettings fields: fp8 recipe, MoE overlap), applied
    # to the table's profile for this row's pinned and free plans alike (flags of the run, not corrections)
    settings: dict = field(default_factory=dict)


def gpt_shape(l, h, a, V, s, untied=True, attn="sdpa", dropout=0.1):
    return {"l": l, "h": h, "a": a, "V": V, "s": s, "ffn": 4 * h, "tie_embeddings": not untied,
            "attn": attn, "dropout": dropout}


# Attention on the H100 rows run before mid-2024 (the Megatron-LM README's H100 scaling runs, committed
# 2024-07-15; Llama 3 405B, pre-trained in the first half of 2024): FlashAttention-2's H100 figures
# (FlashAttention-3 paper, Shah et al. 2024, Fig. 5-6, causal, head dim 128, 4K: 319 TFLOP/s forward, 310
# backward), not the cuDNN 9 figures beside them that the h100-80g preset carries (518 / 499): that paper
# and kernel are of July 2024, after these runs; Meta's torchtitan still ran SDPA's FlashAttention-2 on
# H100 in Dec 2024 (costmodel/torchtitan.py FA2_OVER_CUDNN).  The kernel of the runs' date, not a fit; the
# sources name none (the module docstring gives both readings).
H100_2024H1_ATTENTION = f"attention_efficiency={319 / 989:.4f},attention_bwd_efficiency={310 / 989:.4f}"
# Megatron-LM repository, H100 weak scaling (Megatron-Core, seq 4096, vocab 131072, DP 48, bf16).
# Shapes (heads, hidden, layers) as the README's model table prints them (images/model_table.png in
# NVIDIA/Megatron-LM, July 2024), with Megatron's GPT conventions for the rest: ffn 4h, untied 131072
# vocabulary.  Parameters (REFERENCE §2 formula + the untied output layer): 1.75B 7.13B 16.1B
# 31.5B 69.8B 118.5B 177B 314B 462B.
# Micro-batch 1, distributed optimizer (ZeRO-1).  The README sets --tp-comm-overlap (runtime
# "fused+tp-overlap") and --overlap-grad-reduce / --overlap-param-gather (the fused runtime's
# "megatron-buckets"); it names no interleaving, so the schedule is Megatron's default without
# --num-layers-per-virtual-pipeline-stage: plain 1F1B.
_MEGATRON_H100 = [
    # name, l, h, a, tp, pp, global batch, TF/GPU
    ("1.7B", 24, 2048, 16, 1, 1, 192, 408.8),
    ("7.1B", 30, 4096, 32, 2, 1, 192, 465.9),
    ("16B", 32, 6144, 48, 4, 1, 192, 489.1),
    ("32B", 48, 7168, 56, 8, 1, 192, 459.6),
    ("70B", 84, 8192, 64, 8, 2, 384, 419.7),
    ("119B", 92, 10240, 80, 8, 4, 768, 420.5),
    ("177B", 96, 12288, 96, 8, 6, 1152, 432.8),
    ("314B", 96, 16384, 128, 8, 8, 1536, 474.4),
    ("462B", 112, 18432, 144, 8, 16, 3072, 459.9),
]

ROWS: list = []
for _n, _l, _h, _a, _t, _p, _gb, _tf in _MEGATRON_H100:
    _gpus = 48 * _t * _p
    ROWS.append(Row(
        "Megatron-LM H100 weak scaling", f"GPT {_n} t{_t} p{_p} d48", "gpt3-175b",
        gpt_shape(_l, _h, _a, 131072, 4096), f"h100-80g:devices={_gpus},{H100_2024H1_ATTENTION}", _gb,
        {"tp": _t, "pp": _p, "dp": 48, "zero": 1, "micro_batches": _gb // 48, **({"sp": True} if _t > 1 else {}),
         **({"schedule": "1f1b"} if _p > 1 else {})},
        "tf_per_gpu_model", _tf,
        "Megatron-LM README (REFERENCE.md §5)", needs="sp" if _t > 1 else "",
        note="shape from the README's model table", tp_comm_overlap=True))

# Korthikanti et al. 2022, Table 4: one 22B layer (h6144 a64 s2048, micro-batch 4) at t=8 on A100.
_K22 = gpt_shape(1, 6144, 64, 51200, 2048, attn="eager")
for _n, _rc, _ms, _needs in (("no recompute", "none", 19.6, ""), ("full recompute", "full", 27.2, ""),
                             ("SP + selective", "selective", 20.3, "sp")):
    ROWS.append(Row("Korthikanti 2022 Table 4 (one 22B layer, fwd+bwd)", f"22B layer t8 {_n}", "gpt3-175b", _K22,
                    "a100-80g:devices=8", 4, {"tp": 8, "pp": 1, "dp": 1, "micro_batches": 1, "recompute": _rc,
                                              "sp": _needs == "sp"},
                    "layer_ms", _ms, "Korthikanti et al. 2022 Table 4", needs=_needs, free=False,
                    note="2021-era kernels: eager attention (no flash)"))

# Megatron-LM 2021 (Narayanan et al.), Table 2: PTD-P, batch fixed, A100, TF/GPU incl. recomputation.
# The table prints a model-parallel size of 96 for 175B (t8 x p12; Table 1's t8 x p8 is a different
# run) and 280 for 530B (t8 x p35), and a micro-batch size of 1 on every PTD-P row.
for _n, _shape, _gb, _t, _p, _runs in (
        ("175B", gpt_shape(96, 12288, 96, 51200, 2048, attn="eager"), 1536, 8, 12, ((384, 153), (768, 149), (1536, 141))),
        ("530B", gpt_shape(105, 20480, 128, 51200, 2048, attn="eager"), 2240, 8, 35, ((560, 171), (1120, 167), (2240, 159)))):
    for _g, _tf in _runs:
        ROWS.append(Row("Megatron-LM 2021 Table 2 (PTD-P)", f"GPT {_n} {_g} GPUs t{_t} p{_p}", "gpt3-175b", _shape,
                        f"a100-80g:devices={_g}", _gb, {"tp": _t, "pp": _p, "dp": _g // (_t * _p), "recompute": "full",
                                                                    "micro_batches": _gb // (_g // (_t * _p)),
                                                                    "sp": False, "zero": 0},
                        "tf_per_gpu_hw_recompute", _tf, "Narayanan et al. 2021 Table 2", note="eager attention (2021)"))


# Llama 3 405B, "The Llama 3 Herd of Models" (Dubey et al. 2024), Table 4: 16M tokens per step on H100
# 80GB (8 a node), BF16, 4D parallelism ordered [TP, CP, PP, DP].  The model: a Llama-3-405B-like HF
# LlamaConfig (bench/llama3_405b.json: 126 layers, h 16384, 128 heads, 8 KV heads, ffn 53248, V 128256).
# Pinned from section 3.3.2: FSDP sharding optimizer states and gradients without resharding the
# parameters after forward (ZeRO-2 here); an interleaved schedule whose first and last stages hold one
# layer fewer so that "the first model chunk on the first stage has only the embedding, and the last
# model chunk on the last stage has only output projection and loss calculation" - a chunk is one layer,
# so V = (126 + 2) / 16 = 8 (pipeline.partition.stage_kmins); Table 4's batch size per DP as the
# micro-batches (one sequence each); "we could pre-train Llama 3 on sequences of 8K tokens without
# activation checkpointing" (recompute none at 8,192, the search's choice at 131,072).  Sequence
# parallelism is not named by the paper; it is pinned on because the 8K runs fit without checkpointing
# (TP alone keeps the residual stream, norms and projection inputs whole on every TP rank: several
# times the 80 GB at these in-flight counts).  TF/GPU counts the model FLOPs the plan's MFU counts:
# 6 x (parameters less the input embedding) per token plus attention over the whole s^2 (12 l h s per
# token), the convention of Megatron and of torchtitan ("do not account for sparsity in causal
# attention"); the paper does not print its formula.
_LLAMA3 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llama3_405b.json")
for _g, _cp, _dp, _seq, _tf in ((8192, 1, 64, 8192, 430), (16384, 1, 128, 8192, 400),
                                (16384, 16, 8, 131072, 380)):
    _gb = 16 * 2 ** 20 // _seq
    ROWS.append(Row(
        "Llama 3 405B (Dubey et al. 2024, Table 4)", f"405B {_g} GPUs t8 cp{_cp} p16 d{_dp} seq {_seq}", _LLAMA3,
        {"seq": _seq}, f"h100-80g:devices={_g},{H100_2024H1_ATTENTION}", _gb,
        {"tp": 8, "cp": _cp, "pp": 16, "dp": _dp, "sp": True, "zero": 2, "schedule": "interleaved",
         "virtual_chunks": 8, "micro_batches": _gb // _dp, **({"recompute": "none"} if _seq == 8192 else {})},
        "tf_per_gpu_model", _tf, "Dubey et al. 2024, Table 4 and section 3.3.2",
        note="V = 8 from the paper's first/last chunk layout", ran_as_pinned=_seq == 8192))

NOTES = """
Every row is priced PINNED to the published configuration on the datasheet preset of its GPU, with one
runtime profile for all rows (`--runtime`, default `fused`) plus the flags the row's source says it set.
"eager runtime": the same configuration priced as torch eager under autocast; the last column: sapp's free
search for the same model, cluster and batch; "[needs sp]": the run used sequence parallelism, pinned on
here.  How each row is configured and priced, and what is left: the docstring of bench/published.py.
"""

def _extra_rows():
    """Rows other engineers add from their own modules (absent modules are skipped)."""
    out = []
    for mod in ("bench.published_moe", "bench.published_sp"):
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise
            continue
        out.extend(getattr(m, "ROWS", []))
    return out


# ---- figures ------------------------------------------------------------------------------------------
def gpt_flops_per_step(cfg, batch, recompute=False):
    """Megatron's FLOPs per iteration (REFERENCE §2): 72·B·s·l·h²·(1 + s/6h + V/12lh), or with full
    recomputation 96·B·s·l·h²·(1 + s/6h + V/16lh)."""
    l, h, s, V = cfg["l"], cfg["h"], cfg["s"], cfg["V"]
    if recompute:
        return 96.0 * batch * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    return 72.0 * batch * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


@dataclass
class Priced:
    value: float = float("nan")
    step_s: float = float("nan")
    mfu: float = float("nan")
    fits: bool = False
    memory_gb: float = float("nan")
    config: str = ""
    error: str = ""
    extra: dict = field(default_factory=dict)


def _graph(row, cache):
    import sapp.models as zoo
    from sapp.api import capture_graph
    key = (row.model, tuple(sorted(row.config.items())))
    if key not in cache:
        # a zoo name, or an HF config.json (sapp.models.build: the module on meta with its example data)
        model = zoo.build(row.model, device="meta", **row.config) if row.model.endswith(".json") else \
            zoo.get(row.model, **row.config)
        cache[key] = capture_graph(model)[0]
    return cache[key]


def _search(graph, row, pins, settings):
    from sapp.api import tp_search_fn
    from sapp.cluster import Cluster
    from sapp.search.joint import joint_search
    cl = Cluster.parse(row.cluster)
    return cl, joint_search(graph, cl, global_batch=row.global_batch, constraints=pins, settings=settings,
                            search_fn=tp_search_fn(), ignore_capacity=row.ran_as_pinned and pins is row.pins)


def _value(row, cl, res, per_layer=None):
    cfg = row.config
    if row.metric == "layer_ms":
        return per_layer * 1e3
    if row.metric == "tokens_per_gpu":     # the sequence as the row states it (cfg["s"])
        return row.global_batch * cfg["s"] / (res.step_time_s * cl.devices)
    rc = row.metric == "tf_per_gpu_hw_recompute"
    if "l" not in cfg:          # not a GPT shape (MoE rows): the captured model FLOPs the plan's MFU counts
        return res.model_flops / (res.step_time_s * cl.devices) / 1e12
    return gpt_flops_per_step(cfg, row.global_batch, recompute=rc) / (res.step_time_s * cl.devices) / 1e12


def _stage_time(res):
    st = res.stages[0]
    return st.fwd_s + st.bwd_s


def price(row, settings, cache, pins=None) -> Priced:
    """The row's figure under `pins` (default: the published configuration)."""
    from sapp.errors import SappError
    pins = row.pins if pins is None else pins
    out = Priced()
    try:
        graph = _graph(row, cache)
        cl, res = _search(graph, row, pins, settings)
        per_layer = None
        if row.metric == "layer_ms":
            # one layer = the same run with two layers minus the run with one (embedding, head, loss and
            # optimizer cancel; tp=8 resharding of the layer stays in)
            g2 = _graph(Row(**{**row.__dict__, "config": {**row.config, "l": 2}}), cache)
            _, res2 = _search(g2, row, pins, settings)
            per_layer = _stage_time(res2) - _stage_time(res)
        out.value = _value(row, cl, res, per_layer)
        out.step_s, out.mfu = res.step_time_s, res.mfu
        out.fits = bool(res.feasible) and res.peak_memory_bytes <= res.capacity_bytes
        out.memory_gb = res.peak_memory_bytes / 1e9
        rc = sorted(set(v for s in res.stages for v in s.recompute.values()))
        out.config = res.config.describe() + (f" rc={'/'.join(rc)}" if rc else "")
        cb = res.comm_by_kind or {}
        out.extra = {"compute_s": res.compute_s, "tp_s": cb.get("reshard", 0.0), "dp_s": cb.get("dp_grad_sync", 0.0),
                     "pp_s": cb.get("pp_p2p", 0.0), "bubble_s": res.bubble_s}
    except SappError as e:
        out.error = str(e).splitlines()[0][:120]
    return out


def run(rows, settings, free=True, compare=None, out=sys.stdout):
    """Price every row pinned (and free); `compare`: other settings priced pinned for a side column."""
    cache, results = {}, []
    for row in rows:
        t0 = time.perf_counter()
        st = row_settings(row, settings)
        pinned = price(row, st, cache)
        fr = price(row, st, cache, pins={}) if (free and row.free) else None
        if compare is not None:
            pinned.extra["compare"] = price(row, compare, cache).value
        results.append((row, pinned, fr, time.perf_counter() - t0))
        print(_line(row, pinned, fr), file=out, flush=True)
    return results


def row_settings(row, settings):
    """The table's settings, with the tensor-parallel overlap and the settings the row's source says it ran."""
    if row.tp_comm_overlap and settings.runtime == "fused":
        settings = dataclasses.replace(settings, runtime="fused+tp-overlap")
    return dataclasses.replace(settings, **row.settings) if row.settings else settings


def _err(pred, pub):
    return (pred / pub - 1.0) * 100.0 if pred == pred and pub else float("nan")


_UNITS = {"tf_per_gpu_model": "TF/GPU (model)", "tf_per_gpu_hw_recompute": "TF/GPU (hw, incl. recompute)",
          "layer_ms": "ms", "tokens_per_gpu": "tokens/s/GPU"}


def _line(row, p, fr):
    e = _err(p.value, row.published)
    flag = "" if abs(e) <= 10 else " (outside ±10%)"
    # the free choice as a speed-up over the pinned run (a TF/GPU "incl. recompute" figure would count
    # recomputation the free plan may not do)
    free = "" if fr is None else (f"{p.step_s / fr.step_s:.2f}x ({fr.config})" if not fr.error and not p.error
                                  else f"— ({fr.error or p.error})")
    pred = f"{p.value:.1f}" if not p.error else f"— ({p.error})"
    mark = f" [needs {row.needs}]" if row.needs else ""
    mfu = f"{100 * p.mfu:.1f}%" if p.mfu == p.mfu else "—"
    cmp_v = p.extra.get("compare")
    cmp_s = f"{cmp_v:.1f} ({_err(cmp_v, row.published):+.0f}%)" if cmp_v is not None and cmp_v == cmp_v else "—"
    x = p.extra
    brk = (f"{x['compute_s']:.3g} / {x['tp_s']:.3g} / {x['dp_s']:.3g} / {x['bubble_s']:.3g}"
           if x.get("compute_s") is not None and row.metric != "layer_ms" else "—")
    return (f"| {row.name}{mark} | {_UNITS[row.metric]} | {row.published:g} | {pred} | {e:+.1f}%{flag} | {cmp_s} | {mfu} | "
            f"{'yes' if p.fits else 'no'} ({p.memory_gb:.1f} GB) | {p.config} | {brk} | {free} |")


HEADER = ("| run | unit | published | predicted (pinned) | error | eager runtime (error) | MFU (pred) | fits (peak) | "
          "pinned configuration as priced | step s: compute / TP comm / DP sync / bubble | free search: speed-up over "
          "pinned (configuration) |\n|---|---|---|---|---|---|---|---|---|---|---|")


def table(results):
    lines, group = [], None
    for row, p, fr, _ in results:
        if row.group != group:
            group = row.group
            lines += ["", f"**{group}** — {row.source}", "", HEADER]
        lines.append(_line(row, p, fr))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="rows whose group or name contains this text")
    ap.add_argument("--runtime", default="fused", help="runtime profile every row is priced with")
    ap.add_argument("--no-free", action="store_true", help="skip the free search's prediction")
    ap.add_argument("--compare", default="eager", help="a second runtime priced pinned beside ('' for none)")
    ap.add_argument("--write", action="store_true", help="write the table into bench/RESULTS.md")
    args = ap.parse_args(argv)
    text = section(args.only, args.runtime, not args.no_free, args.compare)
    if args.write:
        from .results_doc import write
        write("published", text)
    return 0


def section(only=None, runtime="fused", free=True, compare="eager", rows=None) -> str:
    """The section's text: the summary line, NOTES and the table (also printed as it is measured);
    `rows`: these rows instead of every row."""
    from sapp.costmodel import CostSettings
    rows = ROWS + _extra_rows() if rows is None else rows
    if only:
        rows = [r for r in rows if only in r.name or only in r.group]
    settings = CostSettings(precision="bf16-mixed", runtime=runtime)
    compare = CostSettings(precision="bf16-mixed", runtime=compare) if compare else None
    t0 = time.perf_counter()
    print(HEADER)
    results = run(rows, settings, free=free, compare=compare)
    within = [r for r in results if abs(_err(r[1].value, r[0].published)) <= 10]
    summary = (f"{len(within)}/{len(results)} rows within ±10% (runtime={runtime}); "
               f"{time.perf_counter() - t0:.0f} s")
    print(summary)
    return summary + ".\n\n" + NOTES.strip() + "\n" + table(results) + "\n"


if __name__ == "__main__":
    sys.exit(main())
