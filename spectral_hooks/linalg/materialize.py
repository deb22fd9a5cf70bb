"""When ``eigs(..., materialize="auto")`` materialises an operator instead of iterating on it
(issue 24). eigs is matrix-free by default (DESIGN); this is the opt-in cost rule.

Example (internal; eigs calls it)::

    >>> import torch
    >>> from spectral_hooks.linalg import DenseOperator
    >>> batch = OpBatch(DenseOperator(torch.eye(300, dtype=torch.float64)), what="eigs")
    >>> pays(batch, m=48)  # no batched-product hint
    False

A batched-JVP operator (one with a ``block_size`` hint) applies a block of columns for a
fraction of as many single columns on the CPU: the block's weight products run as GEMMs at
the core's rate, a single column's as GEMVs bound by reading the weights. Measured (float64
operator, one thread, 128 tokens), per column in a block of WIDTH = 128 against one column
alone: 0.11 on a GPT-2-small block (3.7 ms a column alone), 0.094 on a Llama d=1024 block
(7.4 ms). Krylov needs a few hundred single-column products (349 and 278 there, k = 16);
materialising needs n columns in n / WIDTH products and leaves a dense matrix on which the same
iteration runs at ~0.1 ms a product: 0.45 s against 1.5 s (GPT-2), 0.84 s against 1.96 s
(Llama), same eigenvalues to tol.

So with "auto", on the CPU, for operators that all carry a hint, n <= DENSE_MAX and the
default (device-aware) block size, eigs materialises when the n columns, at COLUMN_COST (0.12)
of a single column each, cost less than a Krylov run is taken to need: KRYLOV_CYCLES (2) cycles of
ncv single columns, and at least KRYLOV_MIN (150). That is half the fewest products a run
took on the block Jacobians above: 324-395 for k = 1-2, 276-530 for k = 4-16 (their top
spectra are clustered near 1: benchmarks/results/materialize_cost.md, where materialising was
2.4-4.3x faster at every k). So n < 1250, or n < 16.7 ncv where that is larger (up to 1600
for k = 16). A fixed rule rather than a timing taken at each call: the same call takes the
same path, with the same n_matvecs and values, on every run (both paths meet tol; they
differ within it).
The choice only changes the cost: both paths run the same iteration, and every returned pair
is checked with fresh products of the operator itself. ``materialize=`` True / False
forces either path. False, matrix-free, is eigs' default: it applies the operator to a few
hundred columns, as ARPACK does, where materialising takes n, and its cost does not rest on a
CPU's GEMM/GEMV ratio. ``benchmarks/materialize_cost.py`` measures COLUMN_COST and both paths.
Not measured on an accelerator yet (there "auto" keeps block Krylov with the hint; no GPU was
available to measure the dense alternative).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, List, Optional

import torch
from torch import Tensor

from ..errors import OptionError
from .batch import OpBatch
from .dense import DENSE_MAX, matrices
from .eigs_parts import below_precision
from .results import EigState, SvdResult
from .schur_restart import fresh_residuals

if TYPE_CHECKING:
    from .operators import LinearOperator

logger: logging.Logger = logging.getLogger(__name__)

#: columns per operator application when materialising a batched operator (a batched JVP
#: runs near the core's GEMM rate at 128 columns: 0.094-0.122 of a column alone, against
#: 0.13-0.18 at 32-64; benchmarks/results/materialize_cost.md)
WIDTH = 128
#: the cost of a column in a WIDTH block of a batched operator on the CPU, in single-column
#: applications (measured 0.094-0.122; module doc)
COLUMN_COST = 0.12
#: materialise when the n columns cost less than this many Krylov cycles of ncv columns,
KRYLOV_CYCLES = 2
#: or than this many single columns (module doc)
KRYLOV_MIN = 150


def materialised(batch: OpBatch, given: Optional[Tensor] = None) -> OpBatch:
    """The operators' matrices, WIDTH identity columns an application (or ``given``: formed by
    the caller, shape [*batch_shape, m, n]), as a dense batch named after them."""
    if given is None:
        A = matrices(batch, [True] * batch.B, WIDTH)
    else:
        want = (*batch.batch_shape, *batch.shape)
        if tuple(given.shape) != want or given.is_complex() and not batch.is_complex:
            raise OptionError("materialize", f"a {given.dtype} tensor of shape "
                              f"{tuple(given.shape)}", f"the operators' matrices, shape "
                              f"{list(want)}" + ("" if batch.is_complex else ", real"))
        A = given.to(batch.wdtype)
    dense = OpBatch(A.reshape(*batch.batch_shape, *batch.shape), what=batch.what)
    dense.names = [f"{name} (materialised)" for name in batch.names]
    return dense


def matrix_of(op: "LinearOperator") -> Tensor:
    """The matrix of a square ``op`` [n, n] in its working precision (float64 / complex128), formed by
    applying it to the identity WIDTH columns at a time (n columns, counted in its
    ``n_matvecs``).

    >>> from spectral_hooks.linalg import DenseOperator
    >>> A = torch.arange(9.0).reshape(3, 3)
    >>> bool((matrix_of(DenseOperator(A)) == A).all())
    True
    """
    return materialised(OpBatch(op, what="matrix_of")).dense[0]  # pyright: ignore[reportOptionalSubscript]


def svd_residuals(op: "LinearOperator", res: SvdResult) -> Tensor:
    """||A v_i - s_i u_i|| / s_1 for each triplet of ``res``, with fresh products of ``op``
    itself (one application of the k right vectors; a batched operator's zero-padded to WIDTH,
    the width its matrix was formed at, whose traced product exists already). For triplets
    that svds found on op's matrix (``matrix_of``), where both of svds' residuals met its
    tol: they meet tol here where the matrix is the operator on the triplets' vectors.

    >>> from spectral_hooks.linalg import DenseOperator, svds
    >>> A = torch.randn(30, 20, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> bool((svd_residuals(DenseOperator(A), svds(A, 3, tol=1e-10)) <= 1e-10).all())
    True
    """
    if res.U is None or res.Vh is None:
        raise OptionError("res", "an SvdResult without vectors", "svds(..., return_vectors=True)")
    U, S, V = res.U, res.S, res.Vh.mH
    k, n = V.shape[1], op.shape[1]
    width = max(k, min(WIDTH, n)) if (op.block_size or 1) > 1 else k
    X = torch.zeros(n, width, dtype=op.dtype, device=V.device)
    X[:, :k] = V.to(op.dtype)
    AV = op.matmat(X)[:, :k].to(U.dtype)
    return torch.linalg.vector_norm(AV - U * S.to(U.dtype), dim=0) / S[0].clamp(min=1e-300)


def pays(batch: OpBatch, *, m: int) -> bool:
    """Is materialising cheaper than iterating with ``m`` columns a cycle (module doc)?"""
    n = batch.shape[0]
    if batch.device.type != "cpu" or n > DENSE_MAX or not _batched(batch):
        return False
    krylov = max(KRYLOV_CYCLES * m, KRYLOV_MIN)
    cheaper = n * COLUMN_COST < krylov
    logger.debug("eigs: materialising %d columns costs ~%.0f single ones, a Krylov run at "
                 "least %d: %s", n, n * COLUMN_COST, krylov, "materialise" if cheaper else
                 "Krylov")
    return cheaper


def _batched(batch: OpBatch) -> bool:
    """Do all the operators carry a batched-product hint (``block_size`` > 1)?"""
    return batch.ops is not None and all((o.block_size or 1) > 1 for o in batch.ops)


def recheck(batch: OpBatch, out: List[EigState], tol: float) -> List[str]:
    """Check every pair found on the materialised matrices with fresh products of the
    operators themselves (st["resid"] becomes theirs; converged needs both); returns why each
    member that passed on its matrix fails here (an operator not linear to working
    precision: its matrix is not the operator)."""
    members = list(range(batch.B))
    # batched-JVP operators have just built their WIDTH-column product: zero-padding to it
    # reuses that graph instead of tracing and checking a narrower one (GPT-2-small: ~1 s
    # once, ~15 ms a layer)
    width = min(WIDTH, batch.shape[0]) if _batched(batch) else 0
    fresh_residuals(batch, members, dict(enumerate(out)), not batch.is_complex, width=width)
    why = []
    for b in members:
        st = out[b]
        ok = bool((st["resid"] <= tol).all())
        if st["converged"] and not ok:
            cause = (below_precision(batch.own_dtype(b), tol)
                     or "the operator is not linear to working precision")
            why.append(f"{batch.names[b]}: max residual {float(st['resid'].max()):.2e} > "
                       f"tol={tol:g} with fresh products of the operator, though its "
                       f"materialised matrix met tol ({cause})")
        st["converged"] = st["converged"] and ok
    return why
