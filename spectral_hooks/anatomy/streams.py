"""Blocks whose residual state is several parallel streams (Gemma 3n's AltUp).

Gemma 3n's blocks take and return a stack of ``count`` residual streams, a tensor
[streams, batch, pos, d]: the attention and MLP read one of them (``active``, through AltUp's
prediction) and AltUp's correction writes all of them. The probe records such a state as one
token vector per position, the streams side by side, [batch, pos, streams * d], so that every
per-token tool (the recording, the Jacobian view's replays, the topology of residual units)
sees the whole state the block maps; the power view's F = W_O W_V acts on one stream of width
d, and reads the active one (:meth:`ResidualStreams.active_part`).

    >>> import torch
    >>> streams = ResidualStreams(count=2, active=0)
    >>> x = torch.arange(2 * 1 * 3 * 4.).reshape(2, 1, 3, 4)      # [streams, batch, pos, d]
    >>> tokens = streams.to_tokens(x)
    >>> tokens.shape, bool(torch.equal(streams.from_tokens(tokens), x))
    (torch.Size([1, 3, 8]), True)
    >>> bool(torch.equal(streams.active_part(tokens), x[0]))
    True
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from ..errors import RecordingError

__all__ = ["ResidualStreams"]


@dataclass(frozen=True)
class ResidualStreams:
    """``count`` residual streams stacked on a block's input and output dimension 0;
    ``active``: the stream the block's attention reads (the power view's tokens)."""

    count: int
    active: int = 0

    def to_tokens(self, x: Tensor) -> Tensor:
        """[streams, batch, pos, d] -> [batch, pos, streams * d] (stream s at s*d:(s+1)*d)."""
        if x.ndim != 4 or x.shape[0] != self.count:
            raise RecordingError(f"expected a block state of {self.count} residual streams "
                                 f"[{self.count}, batch, pos, d], got shape {tuple(x.shape)}")
        return x.permute(1, 2, 0, 3).reshape(x.shape[1], x.shape[2], -1)

    def from_tokens(self, tokens: Tensor) -> Tensor:
        """[batch, pos, streams * d] -> [streams, batch, pos, d] (contiguous): the inverse of
        :meth:`to_tokens`, what a block replay is called with."""
        batch, pos, width = tokens.shape
        return tokens.reshape(batch, pos, self.count, width // self.count) \
            .permute(2, 0, 1, 3).contiguous()

    def active_part(self, tokens: Tensor) -> Tensor:
        """The active stream of token vectors [..., streams * d] -> [..., d]."""
        d = tokens.shape[-1] // self.count
        return tokens[..., self.active * d:(self.active + 1) * d]
