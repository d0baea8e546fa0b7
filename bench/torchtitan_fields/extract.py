"""Writes the field list of torchtitan's Trainer.Config (the typed job configuration of torchtitan 0.3)
as JSON, the test data tests/test_engines_torchtitan_py.py compares sapp's classification
(sapp/engines/torchtitan_py_fields.py) with.  Run by hand where that torchtitan imports (it is not in
the `engines` extra, which pins 0.2.2):

    PYTHONPATH=<dir with torchtitan 0.3 and its deps> python bench/torchtitan_fields/extract.py > bench/torchtitan_fields/v0.3.0.json

On a CPU-only torch, torchtitan's MinimalAsyncEP kernels import triton: set SAPP_STUB_ASYNC_EP=1 to
stand in empty modules for them (nothing read here uses them)."""
import dataclasses
import json
import os
import sys
import types


def _stub():
    class _Any(types.ModuleType):
        def __getattr__(self, k):
            if k.startswith("__"):
                raise AttributeError(k)
            v = type(k, (), {"Config": type("Config", (), {})})
            setattr(self, k, v)
            return v
    for n in ("", ".api", ".kernels"):
        m = _Any("torchtitan.distributed.minimal_async_ep" + n)
        m.__path__ = []
        sys.modules[m.__name__] = m


def _plain(v):
    if dataclasses.is_dataclass(v):
        return type(v).__qualname__
    try:
        json.dumps(v)
        return v
    except TypeError:
        return repr(v)


def main():
    if os.environ.get("SAPP_STUB_ASYNC_EP"):
        _stub()
    import torchtitan
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.components.optimizer.optimizer import ParamGroupConfig
    from torchtitan.distributed.activation_checkpoint import FullAC, MemoryBudgetAC, SelectiveAC
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
    from torchtitan.trainer import Trainer
    job = Trainer.Config()
    sections = {"trainer": {"classes": ["Trainer.Config"], "fields": {}}}
    for f in dataclasses.fields(job):
        v = getattr(job, f.name)
        if dataclasses.is_dataclass(v):
            sections[f.name] = {"classes": [type(v).__qualname__],
                                "fields": {g.name: _plain(getattr(v, g.name)) for g in dataclasses.fields(v)}}
        else:
            sections["trainer"]["fields"][f.name] = _plain(v)
    # the variants a job file names in place of a section's default class
    for sec, cls in (("activation_checkpoint", SelectiveAC.Config), ("activation_checkpoint", FullAC.Config),
                     ("activation_checkpoint", MemoryBudgetAC.Config), ("dataloader", HuggingFaceTextDataLoader.Config),
                     ("checkpoint", CheckpointManager.Config), ("loss", ChunkedLossWrapper.Config),
                     ("loss", CrossEntropyLoss.Config), ("param_group", ParamGroupConfig)):
        s = sections.setdefault(sec, {"classes": [], "fields": {}})
        if cls.__qualname__ not in s["classes"]:
            s["classes"].append(cls.__qualname__)
        inst = cls() if sec != "param_group" else None
        for g in dataclasses.fields(cls):
            if g.name not in s["fields"]:
                s["fields"][g.name] = _plain(getattr(inst, g.name)) if inst is not None else None
    out = {"torchtitan": getattr(torchtitan, "__version__", None) or _version(), "sections": sections}
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


def _version():
    from importlib.metadata import version
    return version("torchtitan")


if __name__ == "__main__":
    main()
