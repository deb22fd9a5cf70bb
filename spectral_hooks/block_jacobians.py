"""Block Jacobians at a probe's recorded inputs: the probe's ``jacobian`` methods.

    >>> J = probe.jacobian(3)                  # doctest: +SKIP
    >>> sh.eigs(J, 16).values                  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .anatomy import Anatomy
from .linearize import BlockJacobian, JacobianProduct
from .recording import Recording


class BlockJacobians:
    """Mixin: needs ``self.anatomy`` and ``self.recording``."""

    anatomy: Anatomy
    recording: Recording

    def jacobian(self, layer: int, *, position: int = -1, sample: int = 0,
                 kind: str = "token", dtype: torch.dtype = torch.float64,
                 **options: Any) -> BlockJacobian:
        """Block ``layer``'s Jacobian at its recorded input as a matrix-free LinearOperator
        (matvec = JVP, rmatvec = VJP). ``position=-1``: the last real token of ``sample``.
        ``options``: ``method``, ``single_query`` (see linearize.block_jacobian)."""
        from .linearize import block_jacobian

        return block_jacobian(self.anatomy, self.recording, layer, sample=sample,
                              position=position, kind=kind, dtype=dtype, **options)

    def jacobian_product(self, first: int, last: int, *, position: int = -1, sample: int = 0,
                         dtype: torch.dtype = torch.float64, **options: Any) -> JacobianProduct:
        """P = J_last ... J_first at one token position (exact for causal models)."""
        from .linearize import jacobian_product

        return jacobian_product(self.anatomy, self.recording, first, last, sample=sample,
                                position=position, dtype=dtype, **options)

    def dense_jacobian(self, layer: int, *, position: int = -1, sample: int = 0,
                       kind: str = "token", dtype: torch.dtype = torch.float64) -> Tensor:
        """The dense Jacobian by forward-mode AD (small models; a float64 Tensor)."""
        from .linearize import dense_block_jacobian

        return dense_block_jacobian(self.anatomy, self.recording, layer, sample=sample,
                                    position=position, kind=kind, dtype=dtype)

