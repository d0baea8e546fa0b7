"""The Plan: a versioned JSON document users save, load, diff and hand-edit.

Same inputs give byte-identical JSON: keys are sorted, floats are rounded to 6 significant digits,
nothing time- or machine-dependent is stored (search time is printed, not saved).
See docs/ARCHITECTURE.md for the schema."""
from __future__ import annotations

import json
import math

from .errors import PlanError

SCHEMA = "sapp.plan/1"
REQUIRED = ("schema", "model", "cluster", "devices", "parallel", "mesh", "operators", "pipeline",
            "recompute", "zero", "placement", "predicted")
PREDICTED_KEYS = ("step_time_s", "peak_memory_bytes", "mfu", "compute_s", "comm_s")


def _round(x):
    """Stable float representation: 6 significant digits, ints stay ints."""
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    if isinstance(x, float):
        if math.isnan(x) or math.isinf(x):
            raise PlanError(f"plan holds a non-finite number ({x}); the cost model produced an invalid value")
        return float(f"{x:.6g}")
    if isinstance(x, dict):
        return {str(k): _round(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_round(v) for v in x]
    if hasattr(x, "item"):          # numpy scalar
        return _round(x.item())
    raise PlanError(f"plan field of type {type(x).__name__} cannot be stored in JSON")


def empty_sections() -> dict:
    """Defaults for the sections later stages fill."""
    return {
        "pipeline": {"schedule": "none", "micro_batches": 1, "virtual_chunks": 1, "stages": []},
        "recompute": {"default": "none", "blocks": {}},
        "zero": 0,
        "placement": {"groups": {}, "predicted": {}},
    }


class Plan:
    def __init__(self, data: dict):
        self._d = _round(data)
        self._validate()

    # ---- field access --------------------------------------------------------------------------
    def __getitem__(self, key):
        return self._d[key]

    def __getattr__(self, key):
        if key.startswith("_"):
            raise AttributeError(key)
        try:
            return self._d[key]
        except KeyError:
            raise AttributeError(key) from None

    def __eq__(self, other):
        return isinstance(other, Plan) and self.to_json() == other.to_json()

    def __repr__(self):
        p, pr = self._d["parallel"], self._d["predicted"]
        return (f"Plan(model={self._d['model'].get('name')!r}, devices={self._d['devices']}, "
                f"dp={p.get('dp')}, tp={p.get('tp')}, pp={p.get('pp')}, step_time_s={pr.get('step_time_s')})")

    def to_dict(self) -> dict:
        return json.loads(self.to_json())

    def to_json(self) -> str:
        return json.dumps(self._d, indent=1, sort_keys=True) + "\n"

    def save(self, path) -> None:
        with open(path, "w") as f:
            f.write(self.to_json())

    @classmethod
    def load(cls, path) -> "Plan":
        try:
            with open(path) as f:
                text = f.read()
        except FileNotFoundError:
            raise PlanError(f"plan file {path} not found") from None
        return cls.from_json(text, source=str(path))

    @classmethod
    def from_json(cls, text: str, source="plan") -> "Plan":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(f"{source} is not valid JSON ({e.msg} at line {e.lineno}); fix or regenerate it with `sapp search`") from None
        if not isinstance(d, dict):
            raise PlanError(f"{source} must hold a JSON object, found {type(d).__name__}")
        try:
            return cls(d)
        except PlanError as e:
            raise PlanError(f"{source}: {e}") from None

    def check_model(self, fingerprint: str, name: str = "") -> None:
        """Refuse a plan made for another model."""
        mine = self._d["model"].get("fingerprint")
        if mine != fingerprint:
            raise PlanError(f"plan was made for model {self._d['model'].get('name')!r} (fingerprint {mine}) but this "
                            f"model{(' ' + repr(name)) if name else ''} has fingerprint {fingerprint}; search a new plan for it")

    # ---- validation ----------------------------------------------------------------------------
    def _validate(self):
        d = self._d
        if d.get("schema") != SCHEMA:
            raise PlanError(f"schema is {d.get('schema')!r}, expected {SCHEMA!r}; regenerate the plan with this sapp")
        missing = [k for k in REQUIRED if k not in d]
        if missing:
            raise PlanError(f"missing field(s) {', '.join(missing)}")
        if not isinstance(d["model"], dict) or "fingerprint" not in d["model"]:
            raise PlanError("model section needs a fingerprint")
        par = d["parallel"]
        if not isinstance(par, dict):
            raise PlanError("parallel must be an object with dp, tp, pp")
        for k in ("dp", "tp", "pp"):
            v = par.get(k)
            if not isinstance(v, int) or v < 1:
                raise PlanError(f"parallel.{k} must be a positive integer, got {v!r}")
        if not isinstance(d["devices"], int) or d["devices"] < 1:
            raise PlanError(f"devices must be a positive integer, got {d['devices']!r}")
        if par["dp"] * par["tp"] * par["pp"] != d["devices"]:
            raise PlanError(f"dp x tp x pp = {par['dp']}x{par['tp']}x{par['pp']} does not equal devices={d['devices']}")
        if not isinstance(d["predicted"], dict):
            raise PlanError("predicted must be an object")
        for k in PREDICTED_KEYS:
            if k not in d["predicted"]:
                raise PlanError(f"predicted.{k} is missing")
        if d["zero"] not in (0, 1, 2, 3):
            raise PlanError(f"zero must be 0, 1, 2 or 3, got {d['zero']!r}")
        if not isinstance(d["operators"], dict):
            raise PlanError("operators must be an object of node name -> layout")
        pipe = d["pipeline"]
        if not isinstance(pipe, dict) or not isinstance(pipe.get("micro_batches"), int) or pipe["micro_batches"] < 1:
            raise PlanError("pipeline.micro_batches must be a positive integer")
