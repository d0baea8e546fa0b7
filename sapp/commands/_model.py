"""The model arguments search / evaluate / run share: --model (zoo name | pkg.module:factory | HF
config.json) or --hf-config; resolved by sapp/models/resolve.py."""
from __future__ import annotations

from ..errors import SappError

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
