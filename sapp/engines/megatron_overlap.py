"""Megatron-Core's MoE all-to-all overlap (--overlap-moe-expert-parallel-comm, --delay-wgrad-compute) read
from and written to an argument file, as sapp prices it (CostSettings.moe_a2a_overlap / delay_wgrad:
sapp/pipeline/overlap.py, search/joint/ep.py).  Megatron-Core's own conditions (core_v0.16.1
TransformerConfig.__post_init__) are refused in one line on both sides, so an exported file is one its
parser accepts."""
from __future__ import annotations

from ..pipeline.overlap import overlap_problem
from .mapping import EngineError

OVERLAP, DELAY = "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"


def _problem(ecfg):
    rc = ecfg.recompute
    full = rc == "full" or (isinstance(rc, dict) and "full" in rc.values())
    return overlap_problem(pp=ecfg.pp, schedule=ecfg.schedule, v=ecfg.v, ep=ecfg.ep, full_recompute=full,
                           mixed=ecfg.precision != "fp32")


def overlap_flags(ecfg) -> list:
    """The flags of a plan priced with the overlap (none without it); EngineError where Megatron refuses it."""
    if not ecfg.moe_a2a_overlap:
        return []
    why = _problem(ecfg)
    if why:
        raise EngineError(f"{OVERLAP}: {why}; search again with --target megatron")
    return [OVERLAP] + ([DELAY] if ecfg.delay_wgrad else [])


def read_overlap(args: dict, ecfg) -> None:
    """ecfg.moe_a2a_overlap / delay_wgrad from the file; EngineError, in Megatron's terms, where it refuses them."""
    ecfg.moe_a2a_overlap, ecfg.delay_wgrad = bool(args.get(OVERLAP)), bool(args.get(DELAY))
    if ecfg.delay_wgrad and not ecfg.moe_a2a_overlap:
        raise EngineError(f"{DELAY} without {OVERLAP}: Megatron-Core refuses it (overlap_moe_expert_parallel_comm must "
                          f"be enabled when enabling delay_wgrad_compute); add {OVERLAP} or drop {DELAY}")
    if not ecfg.moe_a2a_overlap:
        return
    dispatcher = args.get("--moe-token-dispatcher-type", "allgather")
    if dispatcher not in ("alltoall", "flex"):
        raise EngineError(f"{OVERLAP} with --moe-token-dispatcher-type {dispatcher}: Megatron-Core runs it with the "
                          f"alltoall or flex dispatcher only; set --moe-token-dispatcher-type alltoall")
    why = _problem(ecfg)
    if why:
        raise EngineError(f"{OVERLAP}: {why} (Megatron-Core refuses this file)")
