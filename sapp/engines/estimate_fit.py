"""Plans whose Megatron-LM startup estimate fits (`sapp search --target megatron --fit-engine-estimate`).

Megatron-LM prints a theoretical memory footprint when a job starts (megatron_estimate.py ports it).
That figure leaves out context parallelism, full recomputation and bf16 main_grads, so for plans that
use them it is well above what the job holds (and above what sapp prices). Some users want Megatron's
own printout to say the job fits. This module gives the joint search a predicate on a priced
configuration: Megatron's estimate of the argument file the configuration exports to is at most the
cluster's usable memory. The search keeps only configurations that pass both sapp's price and this
estimate, so the plan is the fastest that satisfies both. The search package only calls the predicate;
it never imports this module.

The arguments are built from the configuration the way megatron.export writes them. The estimator reads
tp, pp, cp, dp, the interleave, sequence parallelism, `--recompute-granularity selective` (its
activation formula only covers sequence parallelism with selective recomputation), the distributed
optimizer, the micro-batch and global batch, and the model's sizes. Megatron recomputes one way on
every layer, so a stage with a per-block mix is selective only when every block is selective.
"""
from __future__ import annotations

from .mapping import EngineError
from .megatron import NO_ARCH, tokens
from .megatron_estimate import estimate
from .megatron_model import model_args


def config_args(arch: dict, cfg, stages, *, precision: str, grad_fp32: bool) -> dict:
    """{flag: value} of the argument file a priced configuration exports to, as far as the estimator
    reads it."""
    a = tokens("\n".join(model_args(arch, cfg.tp)))
    a.update({"--tensor-model-parallel-size": cfg.tp, "--pipeline-model-parallel-size": cfg.pp,
              "--context-parallel-size": cfg.cp, "--micro-batch-size": cfg.mbs,
              "--global-batch-size": cfg.m * cfg.mbs * cfg.dp})
    if arch.get("experts"):
        whole = getattr(cfg, "etp", 0) == 1 and cfg.tp > 1 and cfg.ep > 1   # experts whole on ep x tp ranks
        a["--expert-model-parallel-size"] = cfg.ep * cfg.tp if whole else cfg.ep
        a["--expert-tensor-parallel-size"] = 1 if whole or cfg.ep == 1 else cfg.tp
    if cfg.sp and cfg.tp > 1:
        a["--sequence-parallel"] = True
    if cfg.pp > 1 and cfg.schedule == "interleaved" and cfg.v > 1:
        a["--num-virtual-stages-per-pipeline-rank"] = cfg.v
    pols = [p for st in stages for p in (st.recompute or {}).values()]
    if pols and all(p == "selective" for p in pols):
        a["--recompute-granularity"] = "selective"
    elif any(p == "full" for p in pols):
        a["--recompute-granularity"] = "full"
    if cfg.zero == 1:
        a["--use-distributed-optimizer"] = True
    if precision == "bf16-mixed" and not grad_fp32:
        a["--grad-reduce-in-bf16"] = True
    return a


def megatron_estimate_bytes(arch: dict, res, *, precision: str, grad_fp32: bool, devices: int,
                            version: str = "main") -> float:
    """Megatron-LM's theoretical memory estimate (`version`: main's formula or core_v0.16.1's), in bytes,
    of the configuration `res` prices."""
    a = config_args(arch, res.config, res.stages, precision=precision, grad_fp32=grad_fp32)
    return estimate(a, world_size=devices, vocab=int(arch["vocab"]), version=version)["total_bytes"]


def megatron_fit(arch: dict, cluster, *, precision: str, grad_fp32: bool, version: str = "main"):
    """The joint search's `fits(res)` predicate: Megatron's estimate of `res` within usable memory.
    core_v0.16.1's formula divides the routed experts by tp only, not by ep (main's divides by both)."""
    cap = cluster.usable_memory

    def fits(res) -> bool:
        try:
            return megatron_estimate_bytes(arch, res, precision=precision, grad_fp32=grad_fp32,
                                           devices=cluster.devices, version=version) <= cap
        except EngineError:          # a configuration Megatron cannot state (a tp not dividing the vocabulary)
            return False
    fits.version = version
    return fits


def megatron_fit_for(graph, cluster, *, precision: str, version: str = "main"):
    """megatron_fit for a captured model (the architecture its export writes); EngineError, one line, for
    a model Megatron does not build."""
    # (the package's arch_facts / block_names, read from their own modules: the package imports this one)
    from ..pipeline.units import split_units
    from .arch import architecture
    layers = sum(1 for u in split_units(graph) if u.kind == "block")
    arch = architecture(graph.name, graph.meta, layers)       # EngineError, one line, where it cannot
    if arch is None:
        raise EngineError(NO_ARCH)
    return megatron_fit(arch, cluster, precision=precision, grad_fp32=False, version=version)


def file_estimate_bytes(text: str, devices: int, version: str = "main") -> float:
    """Megatron-LM's estimate (main's formula or core_v0.16.1's) of an exported argument file on `devices` GPUs."""
    a = tokens(text)
    return estimate(a, world_size=devices, vocab=int(a["--vocab-size"]), version=version)["total_bytes"]
