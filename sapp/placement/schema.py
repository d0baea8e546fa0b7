"""The plan's "placement" section: building group entries and resolving a parameter's entry.

Resolution rule (the emitter and the report use it): an exact qualname key wins; otherwise the
fnmatch patterns that match, most specific first (longest literal text, then name order); a
parameter that no key matches lives entirely on the device with the default optimizer."""
from __future__ import annotations

import fnmatch

from ..errors import PlanError

ENTRY_KEYS = ("weights", "grads", "master_weights", "optimizer", "optimizer_kind")
OPTIMIZER_KINDS = ("sparse_adam", "ftrl", "adam", "adamw")


def table_entry(kind: str) -> dict:
    return {"weights": "host", "grads": "host", "optimizer": "host", "optimizer_kind": kind}


def device_entry() -> dict:
    """A table left on the device with its own (sparse) optimizer, where a broader pattern offloads."""
    return {"weights": "device", "grads": "device", "optimizer": "device", "optimizer_kind": "sparse_adam"}


def offload_entry(kind: str = "adam") -> dict:
    return {"weights": "device", "grads": "host", "master_weights": "host", "optimizer": "host",
            "optimizer_kind": kind}


def _literal(pattern: str) -> int:
    return sum(1 for c in pattern if c not in "*?[]")


def resolve(section, qualname: str):
    """The group entry governing `qualname`, or None (all on the device)."""
    groups = (section or {}).get("groups") or {}
    if qualname in groups:
        return groups[qualname]
    matches = sorted((k for k in groups if fnmatch.fnmatchcase(qualname, k)), key=lambda k: (-_literal(k), k))
    return groups[matches[0]] if matches else None


def validate_section(section) -> dict:
    """Check a (possibly hand-edited) placement section; returns it."""
    if not isinstance(section, dict) or not isinstance(section.get("groups", {}), dict):
        raise PlanError("placement must be an object {\"groups\": {...}, \"predicted\": {...}}")
    for key, entry in sorted(section.get("groups", {}).items()):
        if not isinstance(entry, dict):
            raise PlanError(f"placement.groups[{key!r}] must be an object with weights/grads/optimizer")
        unknown = sorted(set(entry) - set(ENTRY_KEYS))
        if unknown:
            raise PlanError(f"placement.groups[{key!r}] has unknown field(s) {', '.join(unknown)}; "
                            f"known: {', '.join(ENTRY_KEYS)}")
        for f in ("weights", "grads", "master_weights", "optimizer"):
            if f in entry and entry[f] not in ("host", "device"):
                raise PlanError(f"placement.groups[{key!r}].{f} must be 'host' or 'device', got {entry[f]!r}")
        kind = entry.get("optimizer_kind", "adam")
        if kind not in OPTIMIZER_KINDS:
            raise PlanError(f"placement.groups[{key!r}].optimizer_kind {kind!r} is not one of "
                            f"{', '.join(OPTIMIZER_KINDS)}")
        if entry.get("weights") == "host" and kind not in ("sparse_adam", "ftrl"):
            raise PlanError(f"placement.groups[{key!r}]: host weights need a sparse optimizer "
                            "(sparse_adam or ftrl)")
    return section
