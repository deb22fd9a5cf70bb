"""The docstring examples of the power pipeline's modules run (no ``doctest: +SKIP`` there),
and every public function and class of them is documented (issue 36, items 4 and 9)."""

import doctest
import importlib
import inspect

import pytest

MODULES = [
    "spectral_hooks.anatomy.weights", "spectral_hooks.metrics.spectrum",
    "spectral_hooks.metrics.power", "spectral_hooks.metrics.steering_math",
    "spectral_hooks.metrics.shared_weights", "spectral_hooks.analysis.power",
    "spectral_hooks.analysis.columns", "spectral_hooks.analysis.shared_weights",
    "spectral_hooks.integrations.power_log", "spectral_hooks.steering",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    assert "doctest: +SKIP" not in inspect.getsource(module)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{name}: {result}"


@pytest.mark.parametrize("name", MODULES)
def test_public_functions_are_documented(name):
    module = importlib.import_module(name)
    missing = [n for n, obj in vars(module).items()
               if not n.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj))
               and obj.__module__ == name and not inspect.getdoc(obj)]
    assert not missing, f"{name}: no docstring: {missing}"
