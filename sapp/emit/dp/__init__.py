"""Data parallelism: the gradient sync and optimizer per ZeRO stage (wrap.py: DDP, a flat all-reduce,
FSDP2), ZeRO-1's element-wise sharded optimizer states (zero1.py), BatchNorm statistics over dp
(batch_stats.py)."""
