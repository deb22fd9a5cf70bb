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

from typing import Any, cast

import pandas as pd
import torch
from torch import Tensor

from ..errors import OptionError
from ..metrics.power import power_table
from ..metrics.spectrum import BATCHED_EIG_DEVICES, FACTORED_EXACT_MAX
from ..metrics.stats import with_adjusted
from ..anatomy.weights import LayerOperators, layer_matrices, layer_operators
from .finite import check_layer_matrices_finite
from .options import AnalyzeOptions
from .subject import Subject

#: p-value columns, Benjamini-Hochberg adjusted over the layers of the table (``*_adj``)
PVALUES = ("rho_pvalue",)


def layer_matrices_of(subject: Subject, *, fold_norm: bool, on_device: bool = False) -> Tensor:
    """F_t of every layer (float64; on the CPU, or with ``on_device`` on the model's device
    where it has float64 and batched eig, metrics.spectrum.BATCHED_EIG_DEVICES), computed once
    per state of the weights."""
    device = torch.device("cpu")
    if on_device:
        weight = subject.anatomy.layers[0].output_weights()
        if weight.device.type in BATCHED_EIG_DEVICES:
            device = weight.device

    def compute() -> Tensor:
        F = layer_matrices(subject.anatomy, fold_norm=fold_norm, device=device)
        check_layer_matrices_finite(F, subject.layers)
        return F
    return subject.memo(("F", fold_norm, str(device)), compute)


def power_matrices_of(subject: Subject, options: AnalyzeOptions) -> Tensor | LayerOperators:
    """What the power view's spectra are computed from: the dense F_t stack, or the layer
    operators x -> W_O (W_V x) on the model's device (``anatomy.weights.LayerOperators``: no d x d
    matrix is formed) where ``options.power`` says matrix-free (by default d_model >=
    POWER_MATRIX_FREE_D: the top-k eigenpairs, or every one from the factors, below) or, by
    default at any width, where every layer's factors are thin enough for all of F_t's
    eigenvalues to come exactly from the r x r matrix W_V W_O (grouped-query models:
    r < d and r <= FACTORED_EXACT_MAX), which costs less than the dense eig of F_t."""
    po = options.power_options
    d = subject.anatomy.d_model
    operators = subject.memo(("F_operators", options.fold_norm), lambda: layer_operators(
        subject.anatomy, fold_norm=options.fold_norm))
    if po.matrix_free(d) or (po.full is None and subject.memo(("F_thin",), lambda: all(
            r < d and r <= FACTORED_EXACT_MAX for r in map(operators.inner_width, subject.layers)))):
        return operators
    return layer_matrices_of(subject, fold_norm=options.fold_norm, on_device=True)


def spectrum_options(subject: Subject, options: AnalyzeOptions) -> dict[str, Any]:
    """``dense_limit`` / ``top_k`` of the metrics' spectrum for these options: ``full=True``
    never truncates, whatever the width; ``full=False`` always does (top k by Krylov)."""
    po = options.power_options
    if po.full is None:
        return {"top_k": po.k}
    # full=False asks for the top k: no dense eig, not even of a factored F's r x r matrix
    return {"top_k": po.k, "dense_limit": subject.anatomy.d_model if po.full else 0}


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
        # the metrics take either form: [L, d, d] or a stack of layer operators (duck-typed)
        F = cast(Tensor, power_matrices_of(subject, options))
        po = options.power_options
        direction = None
        if po.direction is not None:
            if len(po.direction) != subject.anatomy.d_model:
                raise OptionError("power.direction", f"a vector of length {len(po.direction)}",
                                  f"a vector of length d_model = {subject.anatomy.d_model}")
            direction = torch.tensor(po.direction, dtype=torch.float64)
        L = subject.anatomy.n_layers
        if po.reference_layer is not None and not -L <= po.reference_layer < L:
            raise OptionError("power.reference_layer", po.reference_layer,
                              f"a layer index in [-{L}, {L})")
        table = power_table(F, subject.tokens("resid_pre"), subject.tokens("resid_post"),
                            iterate=options.iterate, layers=list(subject.layers),
                            reference_layer=po.reference_layer, direction=direction,
                            **spectrum_options(subject, options))
        return with_adjusted(table, PVALUES)
    return subject.memo(("power", options.iterate, options.fold_norm,
                         options.power_options), compute)
