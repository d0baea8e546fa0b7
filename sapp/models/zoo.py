"""The zoo's models by name: their configs, constructors, example data and losses (sapp.models
re-exports these; resolve.py and withloss.py import them from here, below the package)."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

from ..errors import SappError
from .registry import BUILDERS, NAMED


@dataclass(frozen=True)
class ModelSpec:
    name: str
    config: dict = field(default_factory=dict)
    kind: str = "gpt"          # gpt | llama | bert | resnet | widedeep | mlp; hf | custom (sapp.models.build)


def names() -> list:
    return sorted(NAMED)


def _config(name, overrides):
    if name not in NAMED:
        raise SappError(f"unknown model {name!r}: choose one of {', '.join(names())}")
    kind, base = NAMED[name]
    cfg = dict(base)
    bad = sorted(k for k in overrides if k not in cfg)
    if bad:
        raise SappError(f"model {name!r} has no setting {', '.join(bad)}: valid keys are {', '.join(sorted(cfg))}")
    for k, v in overrides.items():
        cfg[k] = tuple(v) if isinstance(v, list) else v
    if kind == "widedeep":
        # `vocab` (total deep-table rows) and `rows_per_field` describe the same thing; the one the
        # caller set wins.
        if "vocab" in overrides and "rows_per_field" not in overrides:
            cfg["rows_per_field"] = -(-int(cfg["vocab"]) // cfg["fields"])
        cfg["vocab"] = cfg["fields"] * cfg["rows_per_field"]
    if kind == "moe" and (cfg["a"] % cfg["kv"] or cfg["experts"] < cfg["top_k"]):
        raise SappError(f"model {name!r}: kv heads must divide heads a={cfg['a']} and top_k <= experts")
    if kind in ("gpt", "bert", "llama") and cfg["h"] % cfg["a"]:
        raise SappError(f"model {name!r}: hidden h={cfg['h']} must be divisible by heads a={cfg['a']}")
    if kind == "llama" and (cfg["kv"] < 1 or cfg["a"] % cfg["kv"]):
        raise SappError(f"model {name!r}: key/value heads kv={cfg['kv']} must divide heads a={cfg['a']}")
    return kind, cfg


def _ctor_args(kind, cfg):
    if kind == "widedeep":
        return {k: v for k, v in cfg.items() if k != "vocab"}
    if kind == "resnet":
        return {k: v for k, v in cfg.items() if k != "image"}
    return dict(cfg)


def get(name: str, device="meta", **overrides):
    """Build a zoo model.  device="meta" (default) allocates nothing; "cpu" gives real weights,
    deterministic under torch.manual_seed."""
    import torch
    kind, cfg = _config(name, overrides)
    cls, _ = BUILDERS[kind]
    with torch.device(device):
        if torch.device(device).type == "meta":
            from .meta import skip_init      # no values on meta: initialisers would only cost time
            with skip_init():
                model = cls(**_ctor_args(kind, cfg))
        else:
            model = cls(**_ctor_args(kind, cfg))
    model.sapp_spec = ModelSpec(name=name, config=cfg, kind=kind)
    return model


def info(name: str, **overrides) -> dict:
    """Config and exact parameter count (by formula, no model is built)."""
    kind, cfg = _config(name, overrides)
    return {"name": name, "kind": kind, "config": cfg, "params": BUILDERS[kind][1](**cfg)}


def spec_of(model) -> ModelSpec:
    spec = getattr(model, "sapp_spec", None)
    if spec is None and _with_loss(model):
        spec = getattr(model.model, "sapp_spec", None)
    if spec is None:
        raise SappError(f"{type(model).__name__} is not a sapp.models zoo model: pass example inputs, "
                        "targets and a loss function explicitly")
    return spec


def _device(model, device):
    if device is not None:
        return device
    for p in model.parameters():
        return p.device
    return "cpu"


def _randint(high, shape, device, seed):
    import torch
    if str(device) == "meta":
        return torch.empty(shape, dtype=torch.long, device="meta")
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, shape, generator=g).to(device)


def _randn(shape, device, seed):
    import torch
    if str(device) == "meta":
        return torch.empty(shape, device="meta")
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(device)


def example_inputs(model, batch: int, device=None) -> tuple:
    """Positional inputs for model.forward at `batch` (ids within the vocabulary / table rows)."""
    data = _data(model)
    if data is not None:
        return data.inputs_at(batch, device)
    spec, dev = spec_of(model), _device(model, device)
    c = spec.config
    if spec.kind in ("gpt", "bert", "llama", "moe"):
        return (_randint(c["V"], (batch, c["s"]), dev, 1),)
    if spec.kind == "resnet":
        return (_randn((batch, 3, c["image"], c["image"]), dev, 1),)
    if spec.kind == "mlp":
        return (_randn((batch, c["dims"][0]), dev, 1),)
    return (_randn((batch, c["dense"]), dev, 1), _randint(c["rows_per_field"], (batch, c["fields"]), dev, 2))


def example_targets(model, batch: int, device=None, seq=None):
    """Targets for a batch of `batch`; `seq`: the example inputs' sequence length for token models
    (else the spec's), so the targets match the logits the loss receives."""
    data = _data(model)
    if data is not None:
        return data.targets_at(batch, device)
    spec, dev = spec_of(model), _device(model, device)
    c = spec.config
    if spec.kind in ("gpt", "bert", "llama", "moe"):
        return _randint(c["V"], (batch, seq or c["s"]), dev, 3)
    if spec.kind in ("resnet", "mlp"):
        return _randint(c["classes"], (batch,), dev, 3)
    return _randint(2, (batch,), dev, 3).float()


def token_cross_entropy(output, target):
    """Cross-entropy over the last axis for [b, s, V] logits and [b, s] targets."""
    from torch.nn import functional as F
    return F.cross_entropy(output.flatten(0, 1), target.flatten())


def class_cross_entropy(output, target):
    from torch.nn import functional as F
    return F.cross_entropy(output, target)


def click_bce(output, target):
    from torch.nn import functional as F
    return F.binary_cross_entropy_with_logits(output, target)


def _data(model):
    """The example data a non-zoo model was built with (sapp.models.build), or None."""
    data = getattr(model, "sapp_data", None)
    if data is None and _with_loss(model):
        data = getattr(model.model, "sapp_data", None)
    return data


def loss_fn(model):
    data = _data(model)
    if data is not None:
        if data.loss_fn is None:
            raise SappError(f"{spec_of(model).name} has no loss: return (module, example_inputs, targets, loss_fn) "
                            "from the factory")
        return data.loss_fn
    kind = spec_of(model).kind
    if kind in ("gpt", "bert", "llama", "moe"):
        return token_cross_entropy
    if kind in ("resnet", "mlp"):
        return class_cross_entropy
    return click_bce


def _with_loss(model) -> bool:
    wl = sys.modules.get("sapp.models.withloss")     # not loaded yet: nothing can be a WithLoss
    return wl is not None and isinstance(model, wl.WithLoss)
