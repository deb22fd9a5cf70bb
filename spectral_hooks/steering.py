"""Steering: a reversible rank-1 edit of one layer's attention output projection.

    >>> with steer(model, u, gap=0.01) as edit:     # doctest: +SKIP
    ...     out = model(**batch)                     # tokens pulled toward u
    >>> edit.gap_before, edit.gap_after              # doctest: +SKIP

The edit W_O' = W_O + alpha u w^T (METRICS.md section 1) makes F' = F + alpha u u_r^T, where
u_r is the part of u the value projection can reach (all of u unless GQA limits it).
The original weight is kept and copied back bit-exactly by ``remove()`` (also on exceptions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import Tensor, nn

from .anatomy import anatomy_of
from .errors import OptionError, UnsupportedModelError
from .metrics.steering_math import rank1_output_edit


@dataclass
class Steering:
    """An applied steering edit and what it achieved (eigenvalues of the steered layer's F)."""

    layer: int
    direction: Tensor
    alpha: float
    reachable_fraction: float
    lambda1_before: complex
    lambda1_after: complex
    gap_before: float
    gap_after: float
    residual_gap_before: float
    residual_gap_after: float
    _param: Optional[nn.Parameter] = field(default=None, repr=False)
    _original: Optional[Tensor] = field(default=None, repr=False)

    @property
    def active(self) -> bool:
        return self._param is not None

    def remove(self) -> None:
        """Restore the original weight exactly. Safe to call twice."""
        if self._param is None:
            return
        with torch.no_grad():
            self._param.copy_(self._original)
        self._param = self._original = None

    def __enter__(self) -> "Steering":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def steer(model: nn.Module, direction: Tensor, *, layer: int = -1, alpha: Optional[float] = None,
          gap: float = 0.1) -> Steering:
    """Edit layer ``layer``'s output projection so its F has principal eigenvector ``direction``.

    ``alpha=None`` picks the smallest alpha giving |lambda2|/|lambda1| <= ``gap`` with a real
    positive lambda1 whose eigenvector aligns with ``direction``, for F and for the residual
    update I + F alike (see :func:`~spectral_hooks.metrics.steering_math.rank1_output_edit`).
    ``gap_*`` report F's ratio, ``residual_gap_*`` that of I + F.
    """
    anatomy = anatomy_of(model)
    index = anatomy.layer_index(layer)
    part = anatomy.layers[index]
    direction = torch.as_tensor(direction)
    if direction.ndim != 1 or direction.shape[0] != anatomy.d_model:
        raise OptionError("direction", f"a tensor of shape {tuple(direction.shape)}",
                          f"a vector of length d_model={anatomy.d_model}")
    W_V, W_O = part.value_weights(), part.output_weights()
    if part.output is None or part.output.to_param is None:
        raise UnsupportedModelError(f"{anatomy.family}: the output projection of layer {index} "
                                    "cannot be written back; steering needs a writable W_O")
    edit = rank1_output_edit(W_V.to("cpu", torch.float64), W_O.to("cpu", torch.float64),
                             direction.to("cpu", torch.float64), alpha=alpha, gap=gap)
    param = part.output.param
    original = param.detach().clone()
    new_w = W_O.to("cpu", torch.float64) + edit.delta_W_O
    with torch.no_grad():
        param.copy_(part.output.to_param(new_w).to(param.dtype).to(param.device))
    return Steering(layer=index, direction=direction.detach().clone(), alpha=edit.alpha,
                    reachable_fraction=edit.reachable_fraction,
                    lambda1_before=edit.lambda1_before, lambda1_after=edit.lambda1_after,
                    gap_before=edit.gap_before, gap_after=edit.gap_after,
                    residual_gap_before=edit.residual_gap_before,
                    residual_gap_after=edit.residual_gap_after, _param=param,
                    _original=original)
