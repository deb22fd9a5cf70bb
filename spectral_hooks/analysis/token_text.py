"""Which token a row is about: its id and, when a tokenizer is known, its text.

    >>> import pandas as pd, torch
    >>> frame = pd.DataFrame({"sample": [0, 0], "position": [1, 2]})
    >>> ids = torch.tensor([[7, 8, -1]])
    >>> name_tokens(frame, ids, tokenizer=None)[["token_id", "token"]].values.tolist()
    [[8, ''], [-1, '']]

A position holds -1 (and text "") where the recording has no id: padding, or a model called
with embeddings instead of token ids.
"""

from __future__ import annotations

from typing import Any, Optional

import pandas as pd
from torch import Tensor


def _text(tokenizer: Any, token_id: int) -> str:
    if tokenizer is None or token_id < 0:
        return ""
    return str(tokenizer.decode([token_id]))


def name_tokens(frame: pd.DataFrame, token_ids: Tensor, tokenizer: Optional[Any]
                ) -> pd.DataFrame:
    """``frame`` (with ``sample`` and ``position`` columns) plus ``token_id`` and ``token``."""
    if frame.empty or not {"sample", "position"} <= set(frame.columns):
        return frame
    ids = token_ids.tolist()
    width = token_ids.shape[1]

    def lookup(sample: int, position: int) -> int:
        inside = 0 <= sample < len(ids) and 0 <= position < width
        return int(ids[sample][position]) if inside else -1

    out = frame.copy()
    out["token_id"] = [lookup(int(s), int(p)) for s, p in zip(frame["sample"],
                                                              frame["position"])]
    out["token"] = [_text(tokenizer, t) for t in out["token_id"]]
    return out
