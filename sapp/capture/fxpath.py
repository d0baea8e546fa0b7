"""Fallback when torch.export fails: not implemented yet -> None."""


def capture_fx(root, inputs, kwargs, strip, batch, gname, model):
    return None
