"""Every function of the package face (``spectral_hooks.__all__``) has a short runnable example
in its docstring (issue #25: the API reference shows them), and every example of the face's
docstrings runs (classes: where they have one; ``Probe`` and ``Recording`` are shown by
``instrument``, their files are at their size limits): doctest on tiny models built from
configs, offline."""

import doctest
import inspect
import sys

import pytest

import spectral_hooks as sh

FACE = [n for n in sh.__all__ if n not in ("__version__", "linalg")]


@pytest.fixture(autouse=True)
def _registry(registry_restored):
    """Examples such as register_anatomy's register families (conftest undoes that)."""


@pytest.mark.parametrize("name", FACE)
def test_face_docstring_example_runs(name):
    obj = getattr(sh, name)
    doc = inspect.getdoc(obj) or ""
    if inspect.isfunction(obj):
        assert ">>>" in doc, f"spectral_hooks.{name}: no example in its docstring"
    elif ">>>" not in doc:
        pytest.skip(f"class {name}: no example of its own")
    module = sys.modules[obj.__module__]
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(obj, name, module=module, globs=dict(vars(module))):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"spectral_hooks.{name}: {result}"
