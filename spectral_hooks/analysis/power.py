"""Section ``power`` of the power-method view: per layer, F_t's spectrum and gap, token alignment
with its principal subspace, consensus; ``cross_power``: the same from the weights alone for the
cross-attention F of a decoder stack (encoder-decoder models). ``rho_pvalue_adj``: the
Benjamini-Hochberg adjustment of ``rho_pvalue`` over the layers of the table (one family per
table).

    >>> options = AnalyzeOptions()                       # doctest: +SKIP
    >>> power_section(subject, options)                  # doctest: +SKIP
       layer  abs_lambda1  gap_ratio  gamma ...
"""

from __future__ import annotations

import pandas as pd
from torch import Tensor

from ..metrics.power import power_table
from ..metrics.stats import with_adjusted
from ..weights import layer_matrices
from .finite import check_layer_matrices_finite
from .options import AnalyzeOptions
from .subject import Subject

#: p-value columns, Benjamini-Hochberg adjusted over the layers of the table (``*_adj``)
PVALUES = ("rho_pvalue",)


def layer_matrices_of(subject: Subject, *, fold_norm: bool) -> Tensor:
    """F_t of every layer (float64, CPU), computed once per state of the weights."""
    def compute() -> Tensor:
        F = layer_matrices(subject.anatomy, fold_norm=fold_norm)
        check_layer_matrices_finite(F, subject.layers)
        return F
    return subject.memo(("F", fold_norm), compute)


def has_cross_attention(subject: Subject) -> bool:
    return any(part.cross_value is not None for part in subject.anatomy.layers)


def cross_power_section(subject: Subject, options: AnalyzeOptions) -> pd.DataFrame:
    """``power``'s columns for F_t = sum_h W_O^h W_V^h of each decoder block's cross-attention.
    Its values read the encoder output, not this stack's tokens: the token columns are NaN."""
    def compute() -> pd.DataFrame:
        F = subject.memo(("F_cross",),
                         lambda: layer_matrices(subject.anatomy, attention="cross"))
        return with_adjusted(power_table(F, None, None, iterate=options.iterate,
                                         layers=list(subject.layers)), PVALUES)
    return subject.memo(("cross_power", options.iterate), compute)


def power_section(subject: Subject, options: AnalyzeOptions) -> pd.DataFrame:
    def compute() -> pd.DataFrame:
        F = layer_matrices_of(subject, fold_norm=options.fold_norm)
        return with_adjusted(power_table(F, subject.tokens("resid_pre"),
                                         subject.tokens("resid_post"), iterate=options.iterate,
                                         layers=list(subject.layers)), PVALUES)
    return subject.memo(("power", options.iterate, options.fold_norm), compute)
