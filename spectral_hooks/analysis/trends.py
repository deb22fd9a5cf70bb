"""Section ``trends``: Spearman depth trends of per-layer Jacobian and power metrics (the power
metrics under the report's own ``iterate`` and ``fold_norm``).

    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> import spectral_hooks as sh
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
    >>> with sh.instrument(model) as probe, torch.no_grad():
    ...     _ = model(input_ids=torch.arange(16).reshape(2, 8))
    >>> trends = probe.analyze(jacobian={"k": 4}).trends      # trends_section
    >>> list(trends.columns)
    ['metric', 'spearman_rho', 'pvalue', 'pvalue_adj', 'n_layers']
"""

from __future__ import annotations

import pandas as pd

from ..metrics.stats import with_adjusted
from ..metrics.trends import trends_table
from .jacobian import JacobianView
from .options import AnalyzeOptions
from .power import power_section
from .subject import Subject

JACOBIAN_TREND_METRICS = ("frac_complex", "mean_abs_angle", "frac_negative",
                          "frac_complex_top{k}", "mean_abs_angle_top{k}", "frac_negative_top{k}",
                          "sym_energy", "commutator", "departure_rel", "self_alignment_top{k}",
                          "top_eig_abs")
POWER_TREND_METRICS = ("gap_ratio", "gamma", "lift", "mean_cos", "erank")


def trends_of(jacobian: pd.DataFrame, power: pd.DataFrame, k: int) -> pd.DataFrame:
    """The trends table of a (trained) jacobian table and a power table, p-values adjusted over
    one family: every metric of the table (Jacobian and power metrics together)."""
    names = [m.format(k=k) for m in JACOBIAN_TREND_METRICS]  # exact-only ones: when present
    frames = [trends_table(jacobian, [m for m in names if m in jacobian.columns]),
              trends_table(power, POWER_TREND_METRICS)]
    return with_adjusted(pd.concat(frames, ignore_index=True), ["pvalue"])


def trends_section(subject: Subject, options: AnalyzeOptions) -> pd.DataFrame:
    """The ``trends`` table of ``subject``: :func:`trends_of` its Jacobian and power tables."""
    o = options.jacobian_options
    return trends_of(JacobianView(subject, o).table(), power_section(subject, options), o.k)
