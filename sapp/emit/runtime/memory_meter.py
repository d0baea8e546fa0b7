"""A CPU-safe memory meter for one rank of an emitted program, counting what the cost model counts.

    meter = MemoryMeter(prog)
    with meter:                        # saved-tensor hooks + optimizer hooks on this rank
        prog.step(x, y)
    meter.result()  # {"params", "grads", "optimizer", "activations", "transient", "buffers", "total"}

On a CPU there is no allocator to ask (tracemalloc does not see torch), so each component is counted
from the objects that hold it, in device bytes, each storage once:
  params       local parameter storages (FSDP2 / DTensor shards), host tables excluded
  grads        local gradient storages, host tables excluded: the most alive when the optimizers step or
               during a forward (one after an earlier micro-batch's backward runs next to FSDP2's
               unsharded accumulators); not inside a backward, see `acquire`
  optimizer    the device optimizers' state tensors after their step (host optimizers excluded)
  activations  peak live bytes of tensors saved for backward: saved-tensor hooks (autograd, and the
               inputs a non-reentrant checkpoint keeps) plus what selective checkpointing caches
               (sapp/emit/recompute/checkpointing.py reports its cache here), parameters and their views excluded
  transient    how far saved + FSDP2's gathered (unsharded) parameters ever rise above the activation
               peak (sampled whenever a tensor is saved, or used by backward)
  buffers      the flat gradient all-reduce buffer the CPU data-parallel path keeps (not priced)
Storages are keyed by data pointer; a view saved for backward holds its whole storage."""
from __future__ import annotations

import torch
from torch import nn

ACTIVE = None           # the meter in use, if any (recompute.py reports selective caches to it)


def _local(t):
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def _key_bytes(t):
    t = _local(t)
    try:
        st = t.untyped_storage()
        return st.data_ptr(), st.nbytes()
    except Exception:           # sparse / meta / wrapper tensors: count their element bytes
        return id(t), t.numel() * t.element_size() if t.layout == torch.strided else 0


def _unwrap(m):
    inner = getattr(m, "module", None)
    return inner if isinstance(inner, nn.Module) else m


class _Held:
    __slots__ = ("t", "meter", "key", "__weakref__")

    def __init__(self, t, meter, key):
        self.t, self.meter, self.key = t, meter, key

    def __del__(self):
        try:
            self.meter._release(self.key)
        except Exception:
            pass


class MemoryMeter:
    def __init__(self, prog):
        self.prog = prog
        self.mods = [_unwrap(m) for m in prog.modules]
        self.live = {}            # storage key -> [refs, bytes]
        self.live_bytes = 0
        self.peak_act = 0
        self.peak_with_gathered = 0
        self.grads = 0
        self.optimizer = 0
        self._params = self._param_keys()
        self._fsdp = [m for mod in self.mods for m in mod.modules() if type(m).__name__.startswith("FSDP")]
        self._hooks = []

    # ---- what is a parameter -----------------------------------------------------------------
    def _host_params(self):
        out = set()
        for mod in self.mods:
            for m in mod.modules():
                if type(m).__name__ == "HostEmbedding":
                    out.add(id(m.weight))
        return out

    def _param_keys(self):
        keys = set()
        for mod in self.mods:
            for p in mod.parameters():
                keys.add(_key_bytes(p)[0])
        return keys

    def _is_param(self, t) -> bool:
        if isinstance(t, nn.Parameter) or (t.is_leaf and t.requires_grad):
            return True
        base = t._base
        if base is not None and (isinstance(base, nn.Parameter) or (base.is_leaf and base.requires_grad)):
            return True
        return _key_bytes(t)[0] in self._params

    # ---- live saved bytes --------------------------------------------------------------------
    def acquire(self, t):
        """Count `t` as held for backward; returns the key to release."""
        key, nb = _key_bytes(t)
        e = self.live.get(key)
        if e is None:
            self.live[key] = [1, nb]
            self.live_bytes += nb
            self.peak_act = max(self.peak_act, self.live_bytes)
            if self._fsdp and torch._C._current_graph_task_id() == -1:
                # a forward after an earlier micro-batch's backward (accumulation, a pipeline's steady
                # state) runs next to FSDP2's unsharded gradient accumulators.  Not read inside a
                # backward (a recomputation): gradients there are partly unit gradients waiting for their
                # reduce-scatter, alive while the activations are below their forward peak
                self.grads = max(self.grads, self._grad_bytes(unsharded=True))
            self._sample()
        else:
            e[0] += 1
        return key

    def _sample(self):
        """FSDP2 gathers parameters after the activation peak too (each unit again for its backward):
        the transient is the most that saved + gathered bytes ever exceed the saved peak."""
        if self._fsdp:
            self.peak_with_gathered = max(self.peak_with_gathered, self.live_bytes + self._unsharded_bytes())

    def _release(self, key):
        e = self.live.get(key)
        if e is None:
            return
        e[0] -= 1
        if e[0] == 0:
            self.live_bytes -= e[1]
            del self.live[key]

    @property
    def peak_transient(self):
        return max(0, self.peak_with_gathered - self.peak_act)

    def _pack(self, t):
        if not torch.is_tensor(t) or self._is_param(t):
            return t
        return _Held(t, self, self.acquire(t))

    def _unpack(self, h):
        self._sample()          # backward uses a saved tensor: the unit's parameters are gathered now
        return h.t if isinstance(h, _Held) else h

    def _fsdp_params(self):
        for m in self._fsdp:
            try:
                group = m._get_fsdp_state()._fsdp_param_group
                params = group.fsdp_params if group is not None else []
            except Exception:
                continue
            yield from params

    def _unsharded_bytes(self) -> int:
        seen, total = set(), 0
        for fp in self._fsdp_params():
            t = getattr(fp, "_unsharded_param", None)
            if t is None:
                continue
            key, nb = _key_bytes(t)
            if key not in seen and nb:
                seen.add(key)
                total += nb
        # a prefetched unit (FSDP2's backward prefetch: the next unit's all-gather issued in this unit's
        # pre-backward) sits in its flat all-gather output until its own backward copies it out
        for t in self._pending_gathers():
            key, nb = _key_bytes(t)
            if key not in seen and nb:
                seen.add(key)
                total += nb
        return total

    def _pending_gathers(self):
        for m in self._fsdp:
            try:
                group = m._get_fsdp_state()._fsdp_param_group
                res = getattr(group, "_all_gather_result", None) if group is not None else None
            except Exception:
                continue
            if res is not None and getattr(res, "all_gather_output", None) is not None:
                yield res.all_gather_output

    # ---- states ------------------------------------------------------------------------------
    def params(self) -> int:
        host = self._host_params()
        seen, total = set(), 0
        for mod in self.mods:
            for p in mod.parameters():
                if id(p) in host:
                    continue
                key, nb = _key_bytes(p)
                if key not in seen:
                    seen.add(key)
                    total += nb
        return total

    def _grad_bytes(self, unsharded=False) -> int:
        """Gradient storages of this rank's parameters; `unsharded` adds FSDP2's unsharded gradient
        accumulators (set_requires_gradient_sync(False) between micro-batches keeps them on the
        unsharded parameters, which FSDP2 registers on the modules while they are gathered)."""
        host = self._host_params()
        seen, total = set(), 0
        grads = [p.grad for mod in self.mods for p in mod.parameters() if id(p) not in host]
        if unsharded:
            for fp in self._fsdp_params():
                grads.append(getattr(fp, "unsharded_accumulated_grad", None))
                grads.append(getattr(getattr(fp, "_unsharded_param", None), "grad", None))
        for g in grads:
            if torch.is_tensor(g):
                key, nb = _key_bytes(g)
                if key not in seen and nb:
                    seen.add(key)
                    total += nb
        return total

    def _state_bytes(self) -> int:
        seen, total = set(), 0
        for opt in self.prog.optimizers:
            if getattr(opt, "sapp_where", "device") == "host":
                continue
            # ZeroRedundancyOptimizer keeps this rank's shard in .optim; zero1.LocalShardZero1 wraps one
            while isinstance(getattr(opt, "optim", None), torch.optim.Optimizer):
                opt = opt.optim
            state = getattr(opt, "state", {})
            for st in state.values():
                for v in st.values():
                    if torch.is_tensor(v) and v.numel() > 1:       # Adam's step counter is a scalar
                        key, nb = _key_bytes(v)
                        if key not in seen:
                            seen.add(key)
                            total += nb
        return total

    def _buffers(self) -> int:
        total = 0
        for h in self.prog.grad_hooks:
            flat = getattr(h, "_flat", None)
            if torch.is_tensor(flat):
                total += flat.numel() * flat.element_size()
        return total

    # ---- context -----------------------------------------------------------------------------
    def __enter__(self):
        global ACTIVE
        ACTIVE = self
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._ctx.__enter__()
        self._patch_recompute()
        for opt in self.prog.optimizers:
            if hasattr(opt, "register_step_pre_hook"):
                self._hooks.append(opt.register_step_pre_hook(lambda *a: self._on_grads()))
                self._hooks.append(opt.register_step_post_hook(lambda *a: self._on_states()))
        self._wrapped = []
        for opt in self.prog.optimizers:          # optimizer-likes without hooks (zero1.LocalShardZero1)
            if not hasattr(opt, "register_step_pre_hook"):
                inner = opt.step

                def step(inner=inner):
                    self._on_grads()
                    inner()
                    self._on_states()
                opt.step = step
                self._wrapped.append(opt)
        return self

    def _on_grads(self):
        self.grads = max(self.grads, self._grad_bytes())

    def _on_states(self):
        self.optimizer = max(self.optimizer, self._state_bytes())

    def _patch_recompute(self):
        """Count what a checkpointed region's recomputation keeps until backward consumes it (the
        recompute transient): torch stores those tensors from its own saved-tensor hook, which hides
        ours while it is active."""
        import weakref
        import torch.utils.checkpoint as ckpt
        meter, orig = self, ckpt._recomputation_hook
        self._orig_recompute = orig

        class Metered(orig):
            def __init__(self, frame_ref, gid):
                super().__init__(frame_ref, gid)
                inner = self.pack_hook

                def pack(x):
                    counted = torch.is_tensor(x) and not meter._is_param(x)
                    key = meter.acquire(x) if counted else None
                    try:
                        y = inner(x)
                    except BaseException:
                        if counted:
                            weakref.finalize(x, meter._release, key)
                        raise
                    if counted:
                        weakref.finalize(y, meter._release, key)
                    return y
                self.pack_hook = pack

        ckpt._recomputation_hook = Metered

    def __exit__(self, *exc):
        global ACTIVE
        import torch.utils.checkpoint as ckpt
        ckpt._recomputation_hook = self._orig_recompute
        self._ctx.__exit__(*exc)
        for h in self._hooks:
            h.remove()
        for opt in self._wrapped:
            del opt.step
        ACTIVE = None
        return False

    def result(self) -> dict:
        out = {"params": self.params(), "grads": self.grads, "optimizer": max(self.optimizer, self._state_bytes()),
               "activations": self.peak_act, "transient": self.peak_transient, "buffers": self._buffers()}
        out["total"] = sum(out[k] for k in ("params", "grads", "optimizer", "activations", "transient"))
        return out


# ---- selective checkpointing's cache -------------------------------------------------------------
class _MeteredEntries(dict):
    """One op's SAC cache slots: a stored output is held until the recompute consumes it."""

    def __init__(self, meter):
        super().__init__()
        self.meter = meter
        self.keys = {}

    def __setitem__(self, idx, value):
        old = self.keys.pop(idx, None)
        if old:
            for k in old:
                self.meter._release(k)
        vals = [getattr(w, "val", None) for w in (value if isinstance(value, (tuple, list)) else (value,))]
        held = [self.meter.acquire(v) for v in vals if torch.is_tensor(v) and not self.meter._is_param(v)]
        if held:
            self.keys[idx] = held
        super().__setitem__(idx, value)


class _MeteredStorage(dict):
    def __init__(self, meter):
        super().__init__()
        self.meter = meter

    def __missing__(self, key):
        v = self[key] = _MeteredEntries(self.meter)
        return v


def meter_sac(contexts):
    """Make a (forward, recompute) pair from create_selective_checkpoint_contexts report its cache to
    the active meter (no-op without one)."""
    if ACTIVE is None:
        return contexts
    fwd, rec = contexts
    storage = _MeteredStorage(ACTIVE)
    fwd.storage = storage
    rec.storage = storage
    return contexts
