"""What the joint search returns: a configuration, its stages and the priced step."""
from __future__ import annotations

from dataclasses import dataclass, field

SCHED_ORDER = {"none": 0, "1f1b": 1, "interleaved": 2, "gpipe": 3, "dualpipev": 4}


@dataclass(frozen=True)
class Config:
    pp: int
    dp: int
    tp: int
    m: int                  # micro-batches per step
    mbs: int                # micro-batch size per dp replica
    schedule: str           # none | gpipe | 1f1b | interleaved | dualpipev
    v: int                  # virtual chunks (interleaved; dualpipev: 2, its V), else 1
    zero: int
    cp: int = 1             # context-parallel ranks sharing each sample's sequence (sapp/costmodel/context.py)
    ep: int = 1             # expert parallelism: EP groups of ep dp ranks share each MoE layer's experts
    sp: bool = False        # Megatron sequence parallelism on the tp level (tp > 1 only)
    # HSDP (torchtitan's data_parallel_replicate_degree beside its shard degree): FSDP2 shards over
    # groups of dp x cp / rep ranks and all-reduces each gradient shard across the rep replicas
    rep: int = 1
    # expert tensor parallelism beside ep at tp > 1 (Megatron's --expert-tensor-parallel-size): 0 = tp, each
    # expert split over the tp ranks (Megatron's default); 1 = experts whole on each of the ep x tp ranks
    etp: int = 0

    @property
    def dp_cp(self):
        """Ranks a stage's parameters are sharded over and reduce-scattered within (the ZeRO group, the
        profile's dp): dp x cp, or its shard group under HSDP (dp x cp / rep)."""
        return self.dp * self.cp // self.rep

    def key(self):
        return (self.pp, self.tp, self.m, SCHED_ORDER[self.schedule], self.v, self.zero, self.cp, self.ep, self.sp,
                self.rep, self.etp)

    def describe(self):
        # the schedule only for pipelines and spelled out: a bare "none" read as the recompute policy
        s = "" if self.pp == 1 else f" schedule={self.schedule}" + (
            f"(v={self.v})" if self.v > 1 and self.schedule == "interleaved" else "")
        c = f" cp={self.cp}" if self.cp > 1 else ""
        e = f" ep={self.ep}" if self.ep > 1 else ""
        e += f" dp_replicate={self.rep}" if self.rep > 1 else ""
        e += f" etp={self.etp}" if self.etp else ""
        return (f"pp={self.pp} dp={self.dp}{c} tp={self.tp}{e} m={self.m} mbs={self.mbs}{s} zero={self.zero}"
                + (" sp" if self.sp else ""))


@dataclass
class StageResult:
    index: int
    units: list             # unit names (blocks and glue)
    blocks: list
    fwd_s: float            # per micro-batch
    bwd_s: float            # per micro-batch, recomputation included
    recompute_s: float      # per micro-batch
    send_s: float           # per micro-batch p2p charged to this stage
    grad_sync_s: float      # per step
    in_flight: float
    memory: dict            # params, grads, optimizer, activations, transient
    recompute: dict         # block -> policy
    param_tensors: int = 0  # trainable parameter tensors held (the optimizer dispatches per tensor)
    chunks: list = None     # interleaved: blocks per chunk (chunk c runs as virtual stage c * pp + i)
    send_bytes: tuple = (0.0, 0.0)  # bytes of one forward / backward send of this stage (per device)
    chunk_shares: list = None   # interleaved: fractions of the stage's time its chunks take

    @property
    def memory_bytes(self):
        return sum(self.memory.values())


@dataclass
class JointResult:
    config: Config
    step_time_s: float
    stages: list
    compute_s: float = 0.0
    comm_s: float = 0.0
    bubble_s: float = 0.0
    grad_sync_s: float = 0.0
    p2p_s: float = 0.0
    host_s: float = 0.0
    optimizer_s: float = 0.0          # device-side optimizer update (part of compute_s)
    comm_by_kind: dict = field(default_factory=dict)   # reshard / dp_grad_sync / pp_p2p / loss_sync seconds
    peak_memory_bytes: float = 0.0
    capacity_bytes: float = 0.0
    model_flops: float = 0.0          # per step (fwd + bwd, no recomputation)
    mfu: float = 0.0
    profile: object = None
    placement: object = None
    feasible: bool = True
    stats: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    alternatives: list = field(default_factory=list)
    overlap: str = "none"             # gradient sync overlap rule priced (costmodel.gradsync.overlap_rule)
    scatter_gather: bool = False      # stage boundaries send 1/tp per tp rank + all-gather (numbers.boundary_send)
    boundary_bytes: float = 0.0       # bytes one device sends per forward stage-boundary send (per micro-batch)
    boundary_grad_bytes: float = 0.0  # ... per backward send (less when a side tensor has no gradient)

    @property
    def memory(self):
        worst = max(self.stages, key=lambda s: s.memory_bytes)
        return dict(worst.memory)

    def __repr__(self):
        return (f"JointResult({self.config.describe()}, step_time_s={self.step_time_s:.6g}, "
                f"peak_memory_bytes={self.peak_memory_bytes:.6g}, mfu={self.mfu:.3g})")
