"""help(sapp.search) shows the explicit signature and a NumPy-style docstring whose example runs
(issue 55 item 8: it showed `**kwargs`)."""
import doctest
import inspect
import pydoc

import sapp
import sapp.api


def test_search_signature_is_explicit():
    params = inspect.signature(sapp.search).parameters
    assert not any(p.kind is p.VAR_KEYWORD for p in params.values())
    # every keyword the API takes is reachable through sapp.search, by name
    assert set(inspect.signature(sapp.api.search).parameters) == set(params)


def test_search_docstring_example_runs():
    doc = sapp.search.__doc__
    for section in ("Parameters\n", "Returns\n", "Raises\n", "Examples\n"):
        assert section in doc
    test = doctest.DocTestParser().get_doctest(doc, {}, "sapp.search", "sapp/__init__.py", 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    assert runner.failures == 0 and runner.tries >= 3


def test_help_after_the_subpackage_is_imported():
    import sapp.search.joint  # noqa: F401  (rebinds sapp.search to the callable package)
    assert "**kwargs" not in str(inspect.signature(sapp.search))
    assert "global_batch : int, optional" in pydoc.render_doc(sapp.search, renderer=pydoc.plaintext)
