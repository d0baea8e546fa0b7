"""`sapp run --elastic`: a worker group of another size than the plan's re-plans and goes on.

torchrun's agent (`--nnodes MIN:MAX`) restarts every worker when a node is lost (its workers fail
in a collective) and when a waiting node joins; the new group may have another world size.  Then,
before anything is built, rank 0 searches a plan for exactly that many devices (sapp/api/replan.py: the
plan's model, global batch, precision, runtime and the pins that still fit), writes it beside the
checkpoints as `plans/step-N-devices-W.json` (N: the checkpoint the group resumes from) and hands its
text to every rank; all ranks then resume that checkpoint under it (DCP reshards; the data order is
plan-independent, so the same global batch continues at the same sample).  A group of the plan's own
size uses the plan given to `sapp run`, so a job that lost a node and got it back returns to it."""
from __future__ import annotations

import os
import time

SEARCH_TIMEOUT_S = 900.0      # the other ranks wait this long for rank 0's search


def plan_for_world(args, plan, world: int, local_world: int, rank: int, restarted: bool, say=print, *,
                   replan=None):
    """The plan this group trains with: `plan` itself when it is for `world` devices, else a re-plan.
    Each group a restart forms says which, on the terminal and in rank 0's --log-json.
    replan(model, plan, cluster, exact=True): sapp.api.replan.replan, handed in by the worker's entry
    (sapp/commands/run_worker.py): the re-plan searches, and the emitter sits below the search."""
    if int(plan.devices) == world:
        if restarted and rank == 0:
            from ...plan import summary
            from .train_log import log_event
            say(f"sapp run: a group of {world} devices: the plan's own layout ({_layout(plan)})")
            log_event(args.log_json, rank, "replan", devices=world, plan=args.plan, new=summary(plan))
        return plan
    import torch.distributed as dist
    from ...plan import Plan
    from .dist import slow_group
    if world == 1 or not dist.is_initialized():
        # a group of one: torchrun gives it WORLD_SIZE 1 and the worker forms no process group (there
        # is no peer to hand the plan to), so the re-plan is this process's own
        kind, text = _replan_text(args, plan, world, local_world, say, replan)
    else:
        # its own gloo group: the search may outlast the training group's short hang timeout.  Formed
        # before the search (its set-up waits only the short timeout for every rank, not for rank 0's search)
        group = slow_group(SEARCH_TIMEOUT_S)
        box = [None]
        if rank == 0:
            box[0] = _replan_text(args, plan, world, local_world, say, replan)
        dist.broadcast_object_list(box, src=0, group=group)    # a plan's text (or an error's): data, parsed below
        dist.destroy_process_group(group)
        kind, text = box[0]
    if kind == "error":
        from ...errors import SappError
        raise SappError(text)
    return Plan.from_json(text, source="the elastic re-plan")


def _layout(plan) -> str:
    p = plan["parallel"]
    return f"dp {p['dp']} tp {p['tp']} pp {p['pp']}"


def _replan_text(args, plan, world, local_world, say, replan):
    from ...errors import SappError
    from ...cluster import Cluster
    from .checkpoint_find import resume_point
    t0 = time.perf_counter()
    if os.environ.get("SAPP_FAULT_REPLAN") and not int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0):
        import signal                    # tests: rank 0 dies inside the re-plan, in the job's first attempt
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        if replan is None:    # a worker started without the entry `sapp run` launches
            raise SappError("an elastic re-plan needs the re-planning search: start the worker as `sapp run` does "
                            "(python -m sapp.commands.run_worker)")
        # the plan's device figures, this group's shape (nodes x processes per node)
        cl = Cluster.from_dict(plan["cluster"], where="the plan's cluster").replace(
            gpus_per_node=local_world, nodes=max(world // local_world, 1)).validate()
        r = replan(args.model, plan, cl, exact=True)
        found = resume_point(args.checkpoint_dir, log=lambda _m: None)
        step = int(found[1]["step"]) if found else 0
    except SappError as e:
        msg = (f"no plan for the {world} devices of this group ({e}); the checkpoints in {args.checkpoint_dir} are "
               "intact: restart with more nodes")
        say(f"sapp run: {msg}")
        return "error", msg
    # plans/ and the file are opened without following links (a planted one would have rank 0 write
    # outside the checkpoint directory); an existing name is replaced by a rename, never written through
    path = os.path.join(args.checkpoint_dir, "plans", f"step-{step:08d}-devices-{world}.json")
    try:
        r.plan.save(path, under=args.checkpoint_dir)
    except SappError as e:
        msg = f"{e}; the checkpoints in {args.checkpoint_dir} are intact: remove what is in the way and restart"
        say(f"sapp run: {msg}")
        return "error", msg
    from .train_log import log_event
    log_event(args.log_json, 0, "replan", devices=world, plan=path, resume_step=step, old=r.old, new=r.new,
              search_s=round(r.search_s, 3), dropped_pins=r.dropped_pins)
    say(f"sapp run: re-planned for {world} devices (the plan is for {plan.devices}) in {time.perf_counter() - t0:.1f} s, "
        f"resuming from step {step}; written to {path}")
    for line in r.lines():
        say(f"sapp run:   {line}")
    return "ok", r.plan.to_json()
