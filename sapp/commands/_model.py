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
    """The one model spec the arguments give (checked before any work)."""
    if args.model and args.hf_config:
        raise SappError("give --model or --hf-config, not both")
    spec = args.hf_config or args.model or default
    if not spec:
        raise SappError("no model: pass --model NAME|pkg.module:factory or --hf-config config.json")
    if args.hf_config and not args.hf_config.endswith(".json"):
        raise SappError(f"--hf-config {args.hf_config}: expected a config .json file")
    return spec
