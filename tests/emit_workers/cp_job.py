"""Context-parallel plans (sapp search pinned to cp) emitted on gloo and compared with single-process
training of the same model on the same batches (tests/test_cp_emit.py).

    python -m tests.emit_workers.cp_job WORLD CASES.json OUT.json

A case: {"id", "plan_path", "steps", "batch", "model"}; "model" is a spec `model_spec` understands:
{"zoo": "gpt-tiny", "args": {...}} (dropout 0: the zoo's attention is causal) or {"hf": "llama",
"attn": "sdpa"|"eager"} (tests/emit_workers/hf_models.py).  Data: seeded token ids of the model's
whole sequence per step.  Each rank trains `steps` steps, the last under the memory meter, and
writes its losses, its final parameters' values (whole tensors, DTensor shards gathered), the
manifest and measured vs predicted memory.  The parent adds the single-process reference (plain
Adam on the whole batch)."""
from __future__ import annotations

import json
import os
import sys
import traceback

from tests.emit_workers.harness import fork_ranks

SEQ = 32


def model(spec=None):
    """(model in train mode, loss_fn, sequence length) of a case's spec, weights from seed 0."""
    import torch
    spec = spec or {"zoo": "gpt-tiny", "args": {"dropout": 0.0}}
    if "hf" in spec:
        from tests.emit_workers import hf_models
        m, loss_fn = hf_models.build(spec["hf"], device=spec.get("device", "cpu"))
        m.config._attn_implementation = spec.get("attn", "eager")
        return m, loss_fn, hf_models.SEQ
    import sapp.models as models
    torch.manual_seed(0)
    m = models.get(spec["zoo"], device=spec.get("device", "cpu"), **spec.get("args", {}))
    return m, models.loss_fn(m), SEQ


def batch(b, step, seq=SEQ):
    import torch
    g = torch.Generator().manual_seed(500 + step)
    ids = torch.randint(0, 256, (b, seq + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def _values(m):
    """Parameter values by name (a pipeline rank: its stage modules', which keep the model's names)."""
    out = {}
    named = m.named_parameters() if not isinstance(m, (list, tuple)) else \
        [(n, p) for mod in m for n, p in _unwrapped(mod).named_parameters()]
    for n, p in named:
        t = p.detach()
        t = t.full_tensor() if hasattr(t, "full_tensor") else t
        out[n] = t.reshape(-1).tolist()
    return out


def _unwrapped(mod):
    inner = getattr(mod, "module", None)
    return inner if isinstance(inner, __import__("torch").nn.Module) else mod


def reference(steps, b, spec=None):
    """Single-process training: losses and the final parameters (flattened, in named order)."""
    import torch
    m, loss_fn, seq = model(spec)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    losses = []
    for i in range(steps):
        x, y = batch(b, i, seq)
        loss = loss_fn(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    return losses, _values(m)


def run_case(case):
    from sapp.emit import emit
    from sapp.emit.runtime.memory_meter import MemoryMeter
    from sapp.plan import Plan
    from tests.emit_workers.truth_job import predicted_memory
    plan = Plan.load(case["plan_path"])
    m, loss_fn, seq = model(case.get("model"))
    x0, _ = batch(case["batch"], 0, seq)
    prog = emit(m, plan, loss_fn=loss_fn, lr=1e-3, example_inputs=(x0,), check_fingerprint=False)
    from tests.emit_workers.hf_harness import _record_sends
    losses, sends = [], _record_sends(prog)
    for i in range(case["steps"]):
        x, y = batch(case["batch"], i, seq)
        xs, ys = prog.shard(x, y)
        if i == case["steps"] - 1:
            with MemoryMeter(prog) as meter:
                losses.append(prog.step(xs, ys))
        else:
            losses.append(prog.step(xs, ys))
    return {"losses": losses, "coords": list(prog.coords), "local_tokens": list(xs.shape),
            "params": _values(m if prog.pp == 1 else prog.modules), "manifest": prog.manifest, "expected": prog.manifest_expected,
            "measured": meter.result(), "predicted": predicted_memory(plan, prog.stage_indices[0]),
            "stage": prog.stage_indices[0], "sends": sends}


def _worker(rank, world, cases, out_dir, store):
    import torch
    import torch.distributed as dist
    from datetime import timedelta
    torch.set_num_threads(1)
    results, code = {}, 0
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=30))
        for case in cases:
            try:
                results[case["id"]] = run_case(case)
            except Exception as e:
                results[case["id"]] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
            dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        results["__job__"] = {"error": traceback.format_exc()}
        code = 1
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv):
    world, cases_path, out_path = int(argv[0]), argv[1], argv[2]
    with open(cases_path) as f:
        cases = json.load(f)
    specs = {json.dumps(c["model"], sort_keys=True): c["model"] for c in cases if c.get("model")}
    failed, per_rank = fork_ranks(_worker, world, cases,
                                  builders=[lambda s=s: model(dict(s, device="meta")) for s in specs.values()])
    out = {"failed": failed, "cases": {}}
    for case in cases:
        losses, params = reference(case["steps"], case["batch"], case.get("model"))
        out["cases"][case["id"]] = {"ref_losses": losses, "ref_params": params,
                                    "ranks": {r: v.get(case["id"], v.get("__job__")) for r, v in sorted(per_rank.items())}}
    with open(out_path, "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
