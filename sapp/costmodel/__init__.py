"""Pure cost functions (no torch, no I/O): roofline compute, alpha-beta collectives, resharding,
activation memory, model states with ZeRO.  Costs are additive over nodes and edges."""
from .edges import edge_cost, edge_times
from .evaluate import ShardingCost, evaluate_sharding, first_savers, param_owners
from .layouts import P, R, input_layout, layout_str, output_layout, reshard_time
from .memory import saved_activations, saved_items
from .nodes import NodeCost, node_cost, op_strategies, split_factors
from .primitives import collective_time, compute_time, model_state_bytes, sparse_table_state_bytes
from .settings import CostSettings

__all__ = [
    "CostSettings", "compute_time", "collective_time", "model_state_bytes", "sparse_table_state_bytes", "op_strategies", "node_cost",
    "NodeCost", "edge_cost", "edge_times", "saved_activations", "saved_items", "evaluate_sharding",
    "ShardingCost", "output_layout", "input_layout", "layout_str", "reshard_time", "R", "P",
    "split_factors", "param_owners", "first_savers",
]
