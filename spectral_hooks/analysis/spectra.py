"""Section ``spectra``: every eigenvalue of each layer's F_t (the Jacobian's top-k join it when
the Jacobian view is on), one row per eigenvalue.

    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> import spectral_hooks as sh
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
    >>> with sh.instrument(model) as probe, torch.no_grad():
    ...     _ = model(input_ids=torch.arange(16).reshape(2, 8))
    >>> subject = probe.subject   # what probe.analyze() hands to each section
    >>> table = spectra_section(subject, AnalyzeOptions())
    >>> table.groupby("layer").size().tolist()        # d_model = 32 eigenvalues per layer
    [32, 32]
"""

from __future__ import annotations

from typing import cast

import pandas as pd
from torch import Tensor

from ..metrics.power import SPECTRA_COLUMNS, spectra_table
from .options import AnalyzeOptions
from .power import power_matrices_of, spectra_by_layer, spectrum_options
from .subject import Subject


def spectra_section(subject: Subject, options: AnalyzeOptions) -> pd.DataFrame:
    """Every layer of the model (recorded or not: F is read from the weights), or this rank's
    share of them in a distributed analysis (``subject.share``)."""
    def compute() -> pd.DataFrame:
        # the metrics take either form: [L, d, d] or a stack of layer operators (duck-typed)
        layers = subject.share_of(subject.anatomy.ov_layers)
        if not layers:  # no layer with an OV map (a Mamba-2 stack)
            return pd.DataFrame(columns=list(SPECTRA_COLUMNS))
        F = cast(Tensor, power_matrices_of(subject, options))
        spectra_by_layer(subject, options, F, layers)
        return spectra_table(F, iterate=options.iterate, layers=layers,
                             **spectrum_options(subject, options))
    return subject.memo(("spectra", options.iterate, options.fold_norm,
                         options.power_options), compute)
