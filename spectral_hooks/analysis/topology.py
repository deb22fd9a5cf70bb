"""Sections ``topology`` (per layer), ``units`` (per residual unit) and ``communities`` (per
layer x community x layer type): communities, bridges, their coupling to Jacobian
amplification, and each unit's and community's signed gain log ||J e_i||, with the init control
when ``reinit=True``; with ``topology={"sublayers": True}`` also the gains through the
attention and the feed-forward sublayer (``linearize/sublayers.py``), per community by type.

    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> import spectral_hooks as sh
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
    >>> with sh.instrument(model) as probe, torch.no_grad():
    ...     _ = model(input_ids=torch.arange(16).reshape(2, 8))
    >>> report = probe.analyze(topology=True)
    >>> report.topology["layer"].tolist(), len(report.units)    # units: layers x d_model
    ([0, 1], 64)
"""

from __future__ import annotations

import pandas as pd
import torch
from torch import Tensor

from ..linearize.sublayers import sublayer_jacobian
from ..metrics.community_gain import community_table
from ..metrics.topology import UnitNorms, log_gain, topology_tables
from . import progress
from .jacobian import JacobianView
from .options import AnalyzeOptions
from .reinit import init_subject
from .subject import Subject

#: label permutations of the communities' gain null
GAIN_SHUFFLES = 1000


#: the units table's columns of the sublayer gains: sublayer -> (trained, init)
SUBLAYER_COLUMNS = {"attention": ("log_gain_attn", "log_gain_attn_init"),
                    "ffn": ("log_gain_ffn", "log_gain_ffn_init")}


def _sublayer_gain(view: JacobianView, layer: int, sublayer: str) -> UnitNorms:
    """log ||J_sub e_i|| at the view's anchor row: exact where the view is, else estimated."""
    s, o = view.subject, view.options
    op = sublayer_jacobian(s.anatomy, s.recording, layer, sublayer=sublayer,
                           position=view.anchor, sample=o.sample, method=view.method)
    if view.exact or view.dense_products:
        J = op.matmat(torch.eye(op.shape[1], dtype=op.dtype, device=op.device))
        return log_gain(J.to(torch.float64), dense=True)
    return log_gain(op, n_samples=o.n_samples, seed=o.seed)


def _with_errors(units: pd.DataFrame, columns: dict[str, dict[int, UnitNorms]]) -> pd.DataFrame:
    """``units`` with each named column's standard errors in ``<name>_se``, right after it
    (0 where exact; NaN where the value is, or for layers not given)."""
    units = units.copy()
    for column, by_layer in columns.items():
        se = pd.Series(float("nan"), index=units.index)
        for layer, norms in by_layer.items():
            se[units["layer"] == layer] = norms.std_error.numpy()
        units.insert(list(units.columns).index(column) + 1, f"{column}_se", se)
    return units


def _with_sublayers(units: pd.DataFrame, views: dict) -> pd.DataFrame:
    """``units`` with the sublayer gain columns and their standard errors (NaN for the init
    ones without reinit)."""
    units = units.copy()
    errors = {}
    for sublayer, columns in SUBLAYER_COLUMNS.items():
        for column, view in zip(columns, (views.get("trained"), views.get("init"))):
            units[column] = float("nan")
            errors[column] = {}
            if view is None:
                continue
            for layer in progress.layers(view.layers, f"{sublayer} gains ({view.label})",
                                         work="sublayers"):
                gain = errors[column][layer] = _sublayer_gain(view, layer, sublayer)
                units.loc[units["layer"] == layer, column] = gain.value.numpy()
    return _with_errors(units, errors)


def _tables(subject: Subject, options: AnalyzeOptions) -> tuple[pd.DataFrame, pd.DataFrame]:
    o = options.jacobian_options

    def compute() -> tuple[pd.DataFrame, pd.DataFrame]:
        view = JacobianView(subject, o)
        rec = subject.recording
        X = {layer: rec.tokens("resid_pre", layer) for layer in view.layers}
        g = {layer: view.amplification(layer) for layer in progress.layers(
            view.layers, "amplification (trained)", work=view.gain_work)}
        gain = {layer: view.log_gain(layer) for layer in progress.layers(
            view.layers, "gain (trained)", work=view.gain_work)}
        g_init, gain_init, init = {}, {}, None
        if options.reinit:
            init = JacobianView(init_subject(subject, seed=o.init_seed), o)
            g_init = {layer: init.amplification(layer) for layer in progress.layers(
                view.layers, "amplification (init)", work=init.gain_work)}
            gain_init = {layer: init.log_gain(layer) for layer in progress.layers(
                view.layers, "gain (init)", work=init.gain_work)}

        def values(by_layer: dict[int, UnitNorms]) -> dict[int, Tensor]:
            return {layer: norms.value for layer, norms in by_layer.items()}
        topo, units = topology_tables(X, values(g), g_init_by_layer=values(g_init) or None,
                                      seed=o.seed, gain_by_layer=values(gain),
                                      gain_init_by_layer=values(gain_init) or None)
        units = _with_errors(units, {"amplification": g, "log_gain": gain,
                                     "log_gain_init": gain_init})
        if not options.topology_sublayers:  # no all-NaN columns nobody asked for
            return topo, units
        return topo, _with_sublayers(units, {"trained": view, "init": init})
    return subject.memo(("topology", o, options.reinit, options.topology_sublayers), compute)


def topology_section(subject: Subject, options: AnalyzeOptions) -> pd.DataFrame:
    """The ``topology`` table: per layer, communities, bridges and their coupling to the
    Jacobian's amplification (memoised with ``units``)."""
    return _tables(subject, options)[0]


def units_section(subject: Subject, options: AnalyzeOptions) -> pd.DataFrame:
    """The ``units`` table: per layer and residual unit, its community, bridge score and signed
    gain log ||J e_i|| (with the init control and the sublayer gains when asked for)."""
    return _tables(subject, options)[1]


def communities_section(subject: Subject, options: AnalyzeOptions) -> pd.DataFrame:
    """The ``communities`` table: per layer, community and layer type, the mean gain against
    a shuffled-membership null (:func:`~spectral_hooks.metrics.community_gain.community_table`)."""
    return community_table(units_section(subject, options), n_shuffles=GAIN_SHUFFLES,
                           seed=options.jacobian_options.seed)
