"""Operators and dense tools of the Jacobian view: the symmetric part, the Schur ablation.

    >>> from spectral_hooks.linalg import DenseOperator
    >>> A = torch.tensor([[1.0, 2.0], [0.0, 3.0]], dtype=torch.float64)
    >>> symmetric_part(DenseOperator(A)).to_dense()
    tensor([[1., 1.],
            [1., 3.]], dtype=torch.float64)
"""

from __future__ import annotations

import warnings
from typing import Union

import torch
from torch import Tensor

from spectral_hooks.linalg import LinearOperator

from ..checks import check_type
from ..errors import OptionError, OptionTypeError

__all__ = ["symmetric_part", "schur_diagonal", "SCHUR_MAX_D"]

SCHUR_MAX_D = 2048  # dense-mode size limit of the Schur ablation


def symmetric_part(J: LinearOperator) -> LinearOperator:
    """(J + J^T) / 2 as a matrix-free operator (the Hermitian part J + J^H for complex J).

    >>> from spectral_hooks.linalg import DenseOperator
    >>> A = torch.tensor([[1.0, 2.0], [0.0, 3.0]], dtype=torch.float64)
    >>> symmetric_part(DenseOperator(A)).to_dense()
    tensor([[1., 1.],
            [1., 3.]], dtype=torch.float64)

    Each application costs one matvec and one rmatvec of J; the result is its own adjoint.
    """
    check_type("J", J, LinearOperator, "a LinearOperator", hint="symmetric_part")
    if J.shape[0] != J.shape[1]:
        raise ValueError(f"symmetric_part needs a square operator, got shape {J.shape}")
    J._need_adjoint()
    half = lambda X, f, g: 0.5 * (f(X) + g(X))  # noqa: E731
    sym = LinearOperator(
        J.shape, matvec=lambda x: half(x, J.matvec, J.rmatvec),
        rmatvec=lambda x: half(x, J.matvec, J.rmatvec),
        matmat=lambda X: half(X, J.matmat, J.rmatmat),
        rmatmat=lambda X: half(X, J.matmat, J.rmatmat),
        dtype=J.dtype, device=J.device, name=f"sym({J.name})", parts=(J,))
    # a chain sweep (linalg.ChainProducts) with J at the same position applies both in J's
    # calls (a one-layer ablation: one call fewer a sweep)
    sym.hermitian_part_of = J  # pyright: ignore[reportAttributeAccessIssue]
    return sym


def _check_dense_square(J: Tensor, what: str) -> Tensor:
    want = "a dense square floating tensor [d, d]"
    check_type("J", J, Tensor, want, hint=what)
    if J.ndim != 2 or J.shape[0] != J.shape[1]:
        raise OptionError("J", J, want, hint=f"{what}: not square")
    if not (J.is_floating_point() or J.is_complex()):
        raise OptionTypeError("J", J, want, hint=what)
    if J.shape[0] > SCHUR_MAX_D:
        raise ValueError(f"{what}: d = {J.shape[0]} exceeds the dense-mode size limit "
                         f"SCHUR_MAX_D = {SCHUR_MAX_D}")
    if not bool(torch.isfinite(J).all()):
        raise ValueError(f"{what}: J contains NaN or Inf")
    return J.to(torch.complex128 if J.is_complex() else torch.float64)


TIE_RTOL = 1e-12  # moduli within this relative distance are a tie in the canonical order


def canonical_order(lam: Tensor, indices: list[int] | None = None) -> list[int]:
    """Indices of ``lam`` in the canonical Schur order: descending modulus; moduli within
    TIE_RTOL (relative) tie, and ties go by descending real part, then descending imaginary
    part (so a conjugate pair is adjacent, + first).

    >>> canonical_order(torch.tensor([1j, -1.0 + 0j, 1.0 + 0j, -1j, 2.0 + 0j]))
    [4, 2, 0, 3, 1]
    """
    idx = list(range(lam.shape[0])) if indices is None else list(indices)
    idx.sort(key=lambda i: -float(lam[i].abs()))
    out: list[int] = []
    start = 0
    for end in range(1, len(idx) + 1):
        if end == len(idx) or float(lam[idx[start]].abs() - lam[idx[end]].abs()) > \
                TIE_RTOL * max(float(lam[idx[start]].abs()), 1e-300):
            group = idx[start:end]
            group.sort(key=lambda i: (-float(lam[i].real), -float(lam[i].imag)))
            out += group
            start = end
    return out


def schur_diagonal(J: Tensor, *, real: Union[bool, None] = None,
                   check_tol: float = 1e-6) -> Tensor:
    """The normal part of J: J = Q T Q^* -> Q diag(T) Q^* (same eigenvalues, departure 0).

    >>> J = torch.tensor([[1.0, 5.0], [0.0, 2.0]], dtype=torch.float64)
    >>> N = schur_diagonal(J)
    >>> torch.allclose(N @ N.T, N.T @ N), sorted(torch.linalg.eigvals(N).real.round().tolist())
    (True, [1.0, 2.0])

    No QR algorithm: for a diagonalisable J = V Lambda V^-1 with V = Q R (QR of the
    eigenvector matrix, eigenvalues by descending modulus), J = Q (R Lambda R^-1) Q^* and
    R Lambda R^-1 is upper triangular with diagonal Lambda, so Q is a complex Schur basis.
    The Schur form is taken in the canonical order of :func:`canonical_order` (the result
    depends on it: Q changes with the order of the diagonal).

    ``real=False`` (default for complex J) returns Q diag(Lambda) Q^*. For real J with
    complex eigenvalues that matrix is in general NOT real (its imaginary part vanishes only
    when each eigenvector pair v, conj(v) is orthogonal), so ``real=True`` (default for
    real J) uses the real analogue: Q from the QR of [Re v, Im v, ...] (pairs adjacent) is a
    real Schur basis (T = Q^T J Q block upper triangular with 1x1 and 2x2 diagonal blocks);
    each 2x2 block is replaced by the normal block [[a, s b], [-s b, a]] with the same
    eigenvalues a +- ib and the block's orientation s = sign(T_12 - T_21), and the
    off-diagonal blocks are dropped. The result is real, normal, with the eigenvalues of J.

    For (nearly) defective J the eigenvector basis is ill-conditioned; a RuntimeWarning is
    issued when the part of Q^* J Q below the (block) diagonal exceeds ``check_tol`` ||J||_F.
    Sizes above ``SCHUR_MAX_D`` raise ValueError.
    """
    J = _check_dense_square(J, "schur_diagonal")
    real = (not J.is_complex()) if real is None else bool(real)
    if real and J.is_complex():
        raise ValueError("schur_diagonal: real=True needs a real J")
    d = J.shape[0]
    lam, V = torch.linalg.eig(J)
    if not real:
        order = torch.tensor(canonical_order(lam), dtype=torch.long)
        lam, V = lam[order], V[:, order]
        Q = torch.linalg.qr(V).Q
        T = Q.mH @ J.to(Q.dtype) @ Q
        low = torch.tril(T, -1)
        N = (Q * lam) @ Q.mH
    else:
        # LAPACK returns real eigenvalues with Im == 0 exactly and conjugate pairs adjacent
        reps = canonical_order(lam, [i for i in range(d) if lam[i].imag >= 0])
        cols, blocks = [], []
        for i in reps:
            if lam[i].imag == 0:
                cols.append(V[:, i].real)
                blocks.append((float(lam[i].real),))
            else:
                cols += [V[:, i].real, V[:, i].imag]
                blocks.append((float(lam[i].real), float(lam[i].imag)))
        Q = torch.linalg.qr(torch.stack(cols, dim=1)).Q
        T = Q.T @ J @ Q
        D = torch.zeros(d, d, dtype=torch.float64)
        low = torch.tril(T, -1)
        j = 0
        for blk in blocks:
            if len(blk) == 1:
                D[j, j] = blk[0]
                j += 1
                continue
            a, b = blk
            s = 1.0 if float(T[j, j + 1] - T[j + 1, j]) >= 0 else -1.0
            D[j, j] = D[j + 1, j + 1] = a
            D[j, j + 1], D[j + 1, j] = s * b, -s * b
            low[j + 1, j] = 0.0  # inside the 2x2 block
            j += 2
        N = Q @ D @ Q.T
    jn = float(torch.linalg.matrix_norm(J))
    if float(torch.linalg.matrix_norm(low)) > check_tol * max(jn, 1e-300):
        warnings.warn(f"schur_diagonal: eigenvector basis is ill-conditioned (J nearly "
                      f"defective?); Q^* J Q is triangular only to "
                      f"{float(torch.linalg.matrix_norm(low)) / max(jn, 1e-300):.1e}",
                      RuntimeWarning, stacklevel=2)
    return N
