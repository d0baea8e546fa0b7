"""Activation recomputation: which tensors each policy keeps (activations.py) and the per-block
choice that fits memory at the least extra compute (solver.py)."""
from .solver import POLICIES, BlockOption, RecomputeChoice, choose_recompute, choose_uniform, frontier

__all__ = ["POLICIES", "BlockOption", "RecomputeChoice", "choose_recompute", "choose_uniform", "frontier"]
