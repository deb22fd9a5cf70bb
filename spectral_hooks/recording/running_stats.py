"""Running token statistics of a capture (``store="stats"``): count, mean and covariance,
accumulated in float64 over the real (non-padding) tokens of every forward call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

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
    """Sums of the real tokens' vectors and outer products, in float64 (``store="stats"``)."""

    def __init__(self) -> None:
        self.count = 0
        self.total: Optional[Tensor] = None
        self.outer: Optional[Tensor] = None

    def update(self, x: Tensor, mask: Tensor) -> None:
        """Add the tokens of ``x`` [batch, pos, d] where ``mask`` [batch, pos] is non-zero."""
        tokens = x[mask.bool()].to(torch.float64)
        if self.total is None:
            d = x.shape[-1]
            self.total = torch.zeros(d, dtype=torch.float64, device=x.device)
            self.outer = torch.zeros(d, d, dtype=torch.float64, device=x.device)
        assert self.outer is not None  # allocated with the total
        self.count += tokens.shape[0]
        self.total += tokens.sum(0)
        self.outer += tokens.T @ tokens

    def result(self) -> RunningStats:
        """Count, mean and unbiased covariance so far (RecordingError before any token)."""
        if not self.count:
            raise RecordingError("no tokens recorded yet")
        assert self.total is not None and self.outer is not None  # a token was counted
        mean = self.total / self.count
        denom = max(self.count - 1, 1)
        cov = (self.outer - self.count * torch.outer(mean, mean)) / denom
        return RunningStats(self.count, mean, cov)
