"""Clusters of several device groups (mixed kinds: A100s beside H100s).

A spec joins homogeneous specs with '+':  `a100-80g:nodes=16+h100-80g:nodes=8`; a JSON file holds
`{"name", "groups": [cluster description with a unique "name", ...], "link": {"bw", "latency"}}`.
Each group is an ordinary Cluster (preset or calibrated figures) that the homogeneous search plans
alone; `link` is what one device of a group gets towards the other groups.  Without it the link is
the slowest group's inter-node link (the lowest inter_bw, the highest inter_latency): traffic
between groups crosses both groups' NICs, and the slower one bounds it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from sapp import schema
from sapp.cluster import MAX_DEVICES, MAX_FILE_BYTES, RANGES, Cluster
from sapp.errors import ClusterError

MAX_GROUPS = 16


@dataclass(frozen=True)
class MixedCluster:
    name: str
    groups: tuple            # Cluster, each with a unique name
    link_bw: float           # bytes/s per device per direction between groups
    link_latency: float      # seconds per message between groups

    @property
    def devices(self) -> int:
        return sum(g.devices for g in self.groups)

    def validate(self) -> "MixedCluster":
        if not 2 <= len(self.groups) <= MAX_GROUPS:
            raise ClusterError(f"a mixed cluster needs 2 to {MAX_GROUPS} device groups, got {len(self.groups)}; "
                               f"join specs with '+', e.g. a100-80g:nodes=16+h100-80g:nodes=8")
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})[0]
            raise ClusterError(f"mixed cluster: two groups are named {dup!r}; give each group its own name")
        for g in self.groups:
            g.validate()
        if self.devices > MAX_DEVICES:
            raise ClusterError(f"mixed cluster: {self.devices} devices is more than {MAX_DEVICES}; sapp plans up to {MAX_DEVICES}")
        for key, v, (lo, hi) in (("link.bw", self.link_bw, RANGES["inter_bw"]),
                                 ("link.latency", self.link_latency, RANGES["inter_latency"])):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise ClusterError(f"mixed cluster: {key}={v!r} is outside [{lo:g}, {hi:g}]; give the link's real figure")
        return self

    def slowest(self) -> Cluster:
        """The group whose devices compute slowest (peak x efficiency)."""
        return min(self.groups, key=lambda g: (g.peak_flops * g.compute_efficiency, g.name))

    def to_dict(self) -> dict:
        return {"name": self.name, "groups": [g.to_dict() for g in self.groups],
                "link": {"bw": self.link_bw, "latency": self.link_latency}}

    @classmethod
    def build(cls, groups, name=None, link_bw=None, link_latency=None) -> "MixedCluster":
        groups = tuple(groups)
        if not groups:
            raise ClusterError("a mixed cluster needs device groups")
        bw = min(g.inter_bw for g in groups) if link_bw is None else link_bw
        lat = max(g.inter_latency for g in groups) if link_latency is None else link_latency
        return cls(name or "+".join(g.name for g in groups), groups, bw, lat).validate()

    @classmethod
    def from_dict(cls, d, where="") -> "MixedCluster":
        if not isinstance(d, dict):
            raise ClusterError(f"{where}a mixed cluster must be a JSON object")
        err = schema.document_problem("cluster", d)
        if err:
            raise ClusterError(f"{where}{err}")
        groups = []
        for i, g in enumerate(d["groups"]):
            groups.append(Cluster.from_dict(g, where=f"{where}groups[{i}]: "))
        link = d.get("link") or {}
        return cls.build(groups, name=str(d.get("name") or "") or None,
                         link_bw=link.get("bw"), link_latency=link.get("latency"))

    def save(self, path) -> None:
        d = self.validate().to_dict()
        err = schema.first_error("cluster", d)
        if err:
            raise ClusterError(f"mixed cluster {self.name!r} does not match cluster.schema.json: {err}")
        try:
            with open(path, "w") as f:
                f.write(json.dumps(d, indent=2, sort_keys=True) + "\n")
        except OSError as e:
            raise ClusterError(f"cannot write cluster file {path}: {e.strerror or e}; choose another --out") from None


def _read_json(path):
    from sapp.fileio import read_regular
    try:
        raw = read_regular(path, MAX_FILE_BYTES)
        return schema.strict_loads(raw.decode("utf-8"))
    except Exception:       # every failure is reported by Cluster.load's own one-line messages
        return None


def _group_name(spec: str, taken) -> str:
    base = spec.partition(":")[0].strip()
    if base.lower().endswith(".json"):
        base = base.rsplit("/", 1)[-1][:-5]
    name, i = base, 2
    while name in taken:
        name, i = f"{base}-{i}", i + 1
    return name


def parse(spec):
    """A Cluster for a one-group spec or file, a MixedCluster for 'A+B' specs or a file with groups."""
    if isinstance(spec, (Cluster, MixedCluster)):
        return spec.validate()
    if not isinstance(spec, str):
        return Cluster.parse(spec)          # its own one-line refusal
    text = spec.strip()
    if "+" in text:
        parts = [p.strip() for p in text.split("+")]
        if any(not p for p in parts):
            raise ClusterError(f"cluster spec {spec!r} has an empty group; write A+B, e.g. a100-80g:nodes=16+h100-80g:nodes=8")
        groups, taken = [], set()
        for p in parts:
            c = Cluster.parse(p)
            name = _group_name(p, taken)
            taken.add(name)
            groups.append(c.replace(name=name))
        return MixedCluster.build(groups)
    if text.lower().endswith(".json"):
        d = _read_json(text)
        if isinstance(d, dict) and "groups" in d:
            return MixedCluster.from_dict(d, where=f"cluster file {text}: ")
    return Cluster.parse(text)


def describe(mc: MixedCluster) -> list:
    """Lines for `sapp clusters` / `sapp explain`: each group and the link between them."""
    from sapp.units import fmt_bytes, fmt_flops
    lines = [f"mixed cluster {mc.name}: {mc.devices} devices in {len(mc.groups)} groups"]
    for g in mc.groups:
        lines.append(f"  group {g.name}: {g.nodes} x {g.gpus_per_node} devices, {fmt_flops(g.peak_flops)} peak, "
                     f"{fmt_bytes(g.device_memory)}, inter {fmt_bytes(g.inter_bw)}/s")
    lines.append(f"  link between groups: {fmt_bytes(mc.link_bw)}/s per device, {mc.link_latency * 1e6:.3g} us")
    return lines


def describe_any(spec, as_json=False) -> str:
    c = parse(spec)
    if as_json:
        return json.dumps(c.to_dict(), indent=2, sort_keys=True)
    if isinstance(c, MixedCluster):
        return "\n".join(describe(c))
    from sapp.units import fmt_bytes, fmt_flops
    return (f"cluster {c.name}: {c.nodes} x {c.gpus_per_node} devices, {fmt_flops(c.peak_flops)} peak, "
            f"{fmt_bytes(c.device_memory)}, inter {fmt_bytes(c.inter_bw)}/s")
