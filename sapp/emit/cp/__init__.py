"""Context parallelism: attention over a token shard with a K/V exchange (cp.py, cp_attention.py,
cp_hf.py) and the program that feeds each rank its tokens (program.py)."""
