"""The model arguments search / evaluate / run share: --model (zoo name | pkg.module:factory | HF
config.json) or --hf-config; resolved by sapp/models/resolve.py."""
from __future__ import annotations

from ..errors import SappError, UsageError

MODEL_HELP = ("zoo name (see `sapp models`), pkg.module:factory (a callable returning the module, or "
              "(module, example_inputs, targets, loss_fn)), or a Hugging Face config.json")


def add_model_arguments(p, default_help=""):
    p.add_argument("--model", help=MODEL_HELP + default_help)
    p.add_argument("--hf-config", metavar="CONFIG_JSON",
                   help="Hugging Face config.json: AutoConfig -> AutoModelFor... built on meta (no download)")


def model_spec(args, default=None) -> str:
    """The one model spec the arguments give (checked before any work).  `default` is a spec read from a
    file (a plan's model.name): data, so only a zoo name or an HF config.json is taken from it; a
    pkg.module:factory there would import and call code someone else wrote, which needs the user to
    type it (--model) or say --trust-plan-model."""
    if args.model and args.hf_config:
        raise SappError("give --model or --hf-config, not both")
    spec = args.hf_config or args.model
    if not spec and default:
        spec = str(default)
        from ..models.resolve import kind_of
        if kind_of(spec) == "factory" and not getattr(args, "trust_plan_model", False):
            raise SappError(f"the plan names the model {spec[:120]!r}, code that would be imported and run; pass "
                            f"--model {spec[:120]} if you trust it (or --trust-plan-model), or --model NAME")
    if not spec:
        raise SappError("no model: pass --model NAME|pkg.module:factory or --hf-config config.json")
    if args.hf_config and not args.hf_config.endswith(".json"):
        raise SappError(f"--hf-config {args.hf_config}: expected a config .json file")
    return spec


def add_setting_arguments(p):
    """--seq and --model-arg: settings the model spec is built with (search records them in the plan)."""
    p.add_argument("--seq", type=int, metavar="N",
                   help="sequence length to plan for, e.g. --seq 8192 (default: the zoo model's `s`, an HF config's "
                        "max_position_embeddings / n_positions, or 512 where it has none); the first line says which")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="model setting override, e.g. --model-arg dropout=0 (repeatable): a zoo model's config key, "
                        "an HF config field, or a factory's keyword")


def model_settings(spec: str, pairs, seq=None) -> dict:
    """The settings --model-arg and --seq give `spec`, checked against a zoo model's own config (the key
    one of its settings, the value of the same kind); --seq is the zoo's `s`, an HF config's or a
    factory's `seq`.  Refused in one line: a model with no sequence, a length out of range."""
    out = check_model_args(spec, pairs)
    if seq is None:
        return out
    if not 1 <= seq <= 1 << 24:
        raise UsageError(f"--seq must be from 1 to {1 << 24} tokens, got {seq}")
    from ..models.resolve import kind_of
    if kind_of(spec) == "zoo":
        cfg = _zoo_settings(spec)
        if "s" not in cfg:
            raise UsageError(f"--seq: {spec} takes no sequence (its settings: {', '.join(sorted(cfg))}); drop --seq")
        key = "s"
    else:
        key = "seq"
    if key in out and out[key] != seq:
        raise UsageError(f"--seq {seq} and --model-arg {key}={out[key]} disagree; give one")
    return {**out, key: seq}


def check_model_args(name, pairs) -> dict:
    """--model-arg KEY=VALUE overrides checked against the zoo model's own settings: the key must be
    one of them and the value of the same kind (a number for a number), so no rank builds a model from
    `dropout=abc`.  A factory or HF config takes its own keywords."""
    import json
    import math
    import sapp.models as models           # not `from .. import`: sapp.__getattr__ recurses on it
    out = {}
    for kv in pairs or ():
        if "=" not in kv:
            raise UsageError(f"--model-arg {kv[:80]!r} needs KEY=VALUE, e.g. dropout=0")
        k, _, v = kv.partition("=")
        try:                 # as the worker reads it (emit/runtime/worker.model_overrides), without torch
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    if not out or name not in models.names():
        return out
    config = _zoo_settings(name)
    for k, v in out.items():
        if k not in config:
            raise UsageError(f"--model-arg {k[:64]}: {name} has no setting {k[:64]!r}; it has {', '.join(sorted(config))}")
        default = config[k]
        ok = (isinstance(v, bool) if isinstance(default, bool) else
              isinstance(v, int) and not isinstance(v, bool) if isinstance(default, int) else
              isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) if isinstance(default, float) else
              isinstance(v, list) if isinstance(default, (list, tuple)) else
              isinstance(v, str) if isinstance(default, str) else True)
        if not ok:
            raise UsageError(f"--model-arg {k}={str(v)[:64]!r}: {name}'s {k} is a {type(default).__name__} like {default!r}")
    return out


def _zoo_settings(name) -> dict:
    """A zoo model's settings and their defaults, read from the registry (no torch import: a warm
    search stays pure Python)."""
    from ..models.registry import NAMED
    return dict(NAMED[name][1]) if name in NAMED else {}


def plan_settings(plan, args) -> list:
    """The KEY=VALUE settings a plan's model was searched with (model.args), then the user's own
    --model-arg (which win): the model a plan names is built as it was priced."""
    import json
    saved = (plan["model"].get("args") or {}) if not (args.model or args.hf_config) else {}
    return [f"{k}={json.dumps(v)}" for k, v in sorted(saved.items())] + list(args.model_arg or [])


def seq_source(spec: str, settings: dict, seq=None) -> str:
    """Where the planned sequence length came from, for the first line of a search."""
    if seq is not None:
        return "--seq"
    if "s" in settings or "seq" in settings:
        return "--model-arg"
    from ..models.resolve import kind_of
    kind = kind_of(spec)
    if kind == "zoo":
        return f"{spec}'s setting s"
    if kind == "hf":
        from ..models.hf import CONTEXT_FIELDS
        import json
        try:
            with open(spec, "rb") as f:
                cfg = json.loads(f.read(1 << 22))
        except (OSError, ValueError, RecursionError):    # the search's own read says what is wrong with it
            cfg = {}
        key = next((k for k in CONTEXT_FIELDS if isinstance(cfg, dict) and isinstance(cfg.get(k), int)
                    and cfg[k] > 0), None)
        return f"the config's {key}; --seq N to plan another" if key else "sapp's default for a config without one"
    return "the example inputs"
