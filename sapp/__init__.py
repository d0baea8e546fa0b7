"""sapp: auto-parallel strategy search for PyTorch.

    cluster = sapp.Cluster.parse("a100-80g:nodes=128")
    plan = sapp.search(sapp.models.get("gpt3-175b"), cluster, global_batch=1536)
    plan.save("plan.json"); sapp.evaluate(model, cluster, sapp.Plan.load("plan.json"))

Heavy modules (torch, ortools) load on first use, so `import sapp` stays fast."""
from .cluster import Cluster, PRESETS as CLUSTER_PRESETS
from .errors import (CaptureError, ClusterError, ConstraintError, InfeasibleError, PlanError,
                     SappError)
from .plan import Plan
from .version import __version__
__all__ = ["Cluster", "Plan", "search", "evaluate", "capture", "emit", "models", "Constraints",
           "SappError", "ClusterError", "CaptureError", "PlanError", "ConstraintError", "InfeasibleError"]


def search(model, cluster, **kwargs):
    """capture -> joint search -> Plan.  See sapp.api.search."""
    from .api import search as _search
    return _search(model, cluster, **kwargs)


def evaluate(model, cluster, plan, **kwargs):
    from .api import evaluate as _evaluate
    return _evaluate(model, cluster, plan, **kwargs)


def capture(model, example_inputs=None, **kwargs):
    from .capture import capture as _capture
    return _capture(model, example_inputs, **kwargs)


def emit(model, plan, **kwargs):
    from .emit import emit as _emit
    return _emit(model, plan, **kwargs)


def __getattr__(name):
    # importlib, not `from . import x`: the latter asks this very __getattr__ again and recurses.
    import importlib
    if name == "models":
        return importlib.import_module("sapp.models")
    if name == "Constraints":
        return importlib.import_module("sapp.constraints").Constraints
    raise AttributeError(f"module 'sapp' has no attribute {name!r}")


# `sapp.search`, `sapp.emit` and `sapp.capture` are both user functions and subpackages.  Importing a
# subpackage makes Python rebind the parent's attribute to it, which would hide the function; instead
# the subpackage is made callable (forwarding to the entry point), so `sapp.search(model, cluster)` and
# `from sapp.search import shard_search` both keep working in any import order.
import importlib as _importlib
import sys as _sys
import types as _types

_ENTRIES = {"sapp.search": ("sapp.api", "search"), "sapp.emit": ("sapp.emit.recipe", "emit"),
            "sapp.capture": ("sapp.capture", "capture")}


class _CallablePackage(_types.ModuleType):
    def __call__(self, *args, **kwargs):
        module, name = _ENTRIES[self.__name__]
        return getattr(_importlib.import_module(module), name)(*args, **kwargs)


class _SappModule(_types.ModuleType):
    def __setattr__(self, name, value):
        if type(value) is _types.ModuleType and getattr(value, "__name__", None) in _ENTRIES:
            value.__class__ = _CallablePackage
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _SappModule
