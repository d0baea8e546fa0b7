"""A training program's state as one flat dict of tensors keyed by the ORIGINAL model's parameter names,
so that a checkpoint written under one plan loads under any other: torch.distributed.checkpoint (DCP)
matches entries by key and reshards what differs (plain tensor <-> FSDP2 / tensor-parallel DTensor
shards), and a pipeline stage's parameters keep the un-split model's names (sapp/emit/pp/pipe.py).

    model.<name>            parameters and persistent buffers
    optim.<name>.<key>      optimizer state of that parameter: Adam / AdamW / SparseAdam: step,
                            exp_avg, exp_avg_sq; SparseFtrl: z, n.  `step` is always a float64 scalar
                            tensor on disk (SparseAdam keeps an int, Adam a float tensor), so a host
                            table's SparseAdam state loads into a device Adam and back
    rng.cpu.<rank>          this rank's torch RNG state (and rng.cuda.<rank>); restored when the
                            checkpoint has an entry for this rank

Tied parameters (one tensor under several names) are written under every name they have in the
original model, so a plan that holds only one of the copies (a pipeline stage) finds its own.
ZeroRedundancyOptimizer ranks write the state of the parameters they own; OffloadAdam's state sits on
its fp32 host masters and is written under the device parameter's name."""
from __future__ import annotations

import torch
from torch import nn

from ...errors import SappError


class CheckpointError(SappError, RuntimeError):
    """A checkpoint cannot be written or does not fit this training run.  `every_rank`: every rank
    raised the same error, so one of them (rank 0) says it for the job."""

    def __init__(self, msg: str, every_rank: bool = False):
        super().__init__(msg)
        self.every_rank = every_rank


class Names:
    """What the ORIGINAL model calls its state: `keys`, its state_dict keys (parameters and persistent
    buffers: a traced pipeline stage also lists constants such as attention masks, which are not
    state), and `aliases`, {name: all names of the same tensor} for tied parameters."""

    def __init__(self, keys=None, aliases=None, shapes=None):
        self.keys, self.aliases = keys, aliases or {}
        self.shapes = shapes or {}      # {key: [shape list, dtype name]}: the model's identity in a marker

    def saved(self, k: str) -> bool:
        return self.keys is None or k in self.keys

    def of(self, k: str) -> tuple:
        return self.aliases.get(k, (k,))


def model_names(model: nn.Module) -> Names:
    """Names of `model` before emit (call it on the model you pass to emit)."""
    by_obj = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_obj.setdefault(id(p), []).append(name)
    aliases = {n: tuple(sorted(ns)) for ns in by_obj.values() if len(ns) > 1 for n in ns}
    state = model.state_dict()
    shapes = {k: [list(v.shape), str(v.dtype).replace("torch.", "")] for k, v in state.items()}
    return Names(set(state.keys()), aliases, shapes)


def _unwrap(m):
    inner = getattr(m, "module", None)       # DDP
    return inner if isinstance(inner, nn.Module) else m


def _names(prog, names: Names) -> dict:
    """id(parameter) -> every name it is saved under."""
    out = {}
    for mod in prog.modules:
        for n, p in _unwrap(mod).named_parameters(remove_duplicate=False):
            names_ = out.setdefault(id(p), [])
            for a in names.of(n):
                if a not in names_:
                    names_.append(a)
    return out


def _optimizer_pairs(opt):
    """[(the optimizer holding the state, state parameter, named parameter)]."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from ..host.host import OffloadAdam
    if isinstance(opt, ZeroRedundancyOptimizer):      # this rank's partition only
        return [(opt.optim, p, p) for g in opt.optim.param_groups for p in g["params"]]
    if isinstance(opt, OffloadAdam):    # dense masters in .inner, sparse tables' in .inner_sparse
        return [(inner, m, p) for m, p in zip(opt.masters, opt.device_params) for inner in opt._inners()
                if any(q is m for g in inner.param_groups for q in g["params"])]
    return [(opt, p, p) for g in opt.param_groups for p in g["params"]]


def _group_of(opt, p):
    for g in opt.param_groups:
        if any(q is p for q in g["params"]):
            return g
    raise KeyError("parameter not in optimizer")


def _fresh_state(opt, p) -> dict:
    """The state `opt` would create for `p` at its first step (zeros), to load a checkpoint into."""
    from torch.optim.optimizer import _get_scalar_dtype
    from ..host.host import SparseFtrl
    g = _group_of(opt, p)
    if isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)):
        fused = bool(g.get("fused")) or bool(g.get("capturable"))
        st = {"step": (torch.zeros((), dtype=_get_scalar_dtype(is_fused=g.get("fused")), device=p.device) if fused
                       else torch.tensor(0.0, dtype=_get_scalar_dtype())),
              "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
              "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
        if g.get("amsgrad"):
            st["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return st
    if isinstance(opt, torch.optim.SparseAdam):
        return {"step": 0, "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
    if isinstance(opt, SparseFtrl):
        return {"z": torch.zeros_like(p), "n": torch.full_like(p, g["initial_accumulator"])}
    if isinstance(opt, torch.optim.SGD):
        if g.get("momentum"):
            return {"momentum_buffer": torch.zeros_like(p)}
        return {}
    raise CheckpointError(f"cannot checkpoint optimizer {type(opt).__name__}; use adam, adamw, sgd or the "
                          "placement's sparse_adam / ftrl")


def _disk(key, v):
    """A state value as written: `step` as a float64 scalar whatever the optimizer keeps."""
    if key == "step":
        return torch.tensor(float(v), dtype=torch.float64)
    return v.detach() if torch.is_tensor(v) else torch.tensor(v)


def _rng_entries(rank: int, device) -> dict:
    out = {f"rng.cpu.{rank}": torch.get_rng_state()}
    if device is not None and torch.device(device).type == "cuda":
        out[f"rng.cuda.{rank}"] = torch.cuda.get_rng_state(device)
    return out


def _model_state(prog, names: Names):
    for mod in prog.modules:
        for k, v in _unwrap(mod).state_dict(keep_vars=True).items():
            if names.saved(k):
                yield k, v.detach()


def save_entries(prog, names: Names) -> dict:
    """This rank's state, ready for dcp.save."""
    out = {}
    for k, v in _model_state(prog, names):
        for a in names.of(k):
            out[f"model.{a}"] = v
    names_of = _names(prog, names)
    for opt in prog.optimizers:
        if getattr(opt, "zero_stage", None) == 1:     # sapp/emit/dp/zero1.py: gathered per parameter
            for i, p in enumerate(opt.params):
                for key, v in opt.full_state(i).items():
                    for n in names_of[id(p)]:
                        out[f"optim.{n}.{key}"] = v
            continue
        for inner, sp, np_ in _optimizer_pairs(opt):
            for key, v in inner.state.get(sp, {}).items():
                if v is None:
                    continue
                for n in names_of[id(np_)]:
                    out[f"optim.{n}.{key}"] = _disk(key, v)
    out.update(_rng_entries(prog.rank, prog.device))
    return out


class LoadTargets:
    """The dict dcp.load fills (live parameters in place, fresh optimizer state, RNG), and `finish()`
    that puts the loaded optimizer state and RNG back where the program keeps them."""

    def __init__(self, prog, names: Names, available: set, partial: bool = False):
        """`partial`: entries this model has and `available` lacks keep their initial values."""
        self.prog, self.entries, self._optim, self._rng = prog, {}, [], {}
        for k, v in _model_state(prog, names):
            if f"model.{k}" not in available and partial:
                continue
            if f"model.{k}" not in available:
                raise CheckpointError(f"the checkpoint has no entry for {k}: it was written for another model; "
                                      "resume with the model (and --model-arg settings) it was trained with")
            self.entries[f"model.{k}"] = v
        names_of = _names(prog, names)
        self._zero1 = []
        for opt in prog.optimizers:
            if getattr(opt, "zero_stage", None) == 1:
                self._zero1_targets(opt, names_of, available)
                continue
            for inner, sp, np_ in _optimizer_pairs(opt):
                fresh = _fresh_state(inner, sp)
                name = next((n for n in names_of[id(np_)] if any(f"optim.{n}.{k}" in available for k in fresh)), None)
                if name is None:     # never stepped when the checkpoint was written: stays fresh
                    continue
                missing = [k for k in fresh if f"optim.{name}.{k}" not in available]
                if missing:
                    have = sorted(a.rsplit(".", 1)[1] for a in available if a.startswith(f"optim.{name}."))
                    raise CheckpointError(f"the checkpoint holds {', '.join(have)} optimizer state for {name} but "
                                          f"{type(inner).__name__} needs {', '.join(sorted(fresh))}; resume with the "
                                          "optimizer it was trained with")
                for k, v in fresh.items():
                    self.entries[f"optim.{name}.{k}"] = _disk(k, v) if k == "step" else v
                self._optim.append((inner, sp, name, fresh))
        for k, v in _rng_entries(prog.rank, prog.device).items():
            if k in available:
                self.entries[k] = v.clone()
                self._rng[k] = self.entries[k]

    def _zero1_targets(self, opt, names_of, available):
        """Whole per-parameter state to load, sliced into the ZeRO-1 shards by finish()."""
        keys = opt.state_keys()
        for i, p in enumerate(opt.params):
            name = next((n for n in names_of[id(p)] if all(f"optim.{n}.{k}" in available for k in keys)), None)
            if name is None or not keys:
                continue
            st = {k: (torch.tensor(0.0, dtype=torch.float64) if k == "step" else torch.zeros_like(p.detach()))
                  for k in keys}
            for k, v in st.items():
                self.entries[f"optim.{name}.{k}"] = v
            self._zero1.append((opt, i, name, keys))

    def finish(self) -> None:
        for opt, i, name, keys in self._zero1:
            opt.load_full_state(i, {k: self.entries[f"optim.{name}.{k}"] for k in keys})
        for inner, sp, name, fresh in self._optim:
            st = {}
            for k, v in fresh.items():
                loaded = self.entries[f"optim.{name}.{k}"]
                if k == "step":
                    st[k] = int(loaded) if isinstance(v, int) else torch.full_like(v, float(loaded))
                else:
                    st[k] = v
            inner.state[sp] = st
        from ..host.host import OffloadAdam
        for opt in self.prog.optimizers:     # the host masters are the fp32 parameters just loaded
            if isinstance(opt, OffloadAdam):
                with torch.no_grad():
                    for m, p in zip(opt.masters, opt.device_params):
                        m.copy_(p.detach().to("cpu", m.dtype))
        r = self.prog.rank
        if f"rng.cpu.{r}" in self._rng:
            torch.set_rng_state(self._rng[f"rng.cpu.{r}"])
        if f"rng.cuda.{r}" in self._rng:
            torch.cuda.set_rng_state(self._rng[f"rng.cuda.{r}"], self.prog.device)
