"""Recomputation: the plan's blocks checkpointed, whole or selectively (checkpointing.py)."""
