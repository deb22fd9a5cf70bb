"""The figure module, imported on first use (matplotlib is the ``report`` extra).

    >>> plots = load_plots()           # MissingExtraError naming the 'report' extra without it
    >>> plots.__name__, "gap_ratio" in plots.FIGURES
    ('spectral_hooks.report.plots', True)
"""

from __future__ import annotations

from types import ModuleType

from ..errors import require


def load_plots() -> ModuleType:
    """:mod:`spectral_hooks.report.plots`, or one MissingExtraError line naming the extra."""
    require("matplotlib", feature="report figures")
    from . import plots

    return plots
