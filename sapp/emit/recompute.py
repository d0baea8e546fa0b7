"""Activation recomputation: the plan's recompute section -> torch.utils.checkpoint on named modules.

"full" checkpoints a whole block (only its input is kept); "selective" checkpoints the block's
attention sub-module when it has one (the s^2 attention activations are the ones worth dropping),
else nothing.  The module's forward is replaced on the instance, so names, hooks and wrappers that
come later (tensor parallel, DDP, FSDP2) see the same module tree."""
from __future__ import annotations

import functools

from torch import nn
from torch.utils.checkpoint import checkpoint

ATTENTION_NAMES = ("attn", "attention", "self_attn", "self_attention")


def block_names(model: nn.Module) -> list:
    """Repeated blocks: the children of every ModuleList (`layers.3`, `transformer.h.0`)."""
    out = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList):
            out += [f"{name}.{child}" if name else child for child, _ in mod.named_children()]
    return out


def _checkpointed(mod: nn.Module) -> None:
    if getattr(mod, "_sapp_checkpointed", False):
        return
    inner = mod.forward

    @functools.wraps(inner)
    def forward(*args, **kwargs):
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    mod.forward = forward
    mod._sapp_checkpointed = True


def plan_modes(section: dict, model: nn.Module) -> dict:
    """{block name: mode} for this model: explicit block entries win over the default."""
    default = section.get("default", "none") or "none"
    modes = {}
    if default != "none":
        modes = {b: default for b in block_names(model)}
    modes.update(section.get("blocks") or {})
    return {k: v for k, v in sorted(modes.items()) if v != "none"}


def apply(model: nn.Module, modes: dict) -> list:
    """Checkpoint the blocks in `modes` (from plan_modes on the whole model) that exist in `model` (a
    pipeline stage holds only some); returns the names of the modules that now recompute."""
    mods = dict(model.named_modules())
    done = []
    for name, mode in sorted(modes.items()):
        mod = mods.get(name)
        if mod is None:
            continue
        if mode == "selective":
            for child in ATTENTION_NAMES:
                if f"{name}.{child}" in mods:
                    _checkpointed(mods[f"{name}.{child}"])
                    done.append(f"{name}.{child}")
                    break
        else:
            _checkpointed(mod)
            done.append(name)
    return done
