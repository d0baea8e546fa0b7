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
  graph).  That needs real values.  A model on meta (what `sapp search` builds) whose example
  inputs are real is traced once more with its meta parameters and buffers swapped, for the trace
  only, for host tensors of seeded stand-in values (floating N(0, 0.02), others zero) and the
  example's own inputs: the branches such models take read the inputs (Longformer's and LED's
  global-attention mask, built on the embeddings' device), not the weights.  Only up to
  MATERIALISE_MAX_BYTES of parameters and buffers (a deep stack is traced with three blocks, so this
  bounds its embeddings and three blocks); beyond that, or with inputs on meta, the CaptureError
  says what to pass."""
from __future__ import annotations

import contextlib
import contextvars
import warnings

MATERIALISE_MAX_BYTES = 2 << 30

# (inputs, kwargs) as the caller passed them, before capture moved them to the model's device:
# the values a meta model's trace can take its branches from (set by sapp.capture.capture)
_EXAMPLE = contextvars.ContextVar("sapp_capture_example", default=None)


@contextlib.contextmanager
def example_values(inputs, kwargs):
    token = _EXAMPLE.set((tuple(inputs), dict(kwargs or {})))
    try:
        yield
    finally:
        _EXAMPLE.reset(token)


def export(root, inputs, kwargs):
    """torch.export.export(root, inputs, kwargs, strict=False), with the retries above.  Raises the
    first export's error when no retry applies, else the last retry's (the first's where a retry
    only met it again in another form; a fix that got past the first error shows the next one)."""
    import torch
    fixes, first = [], None
    while True:
        with contextlib.ExitStack() as stack:
            for f in fixes:
                stack.enter_context(f(root))
            args, kw = _real_example() if _materialise in fixes else (tuple(inputs), kwargs)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    return torch.export.export(root, args, kw, strict=False)
            except Exception as e:        # noqa: BLE001 - a retry may apply, else re-raised
                first = first or e
                fix = _next_fix(root, inputs, kwargs, e, fixes)
                if fix is None:           # a branch on values is the clearer cause once retries got there
                    past = _prefer_meta in fixes and "DeviceMismatch" in type(first).__name__ \
                        and "DeviceMismatch" not in type(e).__name__
                    if data_dependent(e) and on_meta(root) and _materialise not in fixes:
                        e.sapp_hint = _why_not_materialised(root)
                    raise (e if data_dependent(e) or past else first) from None
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
    if _materialise not in fixes and data_dependent(e) and _why_not_materialised(root) is None:
        return _materialise
    return None


def _real_example():
    return _EXAMPLE.get()


def _meta_tensors(root):
    """{id: tensor} of root's parameters and buffers on meta (a tied tensor once)."""
    out = {}
    for m in root.modules():
        for t in list(m._parameters.values()) + list(m._buffers.values()):
            if t is not None and t.device.type == "meta":
                out[id(t)] = t
    return out


def _why_not_materialised(root) -> str | None:
    """None when a meta model can be traced with stand-in values (see the module's doc), else the
    reason, phrased as what to pass instead."""
    import torch
    ex = _EXAMPLE.get()
    if ex is None or not on_meta(root):
        return "capture the model with real parameters and example inputs (not meta)"
    ts = [x for x in ex[0] + tuple(ex[1].values()) if isinstance(x, torch.Tensor)]
    if not ts or any(t.device.type == "meta" for t in ts):
        return ("pass real example inputs (not meta), or capture the model with real parameters and example "
                "inputs (not meta)")
    size = sum(t.numel() * t.element_size() for t in _meta_tensors(root).values())
    if size > MATERIALISE_MAX_BYTES:
        return (f"capture the model with real parameters and example inputs (not meta): its {size / 2**30:.1f} GiB of "
                f"meta parameters are more than sapp stands in for a trace ({MATERIALISE_MAX_BYTES / 2**30:.0f} GiB)")
    return None


@contextlib.contextmanager
def _materialise(root):
    """Every meta parameter and buffer of root swapped for a host tensor of stand-in values for the
    trace (seeded: the same model gives the same graph), and back afterwards; the example's real
    values are traced alongside (_real_values)."""
    import torch
    gen = torch.Generator().manual_seed(0)
    new = {}
    for i, t in _meta_tensors(root).items():
        with torch.no_grad():
            r = torch.zeros(t.shape, dtype=t.dtype)
            if r.is_floating_point():
                r.normal_(0.0, 0.02, generator=gen)
        new[i] = torch.nn.Parameter(r, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else r
    saved = []
    for m in root.modules():
        for slot in (m._parameters, m._buffers):
            for k, t in slot.items():
                if t is not None and id(t) in new:
                    saved.append((slot, k, t))
                    slot[k] = new[id(t)]
    try:
        with _real_values(root):
            yield
    finally:
        for slot, k, t in saved:
            slot[k] = t


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
