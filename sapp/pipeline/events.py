"""The schedule simulators' results: timeline events and the step / in-flight figures (shared by
schedule.py and dualpipe.py), and the per-stage send times both read."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Event:
    stage: int
    mb: int
    kind: str        # "fwd" | "bwd" | "recompute" | "comm"
    start: float
    end: float
    chunk: int = 0

    def to_dict(self) -> dict:
        return {"stage": self.stage, "mb": self.mb, "kind": self.kind, "start": self.start,
                "end": self.end, "chunk": self.chunk}


@dataclass
class SimResult:
    step_s: float
    in_flight: list          # per stage: peak micro-batches of activations held (stage units)
    events: list = field(default_factory=list)


def p2p_pairs(p2p_s, p) -> list:
    """Per stage, (forward, backward) seconds of one of its sends.  `p2p_s`: a number (every send
    alike), a (forward, backward) pair, or one pair per stage -- they differ when a boundary sends a
    tensor without a gradient, or where cuts send different tensors (sapp/pipeline/boundary.py)."""
    if not isinstance(p2p_s, (tuple, list)):
        return [(p2p_s, p2p_s)] * p
    if p2p_s and isinstance(p2p_s[0], (tuple, list)):
        return [tuple(x) for x in p2p_s]
    return [tuple(p2p_s)] * p
