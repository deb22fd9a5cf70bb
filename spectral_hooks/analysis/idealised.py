"""Section ``idealised`` (``analyze(idealised=True)``): paper 1's idealised dynamics, FFN-free,
L2-normalised, uniform attention, driven by the model's own layer matrices F_t, from the tokens
that entered the first recorded layer; per layer, predicted against observed (alignment with
the power section's B_t, consensus direction and rate, bipolar consensus, rotation).

    >>> idealised_section(subject, AnalyzeOptions(idealised=True))   # doctest: +SKIP
"""

from __future__ import annotations

import pandas as pd

from ..errors import RecordingError
from ..metrics.idealised_table import idealised_table
from .options import AnalyzeOptions
from .power import layer_matrices_of
from .subject import Subject


def idealised_unavailable(subject: Subject) -> str | None:
    """Why the section cannot be computed from this recording (None: it can)."""
    rec = subject.recording
    if not subject.keeps_tokens or "resid_pre" not in rec.capture:
        return "it needs the tokens of resid_pre (store='device' or 'cpu', capture resid_pre)"
    return None


def start_tokens(subject: Subject, layer: int) -> list:
    """Per recorded sequence, its real tokens entering ``layer`` (in recording order)."""
    rec = subject.recording
    X, mask = rec.tensor("resid_pre", layer), rec.mask.to("cpu")
    X = X.detach().to("cpu")
    return [X[b][mask[b] != 0] for b in range(X.shape[0]) if bool((mask[b] != 0).any())]


def idealised_section(subject: Subject, options: AnalyzeOptions) -> pd.DataFrame:
    def compute() -> pd.DataFrame:
        reason = idealised_unavailable(subject)
        if reason is not None:
            raise RecordingError(f"section idealised: {reason}")
        F = layer_matrices_of(subject, fold_norm=options.fold_norm)
        first = min(subject.layers)
        return idealised_table(
            F, start_tokens(subject, first), subject.tokens("resid_pre"),
            subject.tokens("resid_post"), first=first, layers=list(subject.layers),
            iterate=options.iterate, causal=bool(subject.anatomy.causal))
    return subject.memo(("idealised", options.iterate, options.fold_norm), compute)
