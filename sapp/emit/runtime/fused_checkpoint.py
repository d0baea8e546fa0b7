"""Checkpoints of fused q/k/v projections split by heads (sapp/emit/tp/fused.py) in the model's own
row order, so they load under any other plan (tp=1, another tp, a pipeline).

A permuted layer's rows sit in rank order inside its DTensor (rank r's block holds its share of every
piece); DCP would write that order.  DCP's planners are extended (`SavePlanner`, `LoadPlanner`) to
write and read such an entry's local rows as the pieces they are in the model's layout: one chunk per
run of rows contiguous in both orders, for every entry of that parameter (the weight, and Adam's
moments alike).  DCP's metadata then describes the model's tensor, whatever plan wrote it."""
from __future__ import annotations

import dataclasses

import torch

from ..tp.fused import segments
from .train_state import CheckpointError


def state_keys(state: dict, params: dict) -> dict:
    """{checkpoint entry: (axis, sizes, tp)} for the entries of the permuted parameters:
    `model.<param>` and `optim.<param>.<key>` holding a tensor of the parameter's shape."""
    out = {}
    for key, v in state.items():
        head, _, rest = key.partition(".")
        if head == "model" and rest in params:
            out[key] = params[rest]
        elif head == "optim":
            base, _, _ = rest.rpartition(".")
            if base in params and torch.is_tensor(v) and v.dim() > params[base][0]:
                out[key] = params[base]
    return out


def pieces(t, spec) -> list:
    """[(ChunkStorageMetadata in the model's layout, the local view it is)] of a fused entry."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    ax, sizes, tp = spec
    if not isinstance(t, DTensor):
        raise CheckpointError("a fused q/k/v entry is not tensor-parallel here; checkpoint this run without "
                              "tensor parallelism or with the search's layout")
    shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    local = t.to_local()
    lo, hi = offset[ax], offset[ax] + shape[ax]
    out = []
    for start, model_start, rows in segments(sizes, tp):
        a, b = max(lo, start), min(hi, start + rows)
        if a >= b:
            continue
        offs, lens = list(offset), list(shape)
        offs[ax], lens[ax] = model_start + (a - start), b - a
        out.append((ChunkStorageMetadata(offsets=torch.Size(offs), sizes=torch.Size(lens)),
                    local.narrow(ax, a - lo, b - a)))
    return out


def _planners():
    from torch.distributed.checkpoint.default_planner import (DefaultLoadPlanner, DefaultSavePlanner,
                                                              create_default_local_load_plan)
    from torch.distributed.checkpoint.metadata import MetadataIndex, TensorProperties
    from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType
    from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

    class SavePlanner(DefaultSavePlanner):
        """DCP's default save, with each fused entry written as its pieces in the model's layout."""

        def __init__(self, fused: dict):
            super().__init__()
            self.fused, self.views = fused, {}

        def create_local_plan(self):
            plan = super().create_local_plan()
            items = [w for w in plan.items if w.index.fqn not in self.fused]
            for fqn, spec in self.fused.items():
                t = self.state_dict.get(fqn)
                if t is None:
                    continue
                props = TensorProperties.create_from_tensor(t.to_local())
                for chunk, view in pieces(t, spec):
                    self.views[(fqn, tuple(chunk.offsets))] = view
                    items.append(WriteItem(index=MetadataIndex(fqn, chunk.offsets), type=WriteItemType.SHARD,
                                           tensor_data=TensorWriteData(chunk=chunk, properties=props, size=t.size())))
            self.plan = dataclasses.replace(plan, items=items)
            return self.plan

        def lookup_object(self, index):
            if index.fqn in self.fused:
                return self.views[(index.fqn, tuple(index.offset))].contiguous()
            return super().lookup_object(index)

    class LoadPlanner(DefaultLoadPlanner):
        """DCP's default load, with each fused entry read from its pieces in the model's layout into
        this rank's rows (rank order)."""

        def __init__(self, fused: dict):
            super().__init__()
            self.fused, self.views = fused, {}

        def create_local_plan(self):
            plain = {k: v for k, v in self.state_dict.items() if k not in self.fused}
            plan = create_default_local_load_plan(plain, self.metadata, not self.allow_partial_load)
            for fqn, spec in self.fused.items():
                t = self.state_dict.get(fqn)
                md = self.metadata.state_dict_metadata.get(fqn)
                if t is None or md is None:
                    continue
                if tuple(md.size) != tuple(t.size()):
                    raise ValueError(f"Size mismatch between saved {md.size} and current: {t.size()} for {fqn}")
                chunks = []
                for chunk, view in pieces(t, spec):
                    self.views[(fqn, tuple(chunk.offsets))] = view
                    chunks.append(chunk)
                plan.items.extend(create_read_items_for_chunk_list(fqn, md, chunks))
            return plan

        def lookup_tensor(self, index):
            if index.fqn in self.fused:
                return self.views[(index.fqn, tuple(index.offset))]
            return super().lookup_tensor(index)

    return SavePlanner, LoadPlanner


def save_planner(fused: dict):
    """A DCP save planner for a state with fused entries ({entry: spec}); None: DCP's default."""
    return _planners()[0](fused) if fused else None


def load_planner(fused: dict):
    """A DCP load planner for a state with fused entries ({entry: spec}); None: DCP's default."""
    return _planners()[1](fused) if fused else None
