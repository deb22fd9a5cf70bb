"""Checks of a recording against what an analysis asks of it, before anything is computed.

    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> import spectral_hooks as sh
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
    >>> mask = torch.tensor([[1] * 8, [0] * 8])    # the second sample: all padding
    >>> with sh.instrument(model) as probe, torch.no_grad():
    ...     _ = model(input_ids=torch.arange(16).reshape(2, 8), attention_mask=mask)
    >>> preflight(probe.recording, AnalyzeOptions()) is None    # the power view: fine
    True
    >>> preflight(probe.recording, AnalyzeOptions(jacobian={"k": 4}))
    Traceback (most recent call last):
    spectral_hooks.errors.RecordingError: sample(s) [1] are all padding ...
"""

from __future__ import annotations

import warnings
from typing import Optional

import torch

from ..errors import RecordingError
from ..recording import Recording
from .finite import check_recording_finite
from .options import AnalyzeOptions

#: Power-table columns computed from recorded tokens: NaN, with a reason, when there are none.
TOKEN_COLUMNS = ("gamma_in", "gamma", "lift", "gamma2_in", "gamma2", "rho", "rho_pvalue",
                 "mean_cos", "collapse_residual", "erank")


class TokenColumnsWarning(UserWarning):
    """The power table's token columns will be NaN (the reason is in metadata["nan_reasons"])."""


def preflight(recording: Recording, options: AnalyzeOptions) -> Optional[str]:
    """Refuse a recording that cannot support the analysis; the reason token columns are NaN.

    All-padding input (attention_mask all zeros) is an error: no token to measure or linearize
    at. store="stats" keeps no per-token states: the power table's `TOKEN_COLUMNS` are NaN, with
    a TokenColumnsWarning and ``report.metadata["nan_reasons"]["power"]``. NaN or Inf in a
    real token (or in the Jacobian view's sample's block inputs) is one NonFiniteError naming
    the first: layer, sample, token and capture point (``finite.py``).
    """
    if recording.n_samples == 0:
        raise RecordingError("nothing recorded yet: run the model inside the probe (with "
                             "probe: model(**batch)) before probe.analyze()")
    real = recording.mask.sum(dim=1)
    if int(real.sum()) == 0:
        raise RecordingError("every recorded position is padding (attention_mask is all zeros): "
                             "there is no token to analyse; pass a mask with a 1 per real token")
    needs_rows = options.jacobian is not None or options.bottleneck or options.topology
    empty = [int(i) for i in torch.nonzero(real == 0).flatten()]
    if needs_rows and empty:
        raise RecordingError(f"sample(s) {empty[:8]} are all padding (attention_mask all zeros "
                             "on those rows): the Jacobian view needs a real token in every "
                             "recorded sample; drop those rows before running the model")
    sample = options.jacobian_options.sample
    check_recording_finite(recording, sample=sample if options.jacobian_view
                           and 0 <= sample < recording.n_samples else None)
    if options.power and recording.store == "stats":
        reason = ("store='stats' keeps running statistics only, no per-token states: the "
                  "token columns need instrument(store='device') or store='cpu'")
        warnings.warn(f"power table: {', '.join(TOKEN_COLUMNS)} will be NaN: {reason}",
                      TokenColumnsWarning, stacklevel=4)
        return reason
    return None
