"""The `sapp` command line.  Each subcommand lives in sapp/commands/<name>.py with
`add_arguments(parser)` and `run(args) -> int`; this file only dispatches and turns user errors into
one-line messages."""
import argparse
import importlib
import sys

COMMANDS = {
    "search": "find a parallel plan for a model on a cluster",
    "evaluate": "score a (hand-written) plan with the cost model",
    "models": "list the built-in models",
    "clusters": "list the cluster presets",
    "run": "launch an emitted training program for a plan (torchrun)",
    "calibrate": "measure this machine and write a cluster description",
    "explain": "explain why a plan was chosen",
    "diff": "compare two plans",
    "plot": "draw a plan's pipeline schedule and memory",
    "schema": "print the JSON Schema of plan or cluster files",
    "export": "write a plan as Megatron-LM arguments, a torchtitan job (0.3 Python; 0.2.2 TOML) or a DeepSpeed JSON",
    "import": "price a Megatron-LM / torchtitan / DeepSpeed configuration as a plan, beside sapp's best",
    "replan": "re-plan a job for the nodes left (or added): the new layout and its step time",
}


def build_parser():
    from sapp import __version__
    parser = argparse.ArgumentParser(prog="sapp", description="Auto-parallel strategy search for PyTorch.")
    parser.add_argument("--version", action="version", version=f"sapp {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        try:
            mod = importlib.import_module(f"sapp.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"sapp.commands.{name}":
                continue  # command not built yet
            raise
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


# commands that print what a plan file says (names, notes): a plan's text must not drive the terminal
READS_PLANS = ("explain", "diff", "evaluate", "replan")


class _Printable:
    """A text stream that writes control characters other than newline and tab as escapes (\x1b[2J of
    a hostile plan's name shows as text, it does not clear the screen)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        from sapp.units import printable
        return self._stream.write("\n".join(printable(line.replace("\t", "    ")) for line in text.split("\n")))

    def __getattr__(self, name):
        return getattr(self._stream, name)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    streams = sys.stdout, sys.stderr
    if args.command in READS_PLANS:
        sys.stdout, sys.stderr = _Printable(sys.stdout), _Printable(sys.stderr)
    try:
        return _run(args)
    finally:
        sys.stdout, sys.stderr = streams


def _run(args):
    from sapp.errors import SappError
    try:
        return int(args._run(args) or 0)
    except SappError as e:
        print(f"sapp {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"sapp {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and closed early
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
