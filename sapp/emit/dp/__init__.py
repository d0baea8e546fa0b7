"""Data parallelism's ZeRO-1: optimizer states sharded element-wise over dp (zero1.py); DDP and FSDP2
wrapping is tp/parallel.wrap_dp."""
