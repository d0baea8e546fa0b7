"""Capture leaves the user's module as it found it.

A forward may cache what it computed on the module: x-transformers' ALiBi registers its bias as a
buffer on the first call and slices it on later ones, rotary embeddings keep their cos/sin tables as
attributes.  Traced under torch.export those caches are fake or meta tensors, so after capture the
user's real model would hold a FakeTensor (its next real forward returned a symbolic value), and a
second capture of the same module (the emitter's shape audit at one rank's shapes) would trace the
cached path instead of the one the first capture priced.  `kept` restores every module's buffers,
parameters and tensor attributes after the trace, and drops those the trace added."""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def kept(root):
    import torch
    saved = [(m, dict(m._buffers), dict(m._parameters),
              {k: v for k, v in vars(m).items() if isinstance(v, torch.Tensor)}) for m in root.modules()]
    try:
        yield
    finally:
        for m, bufs, params, attrs in saved:
            if m._buffers != bufs:                    # the dicts themselves stay (hooks may hold them)
                m._buffers.clear()
                m._buffers.update(bufs)
            if m._parameters != params:
                m._parameters.clear()
                m._parameters.update(params)
            now = vars(m)
            for k in [k for k, v in now.items() if isinstance(v, torch.Tensor) and k not in attrs]:
                del now[k]
            now.update(attrs)


@contextlib.contextmanager
def aliases_hidden(root):
    """A module registered under a second path is, for the trace, an attribute only.  performer-pytorch
    keeps its layers under `net` and again under `proj_updater.instance`; torch.export's module
    hierarchy and the pipeline split need every module to have one parent ("Child module 'norm' is not
    a descendant of parent module ...").  The first path (named_modules' order, the name sapp gives the
    module everywhere) stays registered; forward still reaches the alias as a plain attribute; every
    parent's registrations come back as they were, in their order."""
    seen, hidden = {id(root)}, []

    def walk(m):
        for name, child in list(m._modules.items()):
            if child is None:
                continue
            if id(child) in seen:
                hidden.append((m, name, child, dict(m._modules)))
            else:
                seen.add(id(child))
                walk(child)
    walk(root)
    for m, name, child, _ in hidden:
        del m._modules[name]
        object.__setattr__(m, name, child)           # an attribute, not a registration
    try:
        yield
    finally:
        for m, name, child, registered in reversed(hidden):
            vars(m).pop(name, None)
            m._modules.clear()
            m._modules.update(registered)
