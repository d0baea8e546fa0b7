"""The catalogues' failure classes (bench/hf_catalogue.py, bench/lib_catalogue.py): every failed row
carries one named class, the first pattern that matches "phase: Type: message", else a class made of
its phase and innermost exception type, so --report counts failures by cause rather than by text."""
from __future__ import annotations

import re

# ---- failure classes ------------------------------------------------------------------------------
# (class, pattern over "phase: Type: message"): the first match names the failure; anything else is
# classed by its phase and exception type
CLASSES = (
    ("timeout", r"timed out"),
    ("input not synthesised", r"is not synthesised"),
    ("needs a package", r"requires the .* librar|No module named|pip install"),
    ("tiny config does not run (eager forward fails)", r"^build: eager forward fails"),
    ("view absorbs a sharded dim (shape invalid)", r"^(emit|step|rank|compare): .*shape '\[.*\]' is invalid"),
    ("losses differ silently", r"losses differ"),
    ("replicated parameter drifts between ranks silently", r"differs between ranks .* with no error"),
    ("operand shapes disagree in a step (a sharded dim)", r"^step: .*(size of tensor a .* must match|shapes cannot be"
                                                          r" multiplied|Expected size|dimension mismatch)"),
    ("frozen params counted differently", r"^(emit|step|rank): .*(trainable|frozen)"),
    ("DTensor view modified in place", r"^(emit|step|rank): .*_ToTorchTensor is a view and is being modified inplace"),
    ("pipeline stage call (positional args)", r"^(emit|step|rank): .*positional argument"),
    ("data-dependent control flow", r"[Dd]ata.dependent|GuardOnDataDependent|symbolic|Could not guard"),
    ("tp2 shards nothing", r"^tp2: shards nothing"),
    ("unknown ops", r"^unknown:"),
    ("batch statistics over a split batch (refused)", r"normalises by batch statistics"),
    ("expert parallelism on a MoE layer the emitter does not run (refused)", r"has ep=\d+ but the model has no MoE"),
    ("shape audit: the model cannot run at a rank's shapes (refused)", r"cannot run at one rank's shapes"),
    ("shape audit: an op's shape differs from the plan's (refused)", r"where the plan implies"),
    ("shape audit: the code branches on a size the split changes (refused)", r"runs other ops than captured"),
    ("tp: a split weight read outside its layer (refused)", r"tensor parallelism tp=\d+: \S+ '[^']*' reads "),
    ("sp: an entry holds a stack of blocks (refused)", r"holds a stack of blocks"),
    ("sp audit: the model fails at a rank's sequence shard (refused)", r"at one rank's sequence shard"),
    ("DTensor registers a dotted parameter name", r"parameter name can.{1,2}t contain"),
    ("refused before the first step", r"^emit: .*(Error|Refused)"),
)


def failure(r) -> str:
    """The named class(es) of a failed row: a cheap row lists one per part ("unknown: ...; tp2: ...")."""
    if r["phase"] != "cheap":
        return classify(r["phase"], r["reason"])
    parts = re.split(r"; (?=(?:unknown|search|tp2): )", r["reason"])     # a part's own text may hold "; "
    return "; ".join(classify(*part.partition(": ")[::2]) for part in parts)


def classify(phase: str, reason: str) -> str:
    text = f"{phase}: {reason}"
    if phase == "build" and not re.search(CLASSES[1][1] + "|" + CLASSES[2][1] + "|" + CLASSES[3][1], text):
        phase = "tiny config does not build"
    for name, pat in CLASSES:
        if re.search(pat, text):
            return name
    causes = re.findall(r"(\w+(?:Error|Exception)): ([^:]*)", reason or "")
    if not causes:
        return f"{phase}: failed"
    kind, msg = causes[-1]                 # the innermost cause, its first words without numbers
    msg = msg.split(";")[0]                # (not sapp's hint after it)
    words = re.sub(r"\d+", "N", re.sub(r"'[^']*'|\[[^\]]*\]", "_", msg)).split()[:6]
    return f"{phase}: {kind}: {' '.join(words)}"
