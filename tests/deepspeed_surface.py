"""The configuration surface of the installed DeepSpeed, read off its own config code: every key path
(("zero_optimization", "stage"), ("bf16", "enabled"), ...) that `DeepSpeedConfig` reads, found by
running it.  Top-level keys and plain-dict sections are found by handing DeepSpeedConfig a dict that
records every key it asks for; a section DeepSpeed validates with a pydantic model (extra keys
forbidden) is found from the ValidationError DeepSpeedConfig raises for a probe key in it, and walked
through the model's own fields (name and alias, nested models included).  Keys DeepSpeed rejects as
removed (`_REMOVED_*_CONFIG_KEYS`) come back as such.  Used by tests/test_engines_fields.py."""
import logging
import os

PROBE = "__sapp_probe__"
BASE = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1}


class _Keys:
    def __init__(self, d):
        self.d = d

    def __contains__(self, k):
        self.d.seen.add(k)
        return dict.__contains__(self.d, k)

    def __iter__(self):
        return dict.__iter__(self.d)

    def __len__(self):
        return dict.__len__(self.d)


class Recorder(dict):
    """A dict that remembers every key read from it (get, [], in, keys()); copy.copy keeps it."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.seen = set()

    def get(self, k, d=None):
        self.seen.add(k)
        return dict.get(self, k, d)

    def __getitem__(self, k):
        self.seen.add(k)
        return dict.__getitem__(self, k)

    def __contains__(self, k):
        self.seen.add(k)
        return dict.__contains__(self, k)

    def keys(self):
        return _Keys(self)

    def __copy__(self):
        return self


def _config_module():
    os.environ.setdefault("DS_BUILD_OPS", "0")
    logging.disable(logging.WARNING)
    from deepspeed.runtime import config
    return config


def parse(d: dict):
    """DeepSpeedConfig(d) on 8 data-parallel ranks, without a process group (rank 0, world 8 answered
    for that call; no mpu, so the no-mpu path that reads sequence_parallel_size runs too)."""
    C = _config_module()
    real = C.dist.get_rank, C.dist.get_world_size
    C.dist.get_rank, C.dist.get_world_size = (lambda *a, **k: 0), (lambda *a, **k: 8)
    try:
        return C.DeepSpeedConfig(d)
    finally:
        C.dist.get_rank, C.dist.get_world_size = real


def _nest(path, value):
    d = value
    for k in reversed(path):
        d = Recorder({k: d})
    return d


def _models():
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel
    out, todo = {}, [DeepSpeedConfigModel]
    while todo:
        c = todo.pop()
        for s in c.__subclasses__():
            out.setdefault(s.__name__, s)
            todo.append(s)
    return out


def _model_of(annotation):
    from pydantic import BaseModel
    import typing
    for a in (annotation, *typing.get_args(annotation)):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def _walk_model(model, path, out):
    for name, f in model.model_fields.items():
        sub = _model_of(f.annotation)
        for key in {name, f.alias} - {None}:
            if sub is not None:
                _walk_model(sub, path + (key,), out)
            else:
                out[path + (key,)] = ("field", f)


def surface() -> dict:
    """{key path: ("key", None) | ("field", pydantic FieldInfo) | ("removed", DeepSpeed's message)}."""
    import pydantic
    C = _config_module()
    removed = dict(C._REMOVED_TOP_LEVEL_CONFIG_KEYS)
    removed.update({("zero_optimization", k): v for k, v in C._REMOVED_ZERO_CONFIG_KEYS.items()})
    out = {(k,): ("removed", v) for k, v in C._REMOVED_TOP_LEVEL_CONFIG_KEYS.items()}
    out.update({("zero_optimization", k): ("removed", v) for k, v in C._REMOVED_ZERO_CONFIG_KEYS.items()})
    models = _models()
    top = Recorder(BASE)
    parse(top)
    seen = set(top.seen)
    for k in list(seen - set(BASE)):
        # a key read only beside another's value (`zero_optimization: true` reads allgather_size)
        again = Recorder({**BASE, k: True})
        try:
            parse(again)
        except Exception:   # noqa: BLE001 - True where DeepSpeed wants something else
            pass
        seen |= again.seen
    todo = [(k,) for k in seen]
    while todo:
        path = todo.pop()
        if path in out or path in removed:
            continue
        probe = Recorder({PROBE: 0})
        try:
            parse({**BASE, **_nest(path, probe)}) if len(path) > 1 else parse(Recorder({**BASE, path[0]: probe}))
        except pydantic.ValidationError as e:
            loc = next((x["loc"] for x in e.errors() if x["type"] == "extra_forbidden"), None)
            if loc is not None and e.title in models:
                # the model DeepSpeed validates this section with; loc is the probe's place inside it
                model = models[e.title]
                for k in loc[:-1]:
                    model = _model_of(model.model_fields[k].annotation)
                _walk_model(model, path, out)
                continue
        except Exception:   # noqa: BLE001 - a dict where DeepSpeed wants a value: a leaf
            pass
        seen = probe.seen - {PROBE}
        if seen:
            # a key read only when another is given (optimizer.params beside optimizer.type)
            again = Recorder({k: "x" for k in seen})
            try:
                parse({**BASE, **_nest(path, again)}) if len(path) > 1 else parse(Recorder({**BASE, path[0]: again}))
            except Exception:   # noqa: BLE001
                pass
            seen |= again.seen
        if not seen:
            out[path] = ("key", None)
        todo += [path + (k,) for k in seen]
    return out
