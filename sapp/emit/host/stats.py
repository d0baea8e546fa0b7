"""Host placement's timings (lookup, h2d, d2h, optimizer, offload copies), per model."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class HostStats:
    totals: dict = field(default_factory=dict)

    def add(self, key, seconds):
        self.totals[key] = self.totals.get(key, 0.0) + seconds

    def take(self) -> dict:
        """The accumulated timings since the last take, and reset."""
        out, self.totals = dict(sorted(self.totals.items())), {}
        return out
