"""Trace a Hugging Face model as its training step runs, not as transformers guards a trace.

In eager training without a padding mask (what `sapp run` feeds a model: token ids only) transformers
builds no attention mask: `_ignore_causal_mask_sdpa` lets SDPA mask causally inside the kernel
(`is_causal=True`, flash attention on a GPU) and grouped-query K/V reach the kernel un-repeated
(`enable_gqa`).  Under torch.export the same code takes its tracing-safe branch instead: it
materialises a (batch, 1, s, s) boolean mask (plus a packed-sequence check on the position ids),
passes it to SDPA, and therefore repeats K/V to every query head.  Priced from such a trace a Llama-3
layer at 131k tokens would build and read a 17 GB mask per sample, and keep K/V 16x larger than the
kernel does.  So the capture (and the emitter's pipeline trace, which must run as priced) trace under
`training_semantics()`: the mask skip taken whenever no padding mask or sliding window asks for a
mask, and no packed-sequence detection (the emitted programs pass no packed position ids: positions
are an arange, or cp's global positions whose attention builds its own mask).  A model whose
transformers has neither function is traced unchanged."""
from __future__ import annotations

import contextlib
import inspect


def _skip(a: dict):
    """The run-time answer for bound arguments `a`, or None where the original must decide."""
    local = a.get("local_attention_size")
    if a.get("padding_mask") is not None or (local is not None and a["kv_length"] >= local):
        return None                     # a real mask is needed: ask the original
    return a["q_length"] == 1 or a["kv_length"] == a["q_length"]


@contextlib.contextmanager
def training_semantics():
    try:
        import transformers.masking_utils as mu
    except Exception:                   # noqa: BLE001 - no transformers: nothing to adjust
        yield
        return
    orig_ignore = getattr(mu, "_ignore_causal_mask_sdpa", None)
    orig_packed = getattr(mu, "find_packed_sequence_indices", None)
    if orig_ignore is None or orig_packed is None:
        yield
        return

    sig = inspect.signature(orig_ignore)

    def ignore(*args, **kwargs):
        try:
            got = _skip(sig.bind(*args, **kwargs).arguments)
        except (TypeError, KeyError):   # another transformers' signature: its own answer
            got = None
        return orig_ignore(*args, **kwargs) if got is None else got

    mu._ignore_causal_mask_sdpa = ignore
    mu.find_packed_sequence_indices = lambda *a, **k: None
    try:
        yield
    finally:
        mu._ignore_causal_mask_sdpa = orig_ignore
        mu.find_packed_sequence_indices = orig_packed
