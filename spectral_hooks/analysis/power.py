"""Sections of the power-method view: ``power``, ``spectra`` (rows of F) and ``shared_weights``.

    >>> options = AnalyzeOptions()                       # doctest: +SKIP
    >>> power_section(subject, options)                  # doctest: +SKIP
       layer  abs_lambda1  gap_ratio  gamma ...
"""

from __future__ import annotations

import pandas as pd
from torch import Tensor

from ..metrics.power import power_table, spectra_table
from ..metrics.shared_weights import shared_weight_table
from ..weights import layer_matrices
from .options import AnalyzeOptions
from .subject import Subject


def layer_matrices_of(subject: Subject, *, fold_norm: bool) -> Tensor:
    """F_t of every layer (float64, CPU), computed once per state of the weights."""
    return subject.memo(("F", fold_norm),
                        lambda: layer_matrices(subject.anatomy, fold_norm=fold_norm))


def power_section(subject: Subject, options: AnalyzeOptions) -> pd.DataFrame:
    def compute() -> pd.DataFrame:
        F = layer_matrices_of(subject, fold_norm=options.fold_norm)
        return power_table(F, subject.tokens("resid_pre"), subject.tokens("resid_post"),
                           iterate=options.iterate, layers=list(subject.layers))
    return subject.memo(("power", options.iterate, options.fold_norm), compute)


def spectra_section(subject: Subject, options: AnalyzeOptions) -> pd.DataFrame:
    return subject.memo(("spectra", options.iterate, options.fold_norm), lambda: spectra_table(
        layer_matrices_of(subject, fold_norm=options.fold_norm), iterate=options.iterate))


def shared_weights_section(subject: Subject, options: AnalyzeOptions) -> pd.DataFrame:
    def compute() -> pd.DataFrame:
        F = layer_matrices_of(subject, fold_norm=options.fold_norm)
        post, pre = subject.tokens("resid_post"), subject.tokens("resid_pre")
        tables = [shared_weight_table(F[g[0]], [post[i] for i in g], pre[g[0]]).assign(group=n)
                  for n, g in enumerate(subject.shared_groups())]
        return pd.concat(tables, ignore_index=True)
    return subject.memo(("shared_weights", options.fold_norm), compute)
