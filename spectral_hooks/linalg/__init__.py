"""Model-agnostic numerical linear algebra over matrix-free operators (pure torch).

Example::

    >>> import torch
    >>> from spectral_hooks.linalg import DenseOperator, eigs, svds, hutchinson_trace
    >>> A = torch.randn(300, 300, dtype=torch.float64)
    >>> eigs(DenseOperator(A), 8).values.shape[-1] >= 8
    True
"""

from .chains import ChainProducts
from .estimators import (
                         column_norms_sq,
                         diagonal,
                         frobenius_sq,
                         hutchinson_trace,
                         hutchpp_trace,
                         trace_of_square,
)
from .krylov import eigs
from .lowrank import LowRankOperator, lowrank_eig, merge_shared_factors
from .operators import DenseOperator, IdentityOperator, LinearOperator, aslinearoperator
from .protocols import BatchGroup, BatchMember, Operator
from .quadrature import gram_quadrature, lanczos_quadrature
from .ranks import effective_rank, participation_ratio, stable_rank, surviving
from .results import EigResult, Estimate, SvdResult
from .svd import svds

__all__ = [
    "LinearOperator", "DenseOperator", "IdentityOperator", "aslinearoperator", "ChainProducts",
    "LowRankOperator", "lowrank_eig", "merge_shared_factors",
    "Operator", "BatchGroup", "BatchMember",
    "eigs", "svds", "EigResult", "SvdResult", "Estimate",
    "hutchinson_trace", "hutchpp_trace", "frobenius_sq", "trace_of_square", "diagonal",
    "column_norms_sq", "lanczos_quadrature", "gram_quadrature",
    "effective_rank", "participation_ratio", "stable_rank", "surviving",
]
