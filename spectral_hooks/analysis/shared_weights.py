"""Section ``shared_weights`` (ALBERT): one F applied at every depth, the FFN-free power iteration
it predicts against the observed mean token direction.

    >>> import torch
    >>> import spectral_hooks as sh
    >>> from transformers import AlbertConfig, AlbertModel
    >>> model = AlbertModel(AlbertConfig(num_hidden_layers=3, hidden_size=32, embedding_size=16,
    ...                                  num_attention_heads=4, intermediate_size=64)).eval()
    >>> with sh.instrument(model) as probe, torch.no_grad():
    ...     _ = model(torch.arange(8)[None])
    ...     table = probe.analyze(progress=False).shared_weights
    >>> table["layer"].tolist()
    [0, 1, 2]
"""

from __future__ import annotations

from typing import cast

import pandas as pd
from torch import Tensor

from ..metrics.shared_weights import shared_weight_table
from .options import AnalyzeOptions
from .power import layer_matrices_of
from .subject import Subject


def shared_weights_section(subject: Subject, options: AnalyzeOptions) -> pd.DataFrame:
    """The ``shared_weights`` table of ``subject``: one block of rows per shared-weight group
    (column ``group``), computed once per state of the weights and recording."""
    def compute() -> pd.DataFrame:
        F = layer_matrices_of(subject, fold_norm=options.fold_norm)
        post, pre = subject.tokens("resid_post"), subject.tokens("resid_pre")
        tables = [shared_weight_table(F[g[0]], [cast(Tensor, post[i]) for i in g],
                                      cast(Tensor, pre[g[0]])).assign(group=n)
                  for n, g in enumerate(subject.shared_groups())]
        return pd.concat(tables, ignore_index=True)
    return subject.memo(("shared_weights", options.fold_norm), compute)
