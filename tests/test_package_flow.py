"""Data flows one way (docs/ARCHITECTURE.md, issue 56 item 2): every sapp module sits in one layer of
LAYERS below, and no import -- at module level or inside a function, relative, or importlib.import_module
on a string literal -- reaches a higher layer.  A lower layer that needs a higher one takes a callable
from its caller (the emitter's re-pricing, the elastic re-plan).

Imports inside functions count because they are how the loops hid: a lazy import dodges a circle at
load time, but the design still has each side needing the other.  tests/test_import_graph.py checks
circles between modules; this checks direction between layers, which catches a loop that passes
through several modules of each package and never closes on one module.

ALLOWED lists the edges against the flow that are still there, each with why it has not been removed
and the fix it needs.  The test fails on a new one (printed as file:line) and on an entry that no longer
occurs (remove it), so the list can only get shorter."""
import ast
import os

from tests.test_import_graph import ROOT, _known, import_targets, modules

# (layer, the modules in it), lowest first.  An entry names a module or a package (the package and
# everything under it); the longest entry that covers a module decides.  "sapp" itself is the package
# __init__ only (the facade), never a prefix.  Modules of one layer may import each other freely
# (test_import_graph keeps them free of circles).
LAYERS = [
    # what every layer reads: errors, quantities, files, the graph type, the model zoo, the cluster, its
    # figures and how far to trust them, the published schemas, the user's pins
    ("base", ["sapp.errors", "sapp.units", "sapp.fileio", "sapp.version", "sapp.capture.ir", "sapp.schema",
              "sapp.models", "sapp.cluster", "sapp.search.constraints", "sapp.search.targets"]),
    ("capture", ["sapp.capture"]),
    ("costmodel", ["sapp.costmodel"]),
    # the sharding search of one stage's mesh, and the tp / sp layouts it derives: the pipeline's stage
    # profiles run it once per tp degree on a block template, so it sits below them
    ("sharding search", ["sapp.search"]),
    # what the joint search prices a configuration with: stage profiles, partitions and schedules,
    # recomputation, host placement
    ("stage pieces", ["sapp.pipeline", "sapp.recompute", "sapp.placement"]),
    # the outer search over configurations (and over a mixed cluster's groups), built on the stage pieces.
    # It lives in sapp/search/ beside the sharding search though it sits two layers above it
    ("joint search", ["sapp.search.joint", "sapp.search.hetero", "sapp.search.hetero_pipeline"]),
    ("plan", ["sapp.plan"]),
    # explain, diff, plot, progress: read plans and the schedule simulator, run nothing (the runtime's
    # training log prints through report.progress, so report sits below emit)
    ("report", ["sapp.report"]),
    # the emitter, and beside it the runnability check the search's candidates go through (the emitter's
    # own manifest, built on meta)
    ("emit", ["sapp.emit"]),
    # calibration measures a machine with the runtime's process groups; its output, a Cluster, is the
    # search's input, so it takes nothing from the search
    ("emit's users", ["sapp.calibrate"]),
    ("api", ["sapp.api"]),
    # what drives sapp.search / sapp.evaluate: re-planning and mixed clusters (in sapp/api/, beside the
    # search they drive), engine files in and out
    ("drivers", ["sapp.api.replan", "sapp.api.replan_price", "sapp.api.replan_split", "sapp.api.mixed",
                 "sapp.api.mixed_pipe", "sapp.engines"]),
    ("commands", ["sapp.commands", "sapp"]),
]

# (importer, imported): why it is still there; the fix it needs.  Keyed by module, not line, so an
# edit above an import does not invalidate the entry.
ALLOWED = {}


def layer_of(module: str) -> int:
    """Index into LAYERS of the longest entry covering `module`; KeyError when none does."""
    best, rank = "", None
    for i, (_, entries) in enumerate(LAYERS):
        for e in entries:
            covers = module == e or (e != "sapp" and module.startswith(e + "."))
            if covers and len(e) > len(best):
                best, rank = e, i
    if rank is None:
        raise KeyError(module)
    return rank


def _import_module_target(node):
    """The module an importlib.import_module(...) call names: a string literal, or an f-string's constant
    head up to its last dot (f"sapp.commands.{name}" names sapp.commands); None otherwise."""
    func = node.func
    if (getattr(func, "attr", None) or getattr(func, "id", None)) != "import_module" or not node.args:
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        head = arg.values[0].value
        return head.rsplit(".", 1)[0] if "." in head else None
    return None


def imports(mods: dict) -> list:
    """(importer, imported, path, line) for every import of one scanned module by another, at any depth
    of the source: import statements (as tests/test_import_graph.py resolves them) and import_module
    calls on literal names."""
    out = []
    for name, (path, pkg) in sorted(mods.items()):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        for node in ast.walk(tree):
            targets = import_targets(node, name, pkg, mods)
            if isinstance(node, ast.Call):
                t = _import_module_target(node)
                targets = [t] if t else []
            for t in targets:
                t = _known(t, mods)
                if t is not None and t != name:
                    out.append((name, t, path, node.lineno))
    return out


def against_flow(mods: dict, layer=layer_of) -> list:
    """The imports of `imports(mods)` that reach a higher layer than the importer's."""
    return [row for row in imports(mods) if layer(row[1]) > layer(row[0])]


def _line(row) -> str:
    src, dst, path, line = row
    return (f"{os.path.relpath(path, ROOT)}:{line}  {src} [{LAYERS[layer_of(src)][0]}] -> "
            f"{dst} [{LAYERS[layer_of(dst)][0]}]")


def test_every_module_has_a_layer():
    missing = [m for m in modules(ROOT, "sapp") if _safe_layer(m) is None]
    assert not missing, f"modules no entry of LAYERS covers (place each in its layer): {', '.join(missing)}"


def _safe_layer(m):
    try:
        return layer_of(m)
    except KeyError:
        return None


def test_data_flows_one_way():
    rows = against_flow(modules(ROOT, "sapp"))
    new = [r for r in rows if (r[0], r[1]) not in ALLOWED]
    assert not new, (f"{len(new)} import(s) against the flow (a lower layer takes a callable from its caller "
                     f"instead):\n" + "\n".join(_line(r) for r in new))
    stale = sorted(set(ALLOWED) - {(r[0], r[1]) for r in rows})
    assert not stale, f"allowed edges that no longer occur (remove them from ALLOWED): {stale}"


def test_the_reader_finds_planted_edges(tmp_path):
    """Each way an import can reach upward is seen: a lazy import in a function, `from . import x`,
    and importlib.import_module on a literal and on an f-string's head."""
    pkg = tmp_path / "toy"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "high.py").write_text("from .low import a\n")                                 # downward: fine
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "a.py").write_text("def f():\n    from .. import high\n")              # lazy, upward
    (pkg / "low" / "b.py").write_text("import importlib\nM = importlib.import_module('toy.high')\n")
    (pkg / "low" / "c.py").write_text("import importlib\n\ndef g(n):\n    return importlib.import_module(f'toy.high.{n}')\n")
    mods = modules(str(tmp_path), "toy")
    found = sorted((s, d, line) for s, d, _, line in against_flow(mods, lambda m: 1 if m == "toy.high" else 0))
    assert found == [("toy.low.a", "toy.high", 2), ("toy.low.b", "toy.high", 2), ("toy.low.c", "toy.high", 4)]


def test_the_top_of_sapp_holds_at_most_six_modules():
    """The folders show the flow (issue 56 item 3): what is not the facade or a base module every layer
    reads lives in the package of its layer (sapp/cluster/, sapp/plan/, sapp/api/, ...)."""
    top = sorted(f for f in os.listdir(os.path.join(ROOT, "sapp")) if f.endswith(".py"))
    assert len(top) <= 6, f"{len(top)} modules at the top of sapp/ (at most 6): {', '.join(top)}"
