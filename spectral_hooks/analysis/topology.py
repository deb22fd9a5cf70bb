"""Sections ``topology`` (per layer), ``units`` (per residual unit) and ``communities`` (per
layer x community): communities, bridges, their coupling to Jacobian amplification, and each
unit's and community's signed gain log ||J e_i||, with the init control when ``reinit=True``.

    >>> topology_section(subject, AnalyzeOptions(topology=True))   # doctest: +SKIP
"""

from __future__ import annotations

import pandas as pd

from ..metrics.community_gain import community_table
from ..metrics.topology import topology_tables
from .jacobian import JacobianView
from .options import AnalyzeOptions
from .reinit import init_subject
from .subject import Subject

#: label permutations of the communities' gain null
GAIN_SHUFFLES = 1000


def _tables(subject: Subject, options: AnalyzeOptions) -> tuple[pd.DataFrame, pd.DataFrame]:
    o = options.jacobian_options

    def compute() -> tuple[pd.DataFrame, pd.DataFrame]:
        view = JacobianView(subject, o)
        rec = subject.recording
        X = {layer: rec.tokens("resid_pre", layer) for layer in view.layers}
        g = {layer: view.amplification(layer) for layer in view.layers}
        gain = {layer: view.log_gain(layer) for layer in view.layers}
        g_init = gain_init = None
        if options.reinit:
            init = JacobianView(init_subject(subject, seed=o.init_seed), o)
            g_init = {layer: init.amplification(layer) for layer in view.layers}
            gain_init = {layer: init.log_gain(layer) for layer in view.layers}
        return topology_tables(X, g, g_init_by_layer=g_init, seed=o.seed, gain_by_layer=gain,
                               gain_init_by_layer=gain_init)
    return subject.memo(("topology", o, options.reinit), compute)


def topology_section(subject: Subject, options: AnalyzeOptions) -> pd.DataFrame:
    return _tables(subject, options)[0]


def units_section(subject: Subject, options: AnalyzeOptions) -> pd.DataFrame:
    return _tables(subject, options)[1]


def communities_section(subject: Subject, options: AnalyzeOptions) -> pd.DataFrame:
    return community_table(units_section(subject, options), n_shuffles=GAIN_SHUFFLES,
                           seed=options.jacobian_options.seed)
