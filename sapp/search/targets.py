"""The engines sapp exports to and imports from: one row each (`ENGINES`), the one place their names,
versions, files, runtime profiles and what their configurations can state are written.

A row's `module` (under sapp/engines/) reads and writes the engine's file: `parse(text, facts, devices)`
-> EngineConfig, `conform(cfg, names)` -> (the configuration the engine runs, notes), `export(cfg, facts,
names, header=)` -> text.  Everything else reads this table: the CLI's `--target` / `--to` / `--from`
choices, the search's limits for a target (`TARGETS`, what SearchContext and the config enumeration
allow), the field tables' tests.  A new engine is one module and one row (docs/ARCHITECTURE.md, "add an
engine").

What a row states of its configuration: `schedules` the pipeline schedules; `zero` the ZeRO stages;
`sp`: "any" (a choice), "with-tp" (on whenever tp > 1: torchtitan 0.2.2's tensor-parallel plan always
shards the norms' sequence), "off"; `moe_sp` the `sp` rule for a model with experts (Megatron-Core
0.16.1's MoELayer.forward raises in training at tp > 1 without sequence parallelism); `host` the
placement options it runs ("optimizer-host": DeepSpeed's offload_optimizer); `runtimes` the profiles that
price it, the first the default; `ddp_alone` ZeRO-0 (DDP) only as the one parallelism (torchtitan 0.2.2's
parallelize refuses "DDP has not supported > 1D parallelism"); `hsdp` FSDP2 shard groups replicated
(torchtitan's data_parallel_replicate_degree); `builds_model` whether the engine builds the model from
the file (DeepSpeed trains the user's own module, so its export states no architecture)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

POLICIES = ("none", "selective", "full")
ALL_SCHEDULES = ("none", "1f1b", "gpipe", "interleaved")


@dataclass(frozen=True)
class Engine:
    name: str                 # as the CLI takes it (`--target NAME`)
    title: str                # as its users call it
    versions: str             # the releases whose own parsers check what sapp writes (tests/test_engines_validation.py)
    module: str               # the sapp.engines module that parses, conforms and exports its files
    suffix: str               # its configuration file's extension
    runtimes: tuple           # the runtime profiles that price it, the first the default
    schedules: tuple = ALL_SCHEDULES
    zero: tuple = (0, 2, 3)
    sp: str = "any"
    model_parallel: bool = True
    recompute: tuple = POLICIES
    host: tuple = ()
    moe_sp: str | None = None
    ddp_alone: bool = False
    hsdp: bool = False
    builds_model: bool = True

    def limits(self) -> dict:
        """What the search reads of a target (the `TARGETS[name]` mapping)."""
        out = {"schedules": self.schedules, "zero": self.zero, "sp": self.sp, "model_parallel": self.model_parallel,
               "recompute": self.recompute, "host": self.host, "runtimes": self.runtimes}
        for key in ("moe_sp", "ddp_alone", "hsdp"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        return out


ENGINES = {e.name: e for e in (
    Engine("megatron", "Megatron-LM", "core_v0.16.1", "megatron", "args", ("fused", "fused+tp-overlap"),
           schedules=("none", "1f1b", "interleaved"), zero=(0, 1), moe_sp="with-tp"),
    # the current torchtitan release (0.3: sequence parallelism its own switch, replication by FSDP2
    # beside anything); its job is a typed Python file
    Engine("torchtitan", "torchtitan", "0.3.0", "torchtitan_py", "py", ("torchtitan",), hsdp=True,
           schedules=ALL_SCHEDULES + ("dualpipev",)),
    Engine("torchtitan@0.2.2", "torchtitan", "0.2.2", "torchtitan", "toml",
           ("torchtitan-0.2.2", "torchtitan-0.2.2+compile", "torchtitan-2412", "torchtitan-2412+compile"),
           sp="with-tp", ddp_alone=True, schedules=ALL_SCHEDULES + ("dualpipev",),     # (its ScheduleDualPipeV: the V)
           hsdp=True),
    Engine("deepspeed", "DeepSpeed", "0.19.8", "deepspeed", "json", ("eager",), schedules=("none",),
           zero=(0, 1, 2, 3), sp="off", model_parallel=False, recompute=("none", "full"), host=("optimizer-host",),
           builds_model=False),
)}


class _Limits(Mapping):
    """TARGETS: each engine's limits, read live off ENGINES (a row added later is seen)."""

    def __getitem__(self, name):
        return ENGINES[name].limits()

    def __iter__(self):
        return iter(ENGINES)

    def __len__(self):
        return len(ENGINES)


TARGETS = _Limits()


def names() -> tuple:
    """The engines' names, as the CLI offers them."""
    return tuple(ENGINES)
