"""Sections ``topology`` (per layer) and ``units`` (per residual unit): communities, bridges
and their coupling to Jacobian amplification, with the init control when ``reinit=True``.

    >>> topology_section(subject, AnalyzeOptions(topology=True))   # doctest: +SKIP
"""

from __future__ import annotations

import pandas as pd

from ..metrics.topology import topology_tables
from .jacobian import JacobianView
from .options import AnalyzeOptions
from .reinit import init_subject
from .subject import Subject


def _tables(subject: Subject, options: AnalyzeOptions) -> tuple[pd.DataFrame, pd.DataFrame]:
    o = options.jacobian_options

    def compute() -> tuple[pd.DataFrame, pd.DataFrame]:
        view = JacobianView(subject, o)
        rec = subject.recording
        X = {layer: rec.tokens("resid_pre", layer) for layer in view.layers}
        g = {layer: view.amplification(layer) for layer in view.layers}
        g_init = None
        if options.reinit:
            init = JacobianView(init_subject(subject, seed=o.init_seed), o)
            g_init = {layer: init.amplification(layer) for layer in view.layers}
        return topology_tables(X, g, g_init_by_layer=g_init, seed=o.seed)
    return subject.memo(("topology", o, options.reinit), compute)


def topology_section(subject: Subject, options: AnalyzeOptions) -> pd.DataFrame:
    return _tables(subject, options)[0]


def units_section(subject: Subject, options: AnalyzeOptions) -> pd.DataFrame:
    return _tables(subject, options)[1]
