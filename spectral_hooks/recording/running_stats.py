"""Running token statistics of a capture (``store="stats"``): count, mean and covariance,
accumulated in float64 over the real (non-padding) tokens of every forward call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch
from torch import Tensor

from ..errors import RecordingError

__all__ = ["RunningStats", "Accumulator"]


@dataclass(frozen=True)
class RunningStats:
    """Token statistics of one capture at one layer (padding excluded)."""

    count: int
    mean: Tensor  # [d] float64
    cov: Tensor  # [d, d] float64, unbiased (divides by count - 1)


class Accumulator:
    """Sums of the real tokens' vectors and outer products, in float64 (``store="stats"``).
    An update reads nothing to the host: the token count stays a device tensor until
    :meth:`result`.

        >>> acc = Accumulator()
        >>> acc.update(torch.tensor([[[1., 2.], [3., 4.], [9., 9.]]]), torch.tensor([[1, 1, 0]]))
        >>> stats = acc.result()
        >>> stats.count, stats.mean.tolist()
        (2, [2.0, 3.0])
    """

    def __init__(self) -> None:
        self.count: Union[int, Tensor] = 0
        self.total: Optional[Tensor] = None
        self.outer: Optional[Tensor] = None

    def update(self, x: Tensor, mask: Optional[Tensor]) -> None:
        """Add the tokens of ``x`` [batch, pos, d] where ``mask`` [batch, pos] is non-zero
        (None: every token)."""
        tokens = x.detach().reshape(-1, x.shape[-1]).to(torch.float64)
        if mask is None:
            self.count = self.count + tokens.shape[0]
        else:
            real = (mask.to(x.device) != 0).reshape(-1, 1)
            tokens = tokens.masked_fill(~real, 0.0)  # padding adds zero (NaN there too)
            self.count = self.count + real.sum()
        if self.total is None:
            d = x.shape[-1]
            self.total = torch.zeros(d, dtype=torch.float64, device=x.device)
            self.outer = torch.zeros(d, d, dtype=torch.float64, device=x.device)
        assert self.outer is not None  # allocated with the total
        self.total += tokens.sum(0)
        self.outer += tokens.T @ tokens

    def result(self) -> RunningStats:
        """Count, mean and unbiased covariance so far (RecordingError before any token)."""
        count = int(self.count)
        if not count:
            raise RecordingError("no tokens recorded yet")
        assert self.total is not None and self.outer is not None  # a token was counted
        mean = self.total / count
        denom = max(count - 1, 1)
        cov = (self.outer - count * torch.outer(mean, mean)) / denom
        return RunningStats(count, mean, cov)
