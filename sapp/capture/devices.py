"""The device type model code sees while a model on meta is traced.

Capture (and the pre-step checks the search runs for the plan it returns) trace a model whose
parameters live on the meta device: nothing is allocated or computed.  Model code that asks a
tensor's device type for an autocast region - `torch.autocast(x.device.type, enabled=False)` around
rotary embeddings, a common idiom - then asks for autocast on 'meta', which torch refuses
("unsupported scalarType"), though the model trains fine on cpu or cuda.  While a trace runs,
autocast entered for 'meta' is entered for the device type training runs on instead (this
machine's accelerator, else cpu): the region traced is the one a training rank runs.  Only the
autocast constructor is touched, for the trace's duration; tensors keep their meta device."""
from __future__ import annotations

import contextlib
import threading

_LOCK = threading.Lock()
_DEPTH = [0]


def training_device_type() -> str:
    import torch
    acc = getattr(torch, "accelerator", None)
    dev = acc.current_accelerator() if acc is not None and hasattr(acc, "current_accelerator") else None
    return dev.type if dev is not None else "cpu"


@contextlib.contextmanager
def meta_as_training_device():
    """Within: `torch.autocast("meta", ...)` (any alias of torch.amp.autocast) runs as autocast on
    training_device_type().  Re-entrant; the constructor is restored when the outermost exits."""
    from torch.amp import autocast_mode
    cls = autocast_mode.autocast
    with _LOCK:
        _DEPTH[0] += 1
        if _DEPTH[0] == 1:
            orig = cls.__init__
            target = training_device_type()

            def __init__(self, device_type, *args, **kwargs):
                orig(self, target if device_type == "meta" else device_type, *args, **kwargs)

            __init__.sapp_original = orig
            cls.__init__ = __init__
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH[0] -= 1
            if _DEPTH[0] == 0:
                cls.__init__ = cls.__init__.sapp_original
