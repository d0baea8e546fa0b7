"""The CLI's engine choices (`--target`, `--to`, `--from`), read off the engine table
(sapp/search/targets.py) when a parser is built, so an engine added to the table is offered."""
from __future__ import annotations

from sapp.search.targets import ENGINES


def engine_names() -> tuple:
    return tuple(ENGINES)


def engine_help(lead: str) -> str:
    """`lead` and each engine: its name, what it is and the file sapp reads and writes for it."""
    return lead + ", ".join(f"{e.name} ({e.title} {e.versions}, .{e.suffix})" for e in ENGINES.values())
