"""The training program under context parallelism: its data shard is rows (dp) and tokens (cp)."""
from __future__ import annotations

from dataclasses import dataclass

from ..runtime.program import Program
from .cp import shard_sequence


@dataclass(eq=False, repr=False, kw_only=True)
class CPProgram(Program):
    """Program whose data shard is this rank's rows (dp) and tokens (cp).  `dp` is the gradient
    group dp·cp (what the emitter wraps); `cp`, `dp_only`, `cp_rank` the split of it."""
    cp: int
    dp_only: int
    cp_rank: int
    cp_checked: bool = False       # the attention ran through the cp path (checked after the first step)

    @property
    def dp_rank(self) -> int:
        return self.coords[1] // self.cp

    def step(self, inputs, targets) -> float:
        loss = super().step(inputs, targets)
        if not self.cp_checked:      # attention ran through the cp path: checked once
            from .cp_hf import check_ran
            check_ran(self.modules)
            self.cp_checked = True
        return loss

    @property
    def data_ranks(self) -> int:
        return self.dp_only

    def _local(self, rows):
        return self.shard_tokens(rows)

    def shard_tokens(self, *tensors):
        """This cp rank's tokens (load-balanced chunks) of [batch, seq, ...] tensors already cut to
        its dp rows; tensors without a sequence axis pass unchanged."""
        out = []
        for t in tensors:
            if isinstance(t, (tuple, list)):
                out.append(type(t)(self.shard_tokens(*t)) if len(t) != 1 else (self.shard_tokens(t[0]),))
                continue
            out.append(shard_sequence(t, self.cp, self.cp_rank) if t.dim() >= 2 else t)
        return out[0] if len(out) == 1 else tuple(out)
