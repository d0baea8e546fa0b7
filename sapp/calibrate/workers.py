"""The measuring processes: spawned under a hard timeout, each running every measurement, results
reported to the parent; the quick reference probe."""
from __future__ import annotations

import queue as _queue
import os
import time

from .collectives import _measure_allreduce, _measure_p2p
from .config import FULL, QUICK, CalibrationError
from .dispatch import _measure_launch, _measure_sharded_launch
from .fsdp import _measure_fsdp
from .machine import _free_port, _usable_cpus
from .rates import _measure_gemm, _measure_local, _measure_op_rates
from .reference import TINY, _lockstep, _measure_reference, reference_step_seconds


def _worker(rank, procs, port, cfg, threads, results):
    try:
        import torch
        import torch.distributed as dist
        torch.set_num_threads(threads)
        cuda = torch.cuda.is_available() and torch.cuda.device_count() >= procs
        dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(dev)
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        if procs > 1:
            _loopback_group(dist, "nccl" if cuda else "gloo", rank, procs, port)
            dist.barrier()
        local = _measure_local(torch, dev, cfg, sync)
        local["launch"] = _measure_launch(torch, dev, cfg, sync)
        if dev.type != "cuda":       # GPUs: these ops are memory- or launch-bound, as the roofline says
            local["op_rates"] = _measure_op_rates(torch, dev, cfg, sync)
            lock = _lockstep(torch, dist, procs)
            local["reference_s"] = _measure_reference(torch, dev, cfg, sync, lockstep=lock)
            local["tiny_s"] = _measure_reference(torch, dev, cfg, sync, TINY)
        if procs > 1:
            local["launch"]["sharded"] = _measure_sharded_launch(torch, dev, cfg, sync, procs)
        ar = _measure_allreduce(torch, dist, dev, cfg, sync) if procs > 1 else {}
        others = {}
        if procs > 1 and not cuda:
            local["fsdp"] = _measure_fsdp(torch, dev, cfg, sync, procs)
        if procs > 1:
            for kind in ("all_gather", "reduce_scatter"):
                try:
                    others[kind] = _measure_allreduce(torch, dist, dev, cfg, sync, kind)
                except RuntimeError:          # a backend without it: the all-reduce fit stands in
                    pass
            others["p2p"] = _measure_p2p(torch, dist, dev, cfg, sync)
        if dev.type != "cuda":
            # a shared machine's speed drifts by tens of percent within seconds, and compute_scale is a
            # ratio of figures taken at different moments: measure the compute figures again at the
            # end and keep each one's better pass (what the machine does undisturbed)
            again = _measure_gemm(torch, dev, cfg, sync)
            local["gemm_flops"] = {n: max(r, again[n]) for n, r in local["gemm_flops"].items()}
            local["reference_s"] = min(local["reference_s"], _measure_reference(torch, dev, cfg, sync, lockstep=lock))
            local["tiny_s"] = min(local["tiny_s"], _measure_reference(torch, dev, cfg, sync, TINY))
        info = {"cuda": cuda, "backend": ("nccl" if cuda else "gloo") if procs > 1 else None,
                "device_memory": float(torch.cuda.get_device_properties(dev).total_memory) if cuda else None,
                "device_name": torch.cuda.get_device_name(dev) if cuda else "cpu"}
        results.put((rank, {"local": local, "allreduce": ar, "collectives": others, **info}))
        if procs > 1:
            dist.destroy_process_group()
    except Exception as e:            # reported to the parent, which raises a one-line error
        results.put((rank, {"error": f"{type(e).__name__}: {e}"}))


def _loopback_group(dist, backend, rank, procs, port):
    """The process group over loopback only.  `init_method="tcp://127.0.0.1:PORT"` does not do it:
    torch's TCPStore server listens on every interface whatever address it is given, so the store is
    served on a socket bound to 127.0.0.1 (as `sapp run` does), and gloo's own sockets use the loopback
    interface."""
    import socket
    from datetime import timedelta
    from ..emit.runtime.dist import bound_store
    lo = next((n for _, n in socket.if_nameindex() if n.startswith("lo")), None)
    if lo:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", lo)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", lo)
    timeout = timedelta(seconds=120)
    store = bound_store("127.0.0.1", port, rank, procs, timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=procs, timeout=timeout)


def _probe_worker(rank, procs, port, cfg, threads, results):
    try:
        import torch
        import torch.distributed as dist
        torch.set_num_threads(threads)
        if procs > 1:
            _loopback_group(dist, "gloo", rank, procs, port)
        ref = reference_step_seconds(torch, dist, procs, cfg["min_time"])
        if procs > 1:
            dist.destroy_process_group()
        results.put((rank, {"reference_s": ref}))
    except Exception as e:
        results.put((rank, {"error": f"{type(e).__name__}: {e}"}))


def probe(procs=2, timeout_s=60.0, threads=None) -> float:
    """Seconds of the reference block's training step on the slowest of `procs` concurrent CPU
    processes, now (a few seconds): what `compute_scale` was measured from.  Its ratio to the
    calibration's own figure is how much faster or slower a shared machine runs than when it was
    calibrated (bench.calibration_accuracy reports predictions corrected by it beside the raw ones)."""
    raw = _spawn(_probe_worker, procs, dict(QUICK, min_time=0.3), threads, timeout_s)
    return max(r["reference_s"] for r in raw["ranks"])


def reference_seconds(raw) -> float | None:
    """The calibration's reference-block step (slowest rank), from `measure()` output."""
    refs = [r["local"].get("reference_s") for r in raw["ranks"]]
    return max(refs) if all(refs) else None


def measure(procs=2, quick=False, timeout_s=120.0, threads=None):
    """Run the measurements in `procs` concurrent processes.  Returns the raw figures (per rank)."""
    return _spawn(_worker, procs, QUICK if quick else FULL, threads, timeout_s, quick=quick)


def _spawn(target, procs, cfg, threads, timeout_s, quick=False):
    import multiprocessing as mp
    if procs < 1:
        raise CalibrationError(f"--procs must be >= 1, got {procs}")
    if threads is None:
        threads = max(1, _usable_cpus() // procs)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    workers = [ctx.Process(target=target, args=(r, procs, port, cfg, threads, results), daemon=True)
               for r in range(procs)]
    for w in workers:
        w.start()
    got, deadline, finished = {}, time.monotonic() + timeout_s, False
    try:
        while len(got) < procs:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CalibrationError(f"calibration did not finish within {timeout_s:.0f} s; use --quick, fewer "
                                       f"--procs or a larger --timeout")
            try:
                rank, res = results.get(timeout=min(left, 1.0))
            except _queue.Empty:
                dead = [w for w in workers if w.exitcode not in (None, 0)]
                if dead:
                    raise CalibrationError(f"a calibration worker died (exit code {dead[0].exitcode})") from None
                continue
            if "error" in res:
                raise CalibrationError(f"calibration worker {rank} failed: {res['error']}")
            got[rank] = res
        finished = True
    finally:
        for w in workers:
            if finished:
                w.join(timeout=5)      # let a finished worker tear its process group down
            if w.is_alive():
                w.terminate()
                w.join(timeout=5)
    return {"procs": procs, "threads_per_proc": threads, "quick": bool(quick), "ranks": [got[r] for r in range(procs)]}
