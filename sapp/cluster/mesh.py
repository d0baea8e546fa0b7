"""The device mesh a sharding strategy is expressed on.

A stage's devices are factored into *levels*: the inter-node part first, then the intra-node part,
each split into its prime factors (largest first), so a level is a k-way cut for any k and a group of
levels can form any divisor of the device count.  A strategy for one op is a tuple with one choice per
level: the name of the op dim split across that level, or None (replicate)."""
from __future__ import annotations

from dataclasses import dataclass

from sapp.errors import SappError


def prime_factors(n: int) -> list:
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return sorted(out, reverse=True)


@dataclass(frozen=True)
class Level:
    size: int
    link: str        # "inter" (crosses nodes) or "intra" (inside a node)


@dataclass(frozen=True)
class Mesh:
    levels: tuple

    @property
    def size(self) -> int:
        n = 1
        for lv in self.levels:
            n *= lv.size
        return n

    def __len__(self):
        return len(self.levels)

    @classmethod
    def for_devices(cls, cluster, n: int) -> "Mesh":
        """Mesh for `n` devices packed densely onto `cluster` (a stage takes whole nodes once it is
        larger than one node)."""
        if n <= 0:
            raise SappError(f"device count must be positive, got {n}")
        gpn = cluster.gpus_per_node
        if n <= gpn:
            if gpn % n:
                raise SappError(f"{n} devices do not divide a node of {gpn}; use a divisor of {gpn} or whole nodes")
            inter, intra = 1, n
        else:
            if n % gpn:
                raise SappError(f"{n} devices are not whole nodes of {gpn}; use a multiple of {gpn}")
            inter, intra = n // gpn, gpn
        levels = [Level(p, "inter") for p in prime_factors(inter)] + [Level(p, "intra") for p in prime_factors(intra)]
        return cls(tuple(levels))

    def to_dict(self) -> dict:
        return {"levels": [{"size": lv.size, "link": lv.link} for lv in self.levels]}

    @classmethod
    def from_dict(cls, d) -> "Mesh":
        return cls(tuple(Level(int(x["size"]), str(x["link"])) for x in d["levels"]))
