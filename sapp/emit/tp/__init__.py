"""Tensor and sequence parallelism: DTensor layouts derived from the plan (parallel.py), sequence
shards between the regions (sp.py, sp_entry.py), HF Conv1D splits, batch-norm statistics over dp."""
