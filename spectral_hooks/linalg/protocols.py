"""What the solvers need from an operator, stated as ``typing.Protocol`` s.

Example::

    >>> import torch
    >>> from spectral_hooks.linalg import DenseOperator
    >>> isinstance(DenseOperator(torch.eye(3)), Operator)
    True

:class:`Operator` is what :func:`~spectral_hooks.linalg.eigs`, :func:`~spectral_hooks.linalg.svds`
and the estimators call (every :class:`~spectral_hooks.linalg.LinearOperator` satisfies it).
:class:`BatchGroup` is the optional lockstep protocol: operators that are slots of one shared
engine (``linearize.group``'s layer groups) carry a :class:`BatchMember` view, and the solvers apply every
active slot of a group with one ``matmat_all`` call per step (``linalg/batch.py``).
"""

from __future__ import annotations

from typing import Optional, Protocol, Tuple, runtime_checkable

import torch
from torch import Tensor

__all__ = ["Operator", "BatchGroup", "BatchMember"]


@runtime_checkable
class Operator(Protocol):
    """A linear map C^n -> C^m applied by functions (the adjoint is optional).

    ``rmatvec`` / ``rmatmat`` raise ``NotImplementedError`` where the adjoint is unknown (svds
    needs it, eigs does not). ``block_size``: columns per ``matmat`` that cost about one
    application (the block width eigs uses on an accelerator), or None. ``n_matvecs``: applications so
    far (a matmat of k columns counts k).
    """

    shape: Tuple[int, int]
    dtype: torch.dtype
    device: torch.device
    block_size: Optional[int]
    n_matvecs: int

    def matvec(self, x: Tensor) -> Tensor:
        """A x for x of shape [n]; returns [m]."""
        ...

    def matmat(self, X: Tensor) -> Tensor:
        """A X for X of shape [n, k]; returns [m, k]."""
        ...

    def rmatvec(self, y: Tensor) -> Tensor:
        """A^H y for y of shape [m]; returns [n]."""
        ...

    def rmatmat(self, Y: Tensor) -> Tensor:
        """A^H Y for Y of shape [m, k]; returns [n, k]."""
        ...


@runtime_checkable
class BatchGroup(Protocol):
    """``size`` operators of one shape applied together: slot i of ``matmat_all(X)`` is
    A_i X[i] (X: [size, n, c] -> [size, m, c]); ``rmatmat_all`` applies A_i^H likewise.
    Slots not in use may hold anything (zeros are passed); their results are ignored."""

    size: int
    dtype: torch.dtype

    def matmat_all(self, X: Tensor) -> Tensor:
        """X [size, n, c] -> [size, m, c]: slot i is A_i X[i]."""
        ...

    def rmatmat_all(self, X: Tensor) -> Tensor:
        """X [size, m, c] -> [size, n, c]: slot i is A_i^H X[i]."""
        ...


@runtime_checkable
class BatchMember(Protocol):
    """An operator that is slot ``batch_index`` of the shared engine ``batch_group``."""

    batch_group: BatchGroup
    batch_index: int
