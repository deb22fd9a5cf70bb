"""Attention patterns in a recording: ``Tensor[batch, head, query_pos, key_pos]`` per layer.

A run's chunks are its forward calls: the prefill [b, h, n, n], then each ``generate()`` decode
step [b, h, 1, n + k] (one more key each time). Keys are right-padded with zeros to the run's
positions and the chunks stacked along the queries; runs are zero-padded to the widest one in
both position dimensions (padding rows and columns are 0, as the mask says).

    >>> a, b = torch.ones(1, 2, 2, 2), torch.ones(1, 2, 1, 3)
    >>> stacked([[a, b]], 3).shape
    torch.Size([1, 2, 3, 3])
"""

from __future__ import annotations

import torch
from torch import Tensor


def _pad(t: Tensor, queries: int, keys: int) -> Tensor:
    return torch.nn.functional.pad(t, (0, keys - t.shape[3], 0, queries - t.shape[2]))


def stacked(runs: list[list[Tensor]], width: int) -> Tensor:
    """One tensor [sum of batches, head, width, width] from each run's chunks."""
    rows = []
    for chunks in runs:
        n = sum(c.shape[2] for c in chunks)
        rows.append(_pad(torch.cat([_pad(c, c.shape[2], n) for c in chunks], dim=2),
                         width, width))
    return torch.cat(rows, dim=0)
