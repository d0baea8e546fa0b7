"""The engine-neutral middle of export and import: `EngineConfig` is what a training engine's
configuration says (degrees, batches, schedule and layout, ZeRO, recomputation, offload, precision,
runtime), read off a plan (`from_plan`) or parsed from an engine's file (sapp/engines/<engine>.py),
and priced as that one configuration (`price`: the plan `sapp evaluate` re-scores to the same figure).

Nothing here reads a file or imports an engine: the engine modules turn text into an EngineConfig
(data only: shlex tokens, tomllib, json) and back."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..errors import SappError

# DeepSpeed's bf16 master weights as CostSettings optimizers: master only, master and Adam moments
BF16_MASTER = ("adam-bf16-master", "adam-bf16-states")


class EngineError(SappError, ValueError):
    """An engine configuration sapp cannot read, or a plan element an engine cannot state."""


@dataclass
class EngineConfig:
    engine: str
    global_batch: int
    # degrees as sapp counts them: dp replicas (cp ranks share a sample), ep groups of dp ranks
    tp: int = 1; pp: int = 1; dp: int = 1; cp: int = 1; ep: int = 1  # noqa: E702
    sp: bool = False
    schedule: str = "none"          # none | 1f1b | gpipe | interleaved
    v: int = 1                      # virtual chunks per device (interleaved)
    mbs: int = 1                    # samples per micro-batch per data-parallel replica
    m: int = 1                      # micro-batches per step per replica (gradient accumulation x pipeline)
    zero: int = 0
    recompute: object = "none"      # "none" | "selective" | "full" | {block name: policy} (real names)
    device_blocks: list | None = None   # blocks per pipeline device, in order (pp entries)
    chunk_blocks: list | None = None    # interleaved: blocks per virtual stage j = c * pp + i (pp * v entries)
    offload_optimizer: bool = False
    precision: str = "bf16-mixed"
    optimizer: str = "adam"         # the CostSettings optimizer (DeepSpeed's bf16 master weights: BF16_MASTER)
    grad_fp32: bool = False         # gradients held and reduced in fp32 (Megatron without --grad-reduce-in-bf16)
    runtime: str = "eager"
    fp8: str = ""                   # FP8 linear layers: "" | "tensorwise" | "delayed" | "blockwise" (sapp/engines/fp8.py)
    rep: int = 1                    # HSDP: replicas of the FSDP2 shard group (dp / rep ranks; torchtitan only)
    recompute_modules: tuple = ()   # "selective" as Megatron's named modules (sorted); () = the attention core
    etp: int = 0                    # beside ep at tp > 1: 0 = experts split over tp (Megatron's default), 1 = whole
    moe_a2a_overlap: bool = False   # Megatron's --overlap-moe-expert-parallel-comm (CostSettings.moe_a2a_overlap)
    delay_wgrad: bool = False       # Megatron's --delay-wgrad-compute (beside it)
    notes: list = field(default_factory=list)

    def __post_init__(self):
        """Every number an engine file states, typed and bounded before anything uses it (the same bounds
        as `sapp search`): a batch of 2e21 ran divisors() for minutes, a degree of 0 divided by zero."""
        from sapp.search.constraints import MAX_GLOBAL_BATCH, Constraints
        Constraints.check_global_batch(self.global_batch, f"{self.engine} global batch")
        for k in ("tp", "pp", "dp", "cp", "ep", "v", "mbs", "m", "rep"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_GLOBAL_BATCH:
                raise EngineError(f"{self.engine} configuration: {k} must be a whole number from 1 to "
                                  f"{MAX_GLOBAL_BATCH}, got {str(v)[:40]!r}")
        if self.zero not in (0, 1, 2, 3):
            raise EngineError(f"{self.engine} configuration: ZeRO stage must be 0-3, got {str(self.zero)[:40]!r}")

    def replace(self, **kw) -> "EngineConfig":
        return dataclasses.replace(self, notes=list(self.notes), **kw)

    def describe(self) -> str:
        sched = "" if self.pp == 1 else f" {self.schedule}" + (f" v={self.v}" if self.v > 1 else "")
        rc = self.recompute if isinstance(self.recompute, str) else "per-block"
        extra = "".join(f" {k}={getattr(self, k)}" for k in ("cp", "ep") if getattr(self, k) > 1)
        extra += f" HSDP {self.rep} replicas x {self.dp * self.cp // self.rep} shards" if self.rep > 1 else ""
        return (f"tp={self.tp} pp={self.pp} dp={self.dp}{extra}{' sp' if self.sp else ''}{sched} "
                f"micro-batches {self.m} x {self.mbs} ZeRO-{self.zero} recompute {rc}"
                + (" offload-optimizer" if self.offload_optimizer else "")
                + (" fp32-grads" if self.grad_fp32 and self.precision != "fp32" else "")
                + (f" fp8 {self.fp8}" if self.fp8 else ""))


# ---- a plan as an engine configuration -------------------------------------------------------------
def _ordered_stages(plan):
    return sorted(plan["pipeline"].get("stages") or [], key=lambda s: s["index"])


def block_order(plan) -> list:
    """The plan's blocks in model order (interleaved plans list them per virtual stage, in order)."""
    return [b for s in _ordered_stages(plan) for b in s.get("blocks") or []]


def from_plan(plan, engine: str) -> EngineConfig:
    """What `plan` runs, in engine-neutral terms (before the engine's `conform`)."""
    par, pipe, st = plan["parallel"], plan["pipeline"], plan._d.get("settings") or {}
    pp = par["pp"]
    sched = pipe.get("schedule", "none") if pp > 1 else "none"
    v = (pipe.get("virtual_chunks") or 1) if sched == "interleaved" else 2 if sched == "dualpipev" else 1
    stages = _ordered_stages(plan)
    chunk = device = None
    if pp > 1 and stages:
        if sched in ("interleaved", "dualpipev") and len(stages) == pp * v:
            chunk = [len(s.get("blocks") or []) for s in stages]
            # DualPipeV's V: rank i runs stages i and 2 pp - 1 - i (pipeline.dualpipe.rank_of)
            device = [sum(chunk[s] for s in ((i, 2 * pp - 1 - i) if sched == "dualpipev" else
                                              (c * pp + i for c in range(v)))) for i in range(pp)]
        else:
            device = [len(s.get("blocks") or []) for s in stages]
    rc = plan["recompute"] or {}
    default, per = rc.get("default", "none"), dict(rc.get("blocks") or {})
    recompute = default if not per else {b: per.get(b, default) for b in block_order(plan)}
    if par["tp"] > 1 and not plan._d.get("tp_modules"):
        raise EngineError(f"the plan's tp={par['tp']} shards nothing (priced as replication), which {engine} would "
                          f"shard; search again with --target {engine} --max-tp 1 or a larger model")
    option = ((plan["placement"] or {}).get("predicted") or {}).get("option", "device")
    if option not in ("device", "optimizer-host"):
        raise EngineError(f"the plan keeps {option.replace('-host', '')} tables on the host, which {engine} cannot "
                          f"state; search again with --target {engine}")
    gb = plan["model"].get("global_batch")
    rep = par.get("dp_replicate", 1)
    if rep > 1 and not engine.startswith("torchtitan"):
        raise EngineError(f"the plan shards over groups of {par['dp'] // rep} and all-reduces across {rep} replicas "
                          f"(torchtitan's HSDP), which {engine} cannot state; search again with --target {engine}")
    opt = st.get("optimizer", "adam")
    if opt == "adam-bf16" and not engine.startswith("torchtitan"):
        raise EngineError(f"the plan trains in pure bf16 (weights and Adam's moments in bf16, no fp32 master: torchtitan's "
                          f"training.dtype bfloat16), which {engine} cannot state; search again with --target {engine}")
    if opt in BF16_MASTER and engine != "deepspeed":
        raise EngineError(f"the plan keeps bf16 master weights (priced from DeepSpeed's bf16 section), which {engine} "
                          f"cannot state here; search again with --target {engine}")
    return EngineConfig(engine=engine, global_batch=gb, tp=par["tp"], pp=pp, dp=par["dp"], cp=par.get("cp", 1),
                        ep=par.get("ep", 1), sp=bool(par.get("sp", False)), schedule=sched, v=v,
                        mbs=pipe.get("micro_batch_size") or gb // (par["dp"] * pipe["micro_batches"]),
                        m=pipe["micro_batches"], zero=plan["zero"], recompute=recompute, device_blocks=device,
                        chunk_blocks=chunk, offload_optimizer=option == "optimizer-host",
                        precision=st.get("precision", "bf16-mixed"), optimizer=opt, runtime=st.get("runtime", "eager"),
                        grad_fp32=bool(st.get("grad_fp32", False)), fp8=st.get("fp8") or "", rep=rep,
                        recompute_modules=tuple(st.get("recompute_modules") or ()), etp=par.get("etp", 0),
                        moe_a2a_overlap=bool(st.get("moe_a2a_overlap")), delay_wgrad=bool(st.get("delay_wgrad")))


def even_split(n, parts) -> list | None:
    """n blocks in `parts` equal runs, or None."""
    return [n // parts] * parts if parts and n % parts == 0 else None


def counted_recompute(blocks_per_run, names, first_full) -> dict:
    """{block: policy}: full on the first `first_full` blocks of every run (a stage or a virtual stage:
    Megatron's --recompute-method block), none on the rest."""
    out, pos = {}, 0
    for k in blocks_per_run:
        for q in range(k):
            out[names[pos + q]] = "full" if q < first_full else "none"
        pos += k
    return out


def uniform_policy(recompute) -> str | None:
    """The one policy every block has, or None for a mix."""
    if isinstance(recompute, str):
        return recompute
    pols = set(recompute.values())
    return pols.pop() if len(pols) == 1 else None


# ---- pricing one engine configuration --------------------------------------------------------------
def pins(ecfg: EngineConfig, block_names) -> dict:
    """The configuration as sapp constraints (Constraints.from_dict): re-scoring it is a search with
    exactly this configuration left.  Per-device block counts are pinned as a stage map; an
    interleaved plan's per-block recomputation is moved to the block at the same position of the
    contiguous layout the joint search prices (api.from_plan._interleaved_rename's rule)."""
    out = {"tp": ecfg.tp, "dp": ecfg.dp, "pp": ecfg.pp, "cp": ecfg.cp, "ep": ecfg.ep, "sp": ecfg.sp,
           "micro_batches": ecfg.m, "zero": ecfg.zero, "target": ecfg.engine,
           "placement": {"optimizer": "host" if ecfg.offload_optimizer else "device"}, "dp_replicate": ecfg.rep,
           **({"etp": ecfg.etp} if ecfg.ep > 1 and ecfg.tp > 1 else {})}
    if ecfg.pp > 1:
        out["schedule"] = ecfg.schedule
        if ecfg.schedule == "interleaved":
            out["virtual_chunks"] = ecfg.v
    if ecfg.device_blocks and ecfg.pp > 1:
        if sum(ecfg.device_blocks) != len(block_names):
            raise EngineError(f"the {ecfg.engine} layout places {sum(ecfg.device_blocks)} layers but the model has "
                              f"{len(block_names)}")
        stages, pos = {}, 0
        for i, k in enumerate(ecfg.device_blocks):
            if k < 1:
                raise EngineError(f"the {ecfg.engine} layout leaves pipeline stage {i} without layers; sapp prices "
                                  f"every stage with at least one layer")
            stages[block_names[pos]] = i
            pos += k
        out["stages"] = stages
    rc = ecfg.recompute
    if isinstance(rc, dict):
        if ecfg.schedule in ("interleaved", "dualpipev") and ecfg.chunk_blocks:
            rc = {_contiguous_name(ecfg, block_names, b): p for b, p in rc.items()}
        out["recompute"] = rc
    else:
        out["recompute"] = rc
    return out


def _contiguous_name(ecfg, names, block):
    pp, chunks = ecfg.pp, ecfg.chunk_blocks
    starts = [sum(chunks[:j]) for j in range(len(chunks))]
    real = []
    for i in range(pp):
        for j in ((i, 2 * pp - 1 - i) if ecfg.schedule == "dualpipev" else (c * pp + i for c in range(ecfg.v))):
            real += names[starts[j]:starts[j] + chunks[j]]
    return dict(zip(real, names)).get(block, block)


def _check_modules(graph, mods):
    """Named recomputed modules (Megatron's --recompute-modules) the model has no counterpart for: one line."""
    if not mods:
        return
    from ..pipeline.profile import attention_core
    from ..recompute.modules import missing_modules
    blocks = [names for names in (graph.blocks or {}).values()]
    missing = missing_modules(graph, blocks, mods, attention_core)
    if missing:
        raise EngineError(f"--recompute-modules {' '.join(missing)}: the model has no such module to recompute "
                          f"(sapp/recompute/modules.py: a dense MLP for mlp, an MoE layer for moe / moe_act / "
                          f"layernorm, shared experts for shared_experts); leave {'it' if len(missing) == 1 else 'them'} out")


def price(graph, cluster, ecfg: EngineConfig, *, name: str, notes=()):
    """The sapp Plan of exactly `ecfg` on `cluster` (capacity not enforced: a configuration that does
    not fit is priced and says so)."""
    from .. import api
    from sapp.search.constraints import Constraints
    from ..costmodel import CostSettings
    from ..pipeline.units import split_units
    from ..search.joint import Config
    names = [u.name for u in split_units(graph) if u.kind == "block"]
    cons = Constraints.from_dict(pins(ecfg, names))
    api.check_fp8(ecfg.fp8, cluster)       # a file training FP8 on a cluster without FP8 tensor cores: one line
    _check_modules(graph, ecfg.recompute_modules)
    settings = CostSettings(precision=ecfg.precision, runtime=ecfg.runtime, dropout_noise=not cluster.fused_dropout,
                            optimizer=ecfg.optimizer, grad_fp32=ecfg.grad_fp32 and ecfg.precision != "fp32",
                            fp8=ecfg.fp8, recompute_modules=ecfg.recompute_modules,
                            moe_a2a_overlap=ecfg.moe_a2a_overlap, delay_wgrad=ecfg.delay_wgrad)
    cfg = Config(ecfg.pp, ecfg.dp, ecfg.tp, ecfg.m, ecfg.mbs, ecfg.schedule if ecfg.pp > 1 else "none", ecfg.v,
                 ecfg.zero, cp=ecfg.cp, ep=ecfg.ep, sp=ecfg.sp, rep=ecfg.rep,
                 etp=ecfg.etp if ecfg.ep > 1 and ecfg.tp > 1 else 0)
    from ..search.joint.single import score_config
    allowed, res = score_config(graph, cluster, ecfg.global_batch, cons, settings, cfg, search_fn=api.tp_search_fn())
    if not allowed or res is None:
        raise EngineError(f"sapp cannot price this {ecfg.engine} configuration ({ecfg.describe()}): the degrees, "
                          f"micro-batches and layout must divide the cluster, batch and layers evenly")
    res.capacity_bytes = cluster.usable_memory      # (scored with the capacity lifted: the device's, for the plan)
    plan = api.build_plan(graph, cluster, res, name=name, global_batch=ecfg.global_batch, constraints=cons,
                          settings=settings)
    if ecfg.tp > 1 and not plan._d.get("tp_modules"):
        raise EngineError(f"tensor parallelism {ecfg.tp} finds nothing to shard in this model (sapp would price it as "
                          f"replication, the engine would shard); use tensor parallelism 1")
    extra = list(notes) + list(ecfg.notes)
    if res.peak_memory_bytes > cluster.usable_memory:
        from ..units import fmt_bytes
        extra.append(f"DOES NOT FIT: peak {fmt_bytes(res.peak_memory_bytes)} per device of "
                     f"{fmt_bytes(cluster.usable_memory)} usable")
    if extra:
        plan._d["notes"] = extra + list(plan._d.get("notes") or [])
    return plan


# ---- comparing two plans in one line ---------------------------------------------------------------
def changes(a, b) -> list:
    """What plan b changes from plan a, as short phrases ("tp 8 -> 4", "vp 3", "selective recompute")."""
    pa, pb = a["parallel"], b["parallel"]
    out = []
    for k in ("tp", "pp", "dp", "cp", "ep", "dp_replicate"):
        x, y = pa.get(k, 1), pb.get(k, 1)
        if x != y:
            out.append(f"{k} {x} \u2192 {y}")
    if bool(pa.get("sp")) != bool(pb.get("sp")):
        out.append("sequence parallel " + ("on" if pb.get("sp") else "off"))
    qa, qb = a["pipeline"], b["pipeline"]
    sa = qa["schedule"] + (f" v={qa.get('virtual_chunks')}" if qa["schedule"] == "interleaved" else "")
    sb = qb["schedule"] + (f" v={qb.get('virtual_chunks')}" if qb["schedule"] == "interleaved" else "")
    if sa != sb:
        out.append(f"schedule {sa} \u2192 {sb}")
    if (qa["micro_batches"], qa.get("micro_batch_size")) != (qb["micro_batches"], qb.get("micro_batch_size")):
        out.append(f"micro-batches {qa['micro_batches']}x{qa.get('micro_batch_size')} \u2192 "
                   f"{qb['micro_batches']}x{qb.get('micro_batch_size')}")
    if a["zero"] != b["zero"]:
        out.append(f"ZeRO-{a['zero']} \u2192 ZeRO-{b['zero']}")
    ra, rb = a["recompute"], b["recompute"]
    if (ra.get("default"), ra.get("blocks")) != (rb.get("default"), rb.get("blocks")):
        mix = f" (+{len(rb['blocks'])} blocks differ)" if rb.get("blocks") else ""
        out.append(f"recompute {ra.get('default')}{' mix' if ra.get('blocks') else ''} \u2192 {rb.get('default')}{mix}")
    oa = ((a["placement"] or {}).get("predicted") or {}).get("option", "device")
    ob = ((b["placement"] or {}).get("predicted") or {}).get("option", "device")
    if oa != ob:
        out.append(f"placement {oa} \u2192 {ob}")
    fa, fb = (a._d.get("settings") or {}).get("fp8") or "bf16", (b._d.get("settings") or {}).get("fp8") or "bf16"
    if fa != fb:
        out.append(f"linears {fa} \u2192 {fb}")
    return out


def comparison(yours, best) -> str:
    """"your configuration 18.1 s/step, best found 15.2 s (1.19x): tp 8 -> 4, ..." (one line)."""
    from ..units import fmt_time
    ta, tb = yours["predicted"]["step_time_s"], best["predicted"]["step_time_s"]
    what = changes(yours, best)
    ratio = ta / tb if tb > 0 else float("inf")
    if not what or ta <= tb:
        return (f"your configuration {fmt_time(ta)}/step; the search found nothing faster "
                f"(best {fmt_time(tb)}{', the same configuration' if not what else ''})")
    return f"your configuration {fmt_time(ta)}/step, best found {fmt_time(tb)} ({ratio:.2f}\u00d7): " + ", ".join(what)
