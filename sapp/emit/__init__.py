"""Plan -> running torch.distributed training program.

    sapp.emit.runtime.dist.init()                # from the torchrun environment (gloo / nccl, 20 s timeout)
    torch.manual_seed(0); model = sapp.models.get("gpt-tiny", device="cpu")   # rank 0's weights are used
    prog = sapp.emit.emit(model, plan, lr=1e-3, example_inputs=x)
    for x, y in batches:                         # global batches, identical on every rank
        loss = prog.step(*prog.shard(x, y))      # this rank's dp shard in, global mean loss out

`emit` (recipe.py) is a recipe: checks first (checks/before.py: a plan sapp cannot run as priced is
refused before anything is built), then one step per plan feature, each a function in steps/ taking
the typed groups of build.py it reads (Rank, Layout, Training, RecomputePlan, Placement, Audit) and
`Made`, what the steps make, in this order:
  same_start        every parameter and buffer broadcast from rank 0 (a model whose __init__ draws
                    from Python's random built other weights on each rank)
  context_parallel  the attention rewritten for a token shard -- before the trace, so stages keep it
  pipeline.split    this rank's stages, traced copies (the model itself without a pipeline)
  per stage: host_placement (device / CPU tables) -> recomputation (checkpoint wrappers around plain
  blocks) -> tensor_parallel (DTensor layers inside them) -> sparse_tables, expert_parallel (parameters
  kept out of the dp sync, synced by hooks of their own) -> data_parallel (DDP / FSDP2 outermost)
  tensor_parallel.partial_grads, pipeline.tie (gradient hooks that need every stage wrapped)
  optimizers        after the wrappers, which replace parameters (FSDP2) -- ZeRO-1 shards states here
  pipeline.schedule the wrapped stages handed to the plan's schedule
Then the manifest (checks/manifest.py, `prog.manifest`) compares what was built with the plan on every
rank: a difference is a PlanError naming the field, or with allow_mismatch=True a loud note and
`prog.repriced`, the prediction of what really runs.

A new parallelism: its mechanism in a package of its own (like ep/), one module in steps/ with
`apply(layout, made, s)` naming the groups it reads (as steps/expert_parallel.py; its degree in
build.py's `Layout` and `start`), one line in recipe.py at its place in the order, and its plan field
compared in checks/manifest.py.  Packages: checks/ (before and after the steps),
steps/ (the recipe's steps), tp/ cp/ pp/ ep/ dp/ host/ recompute/ (how each feature runs), runtime/
(the training program and `sapp run`'s worker: loop, launch, data, checkpoints, logs)."""


def __getattr__(name):
    # loaded on first use, not on import: `sapp run`'s worker (and .launch) imports this
    # package first, and its first act, the lifeline (runtime/lifeline.py), must not wait seconds for torch
    if name == "emit":
        from .recipe import emit
        return emit
    if name == "Program":
        from .runtime.program import Program
        return Program
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["emit", "Program"]
