"""One place that turns a model spec into a module: every command and the per-rank worker call
`build(spec, device, **overrides)`.

A spec is one of
  - a zoo name:                `gpt3-175b` (see `sapp models`);
  - a factory:                 `pkg.module:factory` - importable from the current directory or
                               PYTHONPATH; `factory(**overrides)` returns
                                 * an nn.Module that is a Hugging Face PreTrainedModel (example
                                   data from its config, as for a config file), or
                                 * `(module, example_inputs)`: no loss in the graph, or
                                 * `(module, example_inputs, targets, loss_fn)`, or
                                 * `sapp.models.Bundle(module, example_inputs, targets, loss_fn)`;
                               example_inputs is a tensor or a tuple matching forward(...), sample
                               axis first (any batch: sapp tiles the rows to the batch it needs);
                               loss_fn(output, targets) -> scalar.  The factory runs under
                               `torch.device("meta")` for search (nothing is allocated) and on the
                               CPU under a fixed seed in `sapp run`;
  - a Hugging Face config:     a path ending in `.json` (sapp/models/hf.py).
The module comes back with `sapp_spec` (name = the spec, so a plan names what built it) and, unless
it is a zoo model, `sapp_data` (sapp/models/data.py)."""
from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass

from ..errors import SappError
from .data import DataSpec


class ModelSpecError(SappError):
    """A --model / --hf-config that does not give a model."""


@dataclass
class Bundle:
    """What a factory may return: the module, one example batch, and optionally targets + loss."""
    model: object
    example_inputs: object
    targets: object = None
    loss_fn: object = None


def kind_of(spec: str) -> str:
    """"zoo" | "factory" | "hf"."""
    if spec.endswith(".json"):
        return "hf"
    if ":" in spec:
        return "factory"
    return "zoo"


def build(spec: str, device="meta", raw: bytes | None = None, **overrides):
    """The module `spec` names, on `device`, with sapp_spec (and sapp_data unless it is a zoo model).
    `raw`: an HF config's bytes already read (the capture cache hashes and builds from one read)."""
    from . import zoo
    kind = kind_of(spec)
    if kind == "zoo":
        if spec not in zoo.names():
            if os.path.isfile(spec):      # a plan imported from a Megatron-LM argument file names that file
                raise ModelSpecError(f"{spec} is a file, not a model: a Megatron-LM argument file is priced with "
                                     f"`sapp import --from megatron {spec} --cluster C`; else pass --model NAME")
            raise ModelSpecError(f"unknown model {spec!r}: choose one of {', '.join(zoo.names())}, or give "
                                 "pkg.module:factory or an HF config.json")
        return zoo.get(spec, device=device, **overrides)
    if kind == "hf":
        from . import hf
        model, data, facts = hf.build(spec, device, raw=raw, **overrides)
        return _attach(model, spec, "hf", facts, data)
    model, data = _from_factory(spec, device, overrides)
    return _attach(model, spec, "custom", dict(overrides), data)


def info(spec: str, **overrides) -> dict | None:
    """Zoo facts (config, exact parameter count) without building; None for other specs."""
    if kind_of(spec) != "zoo":
        return None
    from . import zoo
    return zoo.info(spec, **overrides)


def _attach(model, spec, kind, config, data):
    from . import zoo
    model.sapp_spec = zoo.ModelSpec(name=spec, config=config, kind=kind)
    model.sapp_data = data
    return model


def cwd_on_path() -> None:
    """Put the current directory on sys.path, as `python -m` does: `sapp` as a console script does not
    see it, so `--model mypkg.m:f` / `--data mypkg.d:f` typed in the folder holding mypkg would not
    import.  Only for specs typed on the command line (or passed by the caller); never for one read
    from a file."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())


def _import_factory(spec):
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise ModelSpecError(f"model spec {spec!r}: write it as pkg.module:factory")
    cwd_on_path()
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise ModelSpecError(f"cannot import {mod_name!r} for --model {spec} ({e}); run from the directory "
                             "that holds it or add it to PYTHONPATH") from None
    except Exception as e:        # noqa: BLE001 - the user's module raised while importing
        raise ModelSpecError(f"importing {mod_name!r} for --model {spec} raised {type(e).__name__}: "
                             f"{' '.join(str(e).split())[:160]}; fix the module") from None
    fn = mod
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ModelSpecError(f"module {mod_name!r} has no {attr!r}; --model takes pkg.module:factory "
                                 "naming a callable in it")
    if not callable(fn):
        raise ModelSpecError(f"{spec} is a {type(fn).__name__}, not a callable; name a function returning the model")
    return fn


def _from_factory(spec, device, overrides):
    import torch
    fn = _import_factory(spec)
    try:
        with torch.device(device):
            out = fn(**overrides)
    except Exception as e:        # noqa: BLE001 - any failure inside the user's factory
        raise ModelSpecError(f"factory {spec} raised {type(e).__name__}: {' '.join(str(e).split())[:160]}; "
                             "fix the factory (it is called with the --model-arg settings as keywords)") from None
    if isinstance(out, Bundle):
        out = (out.model, out.example_inputs, out.targets, out.loss_fn)
    if isinstance(out, torch.nn.Module):
        return out, _hf_data(spec, out, device, overrides)
    if isinstance(out, (tuple, list)) and len(out) in (2, 4) and isinstance(out[0], torch.nn.Module):
        model, inputs = out[0], out[1]
        targets, loss = (out[2], out[3]) if len(out) == 4 else (None, None)
        if (targets is None) != (loss is None):
            raise ModelSpecError(f"factory {spec} returned targets without a loss_fn or the reverse; return both "
                                 "or neither")
        return model, DataSpec(inputs, targets, loss)
    raise ModelSpecError(f"factory {spec} returned {type(out).__name__}; return an nn.Module, (module, example_inputs), "
                         "(module, example_inputs, targets, loss_fn) or sapp.models.Bundle")


def _hf_data(spec, model, device, overrides):
    """A bare module: HF models carry a config to derive example data from; others cannot be fed."""
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "model_type"):
        raise ModelSpecError(f"factory {spec} returned a bare {type(model).__name__}: sapp cannot guess its inputs; "
                             "return (module, example_inputs, targets, loss_fn)")
    from . import hf
    data, seq = hf._data(type(model).__name__, cfg, int(overrides.get("batch", 8)), device, overrides.get("seq"))
    return data
