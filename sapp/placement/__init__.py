"""Host/device placement: embedding tables (+ their sparse optimizers) and optimizer states on the host.

MindSpore places these by hand ("no automatic configuration from the network"); sapp prices each
placement with the cost model in `cost.py` and the joint search picks one per candidate
configuration:

    opts = placement_options(graph, stage_nodes, cluster, settings, dp=.., tp=.., zero=..,
                             micro_batches=.., compute_s=..)          # "device" first
    # the search adds o.extra_time_s to the step and subtracts o.device_bytes_saved from device
    # memory, keeps o.host_bytes <= the node's host memory, and writes o.section as plan["placement"]
    best = choose(opts, device_bytes, device_capacity)   # convenience: fastest option that fits

Options: "device" (nothing moves), "embedding-host" (sparse embedding tables and their optimizers on
the host), "optimizer-host" (ZeRO-Offload of the dense parameters' optimizer), and
"embedding+optimizer-host".  Options that exceed the host memory available to the stage (its
devices' share of `cluster.host_memory`) are dropped; `require_host_memory` / `host_infeasible_error`
give the InfeasibleError with the numbers.  Pins: {"deep_emb.*": "host", "optimizer": "host"}
(fnmatch on parameter qualnames; values "host"/"device") remove the alternatives they contradict.

Plan section schema (plan["placement"]):

    {"groups": {
        "<param qualname or fnmatch pattern>": {
            "weights":        "host" | "device",   # where the parameter itself lives
            "grads":          "host" | "device",   # where its gradient is accumulated
            "master_weights": "host" | "device",   # optional: fp32 master copy (optimizer offload)
            "optimizer":      "host" | "device",   # where the optimizer state lives and steps
            "optimizer_kind": "sparse_adam" | "ftrl" | "adam" | "adamw"}},
     "predicted": {
        "option": name, "host_s": host busy time per step, "link_bytes": host<->device bytes per
        device per step, "saved_bytes": device bytes saved per device, "overlap_s": host time hidden
        behind device compute, "exposed_s": step time added, "host_bytes_per_node",
        "host_capacity_per_node", "host_fits", "components": {"embedding"|"optimizer": breakdown},
        "alternatives": {option: {extra_time_s, device_bytes_saved, host_bytes_per_node, host_fits}},
        "model": overlap constants, and after choose(): "reason", "device_bytes_needed",
        "device_capacity"}}

Examples: host tables `{"deep_emb.weight": {"weights": "host", "grads": "host", "optimizer": "host",
"optimizer_kind": "sparse_adam"}, "wide_emb.weight": {... "optimizer_kind": "ftrl"}}`; optimizer
offload `{"*": {"weights": "device", "grads": "host", "master_weights": "host", "optimizer": "host",
"optimizer_kind": "adam"}}` ("*" when the stage holds every parameter, else "layers.3.*" per block
and exact names).  A parameter takes the entry of its exact qualname, else of the most specific
matching pattern (see schema.resolve); unmatched parameters live on the device.  Wide tables (first
qualname component contains "wide") use FTRL, other tables lazy Adam (MindSpore's Wide&Deep).
"""
from .cost import HostCost, Table, embedding_host_cost, optimizer_offload_cost
from .decide import (NAMES, PlacementOption, choose, host_capacity, host_infeasible_error, merge_sections,
                     placement_options, require_host_memory)
from .schema import resolve, validate_section

__all__ = ["PlacementOption", "placement_options", "choose", "merge_sections", "require_host_memory", "host_infeasible_error",
           "host_capacity", "resolve", "validate_section", "embedding_host_cost", "optimizer_offload_cost",
           "Table", "HostCost", "NAMES"]
