"""docs/cli.md, written from the argparse parser the `sapp` command itself runs, so the reference and
`--help` cannot disagree.  Regenerate it after changing a flag:

    python -m sapp.commands.cli_reference > docs/cli.md

Every subcommand of `sapp.commands.cli.build_parser()` in its order: the description, the usage line and each
option group as a table (flag and metavar, its help with %(default)s expanded, the choices a
metavar hides).  The
text is laid out at a fixed width, so the output does not depend on the terminal it is run in."""
from __future__ import annotations

import argparse
import sys

WIDTH = 100


def _formatter(parser):
    return argparse.HelpFormatter(parser.prog, width=WIDTH, max_help_position=40)


def _usage(parser) -> str:
    fmt = _formatter(parser)
    fmt.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return fmt.format_help().strip()


def _flag(action) -> str:
    fmt = argparse.HelpFormatter("sapp")
    if not action.option_strings:
        return f"`{fmt._metavar_formatter(action, action.dest)(1)[0]}`"
    if action.nargs == 0:
        return ", ".join(f"`{s}`" for s in action.option_strings)
    args = fmt._format_args(action, action.dest.upper())
    return ", ".join(f"`{s} {args}`" for s in action.option_strings)


def _help(parser, action) -> str:
    text = _formatter(parser)._expand_help(action) if action.help else ""
    text = " ".join(text.split()).replace("|", "\\|")
    if action.choices and action.metavar is not None:     # a metavar hides the choices: name them
        choices = ", ".join(f"`{c}`" for c in action.choices)
        text = f"{text} (choices: {choices})" if text else f"choices: {choices}"
    return text


def _groups(parser):
    for group in parser._action_groups:
        actions = [a for a in group._group_actions
                   if a.help is not argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]
        if actions:
            yield group.title, actions


def _subcommands(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def reference(parser=None) -> str:
    """The Markdown reference of every `sapp` subcommand (the text of docs/cli.md)."""
    if parser is None:
        from sapp.commands.cli import build_parser
        parser = build_parser()
    subs = _subcommands(parser)
    out = ["# sapp command reference", "",
           "Generated from the argparse parser of `sapp` by `python -m sapp.commands.cli_reference > docs/cli.md`;",
           "the suite fails when this file and `--help` disagree.  Every command also takes `-h, --help`.", "",
           " ".join(f"[{name}](#sapp-{name})" for name, _ in subs), ""]
    for name, sub in subs:
        out += [f"## sapp {name}", "", sub.description or "", "", "```", _usage(sub), "```", ""]
        for title, actions in _groups(sub):
            out += [f"**{title}**", "", "| argument | meaning |", "|---|---|"]
            out += [f"| {_flag(a)} | {_help(sub, a)} |" for a in actions]
            out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def main() -> int:
    sys.stdout.write(reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
