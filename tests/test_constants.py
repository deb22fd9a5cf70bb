"""One name, one meaning, one home (issue 56): every public module-level constant of the package
(an UPPER_CASE name assigned at the top of a module) is defined in exactly one module; other
modules import it. A second definition of the same name, even with the same value, fails here:
either import the first, or give the new meaning its own name. Private names (``_EPS``) belong
to their module and are not counted."""

import ast
import inspect
import re
from collections import defaultdict
from pathlib import Path

import spectral_hooks

PACKAGE = Path(spectral_hooks.__file__).parent
CONSTANT = re.compile(r"[A-Z][A-Z0-9_]*")


def _assigned_names(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.Assign):
        targets = [e for t in node.targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
    elif isinstance(node, ast.AnnAssign):
        targets = [node.target]
    else:
        return []
    return [t.id for t in targets if isinstance(t, ast.Name)]


def constant_definitions() -> dict[str, list[str]]:
    """{NAME: [modules that assign it at module level]} over every module of the package."""
    homes: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            for name in _assigned_names(node):
                if CONSTANT.fullmatch(name) and module not in homes[name]:
                    homes[name].append(module)
    return homes


def test_every_constant_name_has_one_home():
    homes = constant_definitions()
    assert len(homes) > 50  # the scan sees the package's constants
    twice = {name: modules for name, modules in homes.items() if len(modules) > 1}
    assert not twice, f"constants defined in more than one module: {twice}"


def test_the_scan_catches_a_second_definition(tmp_path):
    tree = ast.parse("TOP_K = 8\nA, B = 1, 2\nX: int = 3\n_PRIVATE = 1\nlower = 2\n")
    names = [n for node in tree.body for n in _assigned_names(node) if CONSTANT.fullmatch(n)]
    assert names == ["TOP_K", "A", "B", "X"]


def test_the_power_views_defaults_come_from_one_home():
    """The default k and the iterate names are metrics.spectrum's; everything else derives."""
    from spectral_hooks.analysis import options
    from spectral_hooks.analysis.power import layer_power_spectrum
    from spectral_hooks.integrations import power_log
    from spectral_hooks.metrics import power, spectrum

    assert options.PowerOptions().k == spectrum.TOP_K
    assert options.ITERATES is spectrum.ITERATES
    for fn in (power_log.power_rows, power_log.power_metrics, layer_power_spectrum,
               power.power_table, power.spectra_table, spectrum.spectrum):
        params = inspect.signature(fn).parameters
        k = params.get("k", params.get("top_k"))
        assert k is not None and k.default == spectrum.TOP_K, fn.__name__
    fields = [f for f in options.PowerOptions.__dataclass_fields__ if f != "direction"]
    assert power_log.POWER_OPTIONS == ("iterate", "fold_norm", *fields)


def test_sample_summary_writes_its_declared_columns():
    import pandas as pd

    from spectral_hooks.metrics.stats import SAMPLE_SUMMARY_COLUMNS, sample_summary

    table = pd.DataFrame({"variant": "trained", "layer": 0, "sample": [0, 1], "x": [1.0, 2.0]})
    assert tuple(sample_summary(table, ["x"]).columns) == SAMPLE_SUMMARY_COLUMNS
