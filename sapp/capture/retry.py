"""torch.export, retried where a model's forward is fine eagerly but its trace is not.  Three
classes found by the transformers catalogue (bench/hf_catalogue.py), each met by its own retry,
applied cumulatively and only after the plain export failed (a model that exports as it is is
captured exactly as before):

- a tensor created on the cpu (no `device=`) meets the meta parameters (XLNet's relative attention):
  fake tensor propagation is told to prefer meta - on a real device eager runs both on one device;
- a Hugging Face forward that skips its default attention mask while torch compiles
  (`if attention_mask is None and not is_torchdynamo_compiling()`: Switch Transformers, LongT5) and
  then indexes the None: the model's modules answer `is_torchdynamo_compiling()` as eager does;
- a Python branch on a tensor's value (`if mask.any()`, `.item()`, layerdrop's `torch.rand([]) < p`:
  FSMT, M2M100, NLLB-MoE, SeamlessM4T, Longformer, LED, I-BERT): the branch is taken as the example's
  values take it, by running the trace with real values alongside the fake ones (torch's
  fake_tensor_propagate_real_tensors; the random stream seeded, so the same inputs give the same
  graph).  That needs real parameters and inputs: on meta the CaptureError says so."""
from __future__ import annotations

import contextlib
import warnings


def export(root, inputs, kwargs):
    """torch.export.export(root, inputs, kwargs, strict=False), with the retries above.  Raises the
    first export's error when no retry applies, else the last retry's."""
    import torch
    fixes, first = [], None
    while True:
        with contextlib.ExitStack() as stack:
            for f in fixes:
                stack.enter_context(f(root))
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    return torch.export.export(root, tuple(inputs), kwargs, strict=False)
            except Exception as e:        # noqa: BLE001 - a retry may apply, else re-raised
                first = first or e
                fix = _next_fix(root, inputs, kwargs, e, fixes)
                if fix is None:           # a branch on values is the clearer cause once retries got there
                    raise (e if data_dependent(e) else first) from None
                fixes.append(fix)


def data_dependent(e) -> bool:
    text = f"{type(e).__name__}: {e}"
    return "GuardOnDataDependent" in text or "data-dependent" in text or "data dependent" in text


def on_meta(root, inputs=(), kwargs=None) -> bool:
    import torch
    ts = list(root.parameters()) + list(root.buffers()) + [x for x in tuple(inputs) + tuple((kwargs or {}).values())
                                                          if isinstance(x, torch.Tensor)]
    return any(t.device.type == "meta" for t in ts)


def _next_fix(root, inputs, kwargs, e, fixes):
    text = f"{type(e).__name__}: {e}"
    if _prefer_meta not in fixes and "DeviceMismatch" in text and on_meta(root):
        return _prefer_meta
    if _eager_branches not in fixes and _hf_modules(root):
        return _eager_branches
    if _real_values not in fixes and data_dependent(e) and not on_meta(root, inputs, kwargs):
        return _real_values
    return None


@contextlib.contextmanager
def _prefer_meta(root):
    import torch._functorch.config as fc
    with fc.patch(fake_tensor_prefer_device_type="meta"):
        yield


def _hf_modules(root):
    """The Python modules of `root`'s submodule classes that import transformers' is_torchdynamo_compiling."""
    import sys
    mods = {sys.modules.get(type(m).__module__) for m in root.modules()}
    return [m for m in mods if m is not None and m.__name__.startswith("transformers.")
            and callable(getattr(m, "is_torchdynamo_compiling", None))]


@contextlib.contextmanager
def _eager_branches(root):
    mods = _hf_modules(root)
    saved = [(m, m.is_torchdynamo_compiling) for m in mods]
    for m in mods:
        m.is_torchdynamo_compiling = lambda: False
    try:
        yield
    finally:
        for m, f in saved:
            m.is_torchdynamo_compiling = f


@contextlib.contextmanager
def _real_values(root):
    import torch
    import torch._functorch.config as fc
    with torch.random.fork_rng(devices=[]), fc.patch(fake_tensor_propagate_real_tensors=True):
        torch.manual_seed(0)
        yield
