"""User constraints on the joint search: pin any of the parallel degrees, micro-batches, schedule,
recomputation, ZeRO stage, stage boundaries or placement.  Pinning everything scores an expert's
configuration with the same cost model.  Contradictions are ConstraintError one-liners."""
from __future__ import annotations

import dataclasses
import fnmatch
from dataclasses import dataclass

from sapp.errors import ConstraintError, SappError

# Largest global batch sapp plans for: the joint search enumerates its divisors, and the biggest
# recommendation-model batches in use are ~10^6 samples (4,194,304 here).
MAX_GLOBAL_BATCH = 1 << 22

SCHEDULES = ("gpipe", "1f1b", "interleaved", "dualpipev", "none")

# What each training engine can state in its own configuration (`sapp search --target`): the engine
# table's limits (sapp/search/targets.py, one row per engine)
from sapp.search.targets import POLICIES, TARGETS  # noqa: E402,F401 - this module's names for them


def check_target_runtime(target, runtime):
    """Refuse a runtime profile the target does not run (eager, the default, is sapp's emitter's: a plan
    priced so keeps it through replan).  One place for api.search and replan's pricing
    (sapp/api/replan_price.py), so a re-plan drops its pins where a search refuses them."""
    if target is None or runtime in (None, "eager"):
        return
    allowed = TARGETS[target]["runtimes"]
    if runtime not in allowed:
        raise SappError(f"target {target} runs the {' or '.join(allowed)} runtime, not {runtime}; "
                        f"price it with runtime {allowed[0]!r}")


@dataclass(frozen=True)
class Constraints:
    tp: int | None = None
    dp: int | None = None
    pp: int | None = None
    micro_batches: int | None = None
    schedule: str | None = None           # gpipe | 1f1b | interleaved | none (pp = 1)
    virtual_chunks: int | None = None     # interleaved chunks per device (2 or 4 searched)
    recompute: object = None              # "none" | "selective" | "full" | {module pattern: policy}
    zero: int | None = None
    stages: dict | None = None            # {"layers.0": 0, "layers.12": 1, ...} (block -> stage)
    placement: dict | None = None         # {"embed.*": "host"} pins
    max_tp: int | None = None
    max_dp: int | None = None
    cp: int | None = None                 # context-parallel ranks per sample (the sequence split over them)
    ep: int | None = None                 # expert parallelism (MoE models): EP group size, divides dp
    sp: bool | None = None                # Megatron sequence parallelism on the tp level (tp > 1)
    target: str | None = None             # a training engine (TARGETS): only what it can state is searched
    dp_replicate: int | None = None       # HSDP replicas of the FSDP2 shard group (targets with "hsdp"); 1 = none
    # expert tensor parallelism beside ep at tp > 1 (target megatron): 0 = tp (each expert split over the
    # tp ranks), 1 = each expert whole on one of the ep x tp ranks; None = the search weighs both
    etp: int | None = None

    # ---- construction ---------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d) -> "Constraints":
        if d is None:
            return cls()
        if isinstance(d, Constraints):
            return d
        if not isinstance(d, dict):
            raise ConstraintError(f"constraints must be a dict or Constraints, got {type(d).__name__}")
        known = [f.name for f in dataclasses.fields(cls)]
        aliases = {"micro_batch": "micro_batches", "mb": "micro_batches", "v": "virtual_chunks"}
        kw = {}
        for k, v in d.items():
            k2 = aliases.get(k, k)
            if k2 not in known:
                raise ConstraintError(f"unknown constraint {k!r}; known: {', '.join(known)}")
            if v is not None:
                kw[k2] = v
        return cls(**kw)

    def __post_init__(self):
        self._check_numbers()
        self._check_schedule()
        self._check_recompute()
        self._check_pins()
        self._check_target()

    def _check_numbers(self):
        """Degrees and counts are positive integers, zero a ZeRO stage."""
        for k in ("tp", "dp", "pp", "micro_batches", "virtual_chunks", "max_tp", "max_dp", "cp", "ep", "dp_replicate"):
            v = getattr(self, k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConstraintError(f"constraint {k} must be a positive integer, got {v!r}")
        if self.zero is not None and (isinstance(self.zero, bool) or self.zero not in (0, 1, 2, 3)):
            raise ConstraintError(f"constraint zero must be 0, 1, 2 or 3, got {self.zero!r}")

    def _check_schedule(self):
        """A known schedule, and virtual chunks only where the schedule has them (pinning v > 1 pins
        interleaving; dualpipev's V is 2 chunks)."""
        if self.schedule is not None and (not isinstance(self.schedule, str) or self.schedule not in SCHEDULES):
            raise ConstraintError(f"schedule {self.schedule!r} is unknown; use one of {', '.join(SCHEDULES)}")
        if self.virtual_chunks is not None and self.virtual_chunks > 1 and self.schedule is None:
            # chunks only exist in the interleaved schedule: pinning them pins it (else they were dropped)
            object.__setattr__(self, "schedule", "interleaved")
        if self.schedule == "interleaved" and self.virtual_chunks == 1:
            raise ConstraintError("schedule 'interleaved' needs virtual_chunks >= 2; drop virtual_chunks=1 or use 1f1b")
        if self.schedule == "dualpipev" and self.virtual_chunks not in (None, 2):
            raise ConstraintError(f"schedule 'dualpipev' runs 2 chunks per device (its V), not virtual_chunks="
                                  f"{self.virtual_chunks}; drop virtual_chunks or use 'interleaved'")
        if self.virtual_chunks is not None and self.virtual_chunks > 1 and self.schedule not in (None, "interleaved",
                                                                                                   "dualpipev"):
            raise ConstraintError(f"virtual_chunks={self.virtual_chunks} needs schedule 'interleaved', not {self.schedule!r}")

    def _check_recompute(self):
        """A recompute policy name or a {module pattern: policy} map."""
        r = self.recompute
        if r is not None:
            if isinstance(r, str):
                if r not in POLICIES:
                    raise ConstraintError(f"recompute {r!r} is unknown; use none, selective, full or {{module: policy}}")
            elif isinstance(r, dict):
                for k, v in r.items():
                    if not isinstance(k, str):
                        raise ConstraintError(f"recompute keys must be module patterns (strings), got {k!r}")
                    if not isinstance(v, str) or v not in POLICIES:
                        raise ConstraintError(f"recompute policy {v!r} for {k!r} is unknown; use none, selective or full")
            else:
                raise ConstraintError("recompute must be 'none', 'selective', 'full' or a {module: policy} dict")

    def _check_pins(self):
        """Stage and placement pins are well-formed maps."""
        if self.stages is not None:
            if not isinstance(self.stages, dict) or not all(
                    isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
                    for k, v in self.stages.items()):
                raise ConstraintError("stages must map block names to stage indices >= 0, e.g. {'layers.0': 0}")
        if self.placement is not None:
            if not isinstance(self.placement, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) and v in ("host", "device") for k, v in self.placement.items()):
                raise ConstraintError("placement pins must map module patterns to 'host' or 'device'")

    def _check_target(self):
        """What the target engine can state (TARGETS), HSDP / etp / ep rules, sp and the max_* caps."""
        if self.target is not None and self.target not in TARGETS:
            raise ConstraintError(f"target {self.target!r} is unknown; use one of {', '.join(TARGETS)}")
        lim = self.limits
        if lim and not lim["model_parallel"]:
            for k in ("tp", "pp", "cp", "ep"):
                if getattr(self, k) not in (None, 1):
                    raise ConstraintError(f"target {self.target} has no {k} in its configuration; drop {k}={getattr(self, k)} "
                                          f"or choose another target")
        if (self.dp_replicate or 1) > 1 and not (lim or {}).get("hsdp"):
            raise ConstraintError(f"dp_replicate={self.dp_replicate} (HSDP) is priced for the torchtitan targets only; "
                                  f"pin target torchtitan or drop dp_replicate")
        if (self.dp_replicate or 1) > 1 and self.zero is not None and self.zero < 2:
            raise ConstraintError(f"dp_replicate={self.dp_replicate} replicates FSDP2's shard groups (ZeRO-2/3), not "
                                  f"ZeRO-{self.zero}; drop one of them")
        if self.etp is not None and (isinstance(self.etp, bool) or self.etp not in (0, 1)):
            raise ConstraintError(f"constraint etp must be 0 (expert-tp = tp) or 1 (experts whole), got {self.etp!r}")
        if self.etp == 1 and self.target != "megatron":
            raise ConstraintError("etp=1 (experts whole beside tensor parallelism) is priced for target megatron only; "
                                  "pin target megatron or drop etp")
        if (self.ep or 1) > 1 and (self.zero or 0) > 1:
            raise ConstraintError(f"ep={self.ep} is priced at ZeRO-0/1 (expert gradients reduced over expert-DP, "
                                  f"ZeRO-1's optimizer states sharded there), not ZeRO-{self.zero}; drop one of them")
        if lim and self.zero is not None and self.zero not in lim["zero"]:
            raise ConstraintError(f"target {self.target} runs ZeRO stages {', '.join(map(str, lim['zero']))}, not {self.zero}")
        if lim and self.schedule is not None and self.schedule not in lim["schedules"]:
            raise ConstraintError(f"target {self.target} has no {self.schedule!r} schedule; use one of "
                                  f"{', '.join(lim['schedules'])}")
        if self.sp is not None and not isinstance(self.sp, bool):
            raise ConstraintError(f"constraint sp must be true or false, got {self.sp!r}")
        if self.sp and self.tp == 1:
            raise ConstraintError("sp=true needs tensor parallelism; pin tp > 1 or drop sp")
        if lim and self.sp is False and (self.tp or 1) > 1 and lim["sp"] == "with-tp":
            raise ConstraintError(f"target {self.target} runs sequence parallelism whenever tp > 1 (its tensor-parallel "
                                  f"plan shards the norms' sequence); set sp true or drop tp={self.tp}")
        if lim and self.sp and lim["sp"] == "off":
            raise ConstraintError(f"target {self.target} has no sequence parallelism; drop sp")
        if self.tp and self.max_tp and self.tp > self.max_tp:
            raise ConstraintError(f"tp={self.tp} exceeds max_tp={self.max_tp}; drop one of them")
        if self.dp and self.max_dp and self.dp > self.max_dp:
            raise ConstraintError(f"dp={self.dp} exceeds max_dp={self.max_dp}; drop one of them")

    @property
    def limits(self) -> dict | None:
        """The target engine's limits (TARGETS), or None when no engine is targeted."""
        return TARGETS.get(self.target) if self.target else None

    @staticmethod
    def check_global_batch(value, field="global batch") -> int:
        """A usable global batch (samples per step): a whole number in [1, MAX_GLOBAL_BATCH]."""
        import numbers
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ConstraintError(f"{field} must be a whole number of samples, got {value!r:.40}")
        if not 1 <= value <= MAX_GLOBAL_BATCH:
            raise ConstraintError(f"{field} must be between 1 and {MAX_GLOBAL_BATCH} samples, got {value!r:.40}")
        return int(value)

    def to_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    # ---- checks against a cluster and a model -----------------------------------------------------
    def check(self, devices: int, gpus_per_node: int, blocks=(), global_batch=None) -> None:
        """Raise ConstraintError if the pins cannot hold on this cluster / model."""
        if self.tp is not None:
            if self.tp > gpus_per_node or gpus_per_node % self.tp:
                raise ConstraintError(f"tp={self.tp} does not divide a node of {gpus_per_node} devices; "
                                      f"use a divisor of {gpus_per_node}")
        fixed = [v for v in (self.tp, self.dp, self.pp) if v is not None]
        prod = self.cp or 1
        for v in fixed:
            prod *= v
        if len(fixed) == 3 and prod != devices and self.cp not in (None, 1):
            raise ConstraintError(f"tp*dp*pp*cp = {self.tp}*{self.dp}*{self.pp}*{self.cp} = {prod} but the cluster has "
                                  f"{devices} devices; make the product {devices}")
        if len(fixed) == 3 and prod != devices:
            raise ConstraintError(f"tp*dp*pp = {self.tp}*{self.dp}*{self.pp} = {prod} but the cluster has {devices} "
                                  f"devices; make the product {devices}")
        if devices % prod:
            raise ConstraintError(f"the pinned degrees multiply to {prod}, which does not divide {devices} devices")
        if (self.cp or 1) > 1 and any(v == "host" for v in (self.placement or {}).values()):
            # (search/joint/placement.py: host placement is not emitted beside context parallelism)
            raise ConstraintError(f"cp={self.cp} cannot keep anything on the host; drop the host placement "
                                  f"pins or pin cp=1")
        if self.zero and ((self.dp == 1 and (self.cp or 1) == 1) or devices == 1):
            # ZeRO shards over the data-parallel group: with one replica the plan would say zero 0
            # while these constraints still said otherwise
            raise ConstraintError(f"zero={self.zero} shards model states over the dp group, but dp is 1; "
                                  f"drop zero or allow dp > 1")
        if self.pp is not None and self.pp > 1:
            if not blocks:
                raise ConstraintError(f"pp={self.pp} needs a model with repeated blocks (none were found); use pp=1")
            if self.pp > len(blocks):
                raise ConstraintError(f"pp={self.pp} exceeds the model's {len(blocks)} blocks; use pp <= {len(blocks)}")
        if self.pp == 1 and self.schedule not in (None, "none"):
            raise ConstraintError(f"schedule {self.schedule!r} needs pp > 1; drop it or set pp")
        if self.schedule == "interleaved":
            v = self.virtual_chunks or 2
            p = self.pp or 2
            # (the first / last stage may hold v - 1 beside a chunk of the embedding / head alone:
            # Llama 3's layout, search.joint.configs.interleave_problem says when not)
            if len(blocks) < p * v - 2:
                raise ConstraintError(f"interleaved schedule with {v} chunks x {p} stages needs >= {p * v - 2} blocks; "
                                      f"the model has {len(blocks)}")
        if self.schedule == "dualpipev":
            p = self.pp or 2
            if len(blocks) < 2 * p:
                raise ConstraintError(f"schedule 'dualpipev' cuts the model in 2 x pp = {2 * p} chunks of a block at "
                                      f"least; the model has {len(blocks)} blocks: use pp <= {len(blocks) // 2} or 1f1b")
            if self.zero == 3 and self.target is None:
                raise ConstraintError("schedule 'dualpipev' runs beside ZeRO-0/1/2 in sapp's emitter, not ZeRO-3 ("
                                      "FSDP2's reshard after forward and torch's later weight-gradient pass train "
                                      "wrong); use zero <= 2 or another schedule")
            if self.micro_batches is not None and self.micro_batches < 2 * p:
                raise ConstraintError(f"schedule 'dualpipev' needs micro_batches >= 2 x pp = {2 * p} (torch's "
                                      f"ScheduleDualPipeV), got {self.micro_batches}; raise it or use 1f1b")
        if (self.schedule in ("1f1b", "interleaved") and self.pp is not None and self.pp > 1
                and self.micro_batches is not None and self.micro_batches < self.pp):
            # torch.distributed.pipelining refuses it (and 1F1B with fewer micro-batches is GPipe)
            raise ConstraintError(f"schedule {self.schedule!r} needs micro_batches >= pp ({self.micro_batches} < "
                                  f"{self.pp}); raise micro_batches or use schedule gpipe")
        if self.micro_batches is not None and global_batch is not None:
            dp = self.dp or 1
            if global_batch % (dp * self.micro_batches):
                raise ConstraintError(f"global batch {global_batch} is not divisible by dp*micro_batches = "
                                      f"{dp}*{self.micro_batches}; change one of them")
        if self.stages is not None:
            self.stage_starts(blocks)
        if isinstance(self.recompute, dict):
            for pat in self.recompute:
                if pat != "default" and not any(fnmatch.fnmatchcase(b, pat) or b.startswith(pat + ".") or b == pat
                                                for b in blocks):
                    raise ConstraintError(f"recompute pattern {pat!r} matches no block; blocks look like {blocks[0] if blocks else '(none)'}")

    def stage_starts(self, blocks) -> list:
        """Stage index of every block from the `stages` map (contiguous, from 0, no gaps).
        Returns the per-block stage list."""
        stages = self.stages or {}
        unknown = sorted(set(stages) - set(blocks))
        if unknown:
            raise ConstraintError(f"stages names unknown block(s) {', '.join(unknown[:3])}; blocks look like "
                                  f"{blocks[0] if blocks else '(none)'}")
        if not stages:
            return []
        per, cur = [], None
        first = blocks[0]
        if first not in stages:
            cur = 0
        for b in blocks:
            if b in stages:
                cur = stages[b]
            per.append(cur)
        for x, y in zip(per, per[1:]):
            if y < x or y > x + 1:
                raise ConstraintError(f"stage map is not contiguous (stage {x} is followed by stage {y}); number "
                                      f"stages 0, 1, 2, ... in block order")
        if per[0] != 0:
            raise ConstraintError(f"stage map puts the first block {first} in stage {per[0]}; it always starts stage 0 "
                                  f"(--split-before names where stages 1, 2, ... start: leave {first} out)")
        n = per[-1] + 1
        if self.pp is not None and n != self.pp:
            raise ConstraintError(f"stage map has {n} stages but pp={self.pp}; make them agree")
        return per

    def recompute_policy(self, block: str):
        """The pinned policy of a block, or None if free."""
        r = self.recompute
        if r is None:
            return None
        if isinstance(r, str):
            return r
        best = None
        for pat in sorted(r):
            if pat == "default":
                continue
            if fnmatch.fnmatchcase(block, pat) or block == pat or block.startswith(pat + "."):
                best = r[pat]
        return best if best is not None else r.get("default")
