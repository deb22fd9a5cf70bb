"""The figure module, imported on first use (matplotlib is the ``report`` extra).

    >>> plots = load_plots()          # doctest: +SKIP
    >>> plots.figures(report)         # doctest: +SKIP
"""

from __future__ import annotations

from types import ModuleType

from ..errors import require


def load_plots() -> ModuleType:
    """:mod:`spectral_hooks.report.plots`, or one MissingExtraError line naming the extra."""
    require("matplotlib", feature="report figures")
    from . import plots

    return plots
