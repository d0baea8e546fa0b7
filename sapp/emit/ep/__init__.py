"""Expert parallelism: MoE experts spread over EP groups, tokens dispatched to them (experts.py)."""
