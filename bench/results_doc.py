"""bench/RESULTS.md's generated sections: the markers around each and their replacement in place
(bench/results.py regenerates them all; a section's own command may write its one)."""
from __future__ import annotations

import os

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")


def markers(name):
    return (f"<!-- generated: {name} (python -m bench.results --only {name}) -->", f"<!-- end generated: {name} -->")


def replace(doc: str, name: str, body: str) -> str:
    """`doc` with section `name`'s generated body replaced by `body` (the markers must be there)."""
    start, end = markers(name)
    i, j = doc.find(start), doc.find(end)
    if i < 0 or j < i:
        raise ValueError(f"bench/RESULTS.md has no generated section {name!r}: add the markers {start} ... {end}")
    return doc[:i + len(start)] + "\n" + body.strip("\n") + "\n" + doc[j:]


def write(name: str, body: str, path: str = RESULTS) -> None:
    with open(path) as f:
        doc = f.read()
    doc = replace(doc, name, body)
    with open(path, "w") as f:
        f.write(doc)
