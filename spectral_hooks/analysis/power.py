"""Section ``power`` of the power-method view: per layer, F_t's spectrum and gap, token alignment
with its principal subspace, consensus.

    >>> options = AnalyzeOptions()                       # doctest: +SKIP
    >>> power_section(subject, options)                  # doctest: +SKIP
       layer  abs_lambda1  gap_ratio  gamma ...
"""

from __future__ import annotations

import pandas as pd
from torch import Tensor

from ..metrics.power import power_table
from ..weights import layer_matrices
from .finite import check_layer_matrices_finite
from .options import AnalyzeOptions
from .subject import Subject


def layer_matrices_of(subject: Subject, *, fold_norm: bool) -> Tensor:
    """F_t of every layer (float64, CPU), computed once per state of the weights."""
    def compute() -> Tensor:
        F = layer_matrices(subject.anatomy, fold_norm=fold_norm)
        check_layer_matrices_finite(F, subject.layers)
        return F
    return subject.memo(("F", fold_norm), compute)


def power_section(subject: Subject, options: AnalyzeOptions) -> pd.DataFrame:
    def compute() -> pd.DataFrame:
        F = layer_matrices_of(subject, fold_norm=options.fold_norm)
        return power_table(F, subject.tokens("resid_pre"), subject.tokens("resid_post"),
                           iterate=options.iterate, layers=list(subject.layers))
    return subject.memo(("power", options.iterate, options.fold_norm), compute)
