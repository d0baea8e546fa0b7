"""Host placement: embedding tables kept on the CPU, their sparse gradients synchronised, optimizer
offload (host.py, optimizers.py, stats.py) and device sparse tables (sparse.py)."""
