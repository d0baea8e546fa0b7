"""The public API's examples run (issue 56 item 5): each function of sapp's facade (`sapp.search`,
`evaluate`, `capture`, `emit`) and the `Plan` and `Cluster` types keep a NumPy-style docstring whose
example runs here as a doctest, together with every other example in the package entries
(sapp/__init__.py, sapp/plan, sapp/cluster, sapp/api).  The examples use the zoo's gpt-tiny on the
`cpu` preset and print no figure the cost model may move (a step time only as `> 0`)."""
import doctest
import importlib
import inspect

import pytest

import sapp

# the package entries whose docstrings' examples the suite runs
MODULES = ("sapp", "sapp.plan", "sapp.cluster", "sapp.api")
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _tests():
    """Every docstring example of MODULES, once each (sapp.__test__ holds the facade's functions
    whatever their names are rebound to; a function also found under its own name counts once)."""
    finder, seen, out = doctest.DocTestFinder(exclude_empty=True), set(), []
    for name in MODULES:
        for t in finder.find(importlib.import_module(name), name):
            key = (t.filename, t.lineno, t.docstring)
            if t.examples and key not in seen:
                seen.add(key)
                out.append(t)
    return sorted(out, key=lambda t: t.name)


TESTS = _tests()


@pytest.mark.parametrize("test", TESTS, ids=[t.name for t in TESTS])
def test_docstring_example_runs(test):
    runner, report = doctest.DocTestRunner(optionflags=FLAGS), []
    runner.run(test, out=report.append)
    assert runner.failures == 0, f"{test.name}: {runner.failures} of {runner.tries} examples failed:\n{''.join(report)}"


PUBLIC = {"sapp.search": sapp.__test__["search"], "sapp.evaluate": sapp.__test__["evaluate"],
          "sapp.capture": sapp.__test__["capture"], "sapp.emit": sapp.__test__["emit"],
          "sapp.Plan": sapp.Plan, "sapp.Plan.load": sapp.Plan.load,
          "sapp.Cluster": sapp.Cluster, "sapp.Cluster.parse": sapp.Cluster.parse}


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_api_has_a_numpy_docstring_with_an_example(name):
    obj = PUBLIC[name]
    doc = inspect.getdoc(obj) or ""
    sections = ("Examples\n--------",) if inspect.isclass(obj) else (
        "Parameters\n----------", "Returns\n-------", "Examples\n--------")
    missing = [s.split("\n")[0] for s in sections if s not in doc]
    assert not missing, f"{name}'s docstring lacks {', '.join(missing)}"
    assert any(inspect.cleandoc(t.docstring) == doc for t in TESTS), \
        f"{name}'s example is not among the doctests the suite runs"


def test_facade_signatures_name_every_keyword():
    """help(sapp.evaluate) and help(sapp.capture) show the keywords the functions behind them take."""
    from sapp.api import evaluate
    from sapp.capture import capture
    for facade, inner in ((sapp.__test__["evaluate"], evaluate), (sapp.__test__["capture"], capture)):
        params = inspect.signature(facade).parameters
        assert not any(p.kind is p.VAR_KEYWORD for p in params.values())
        assert list(params) == list(inspect.signature(inner).parameters)
