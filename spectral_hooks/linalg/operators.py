"""Matrix-free linear operators.

Example::

    >>> import torch
    >>> from spectral_hooks.linalg import LinearOperator, DenseOperator
    >>> M = torch.randn(5, 3, dtype=torch.float64)
    >>> A = LinearOperator((5, 3), matvec=lambda x: M @ x, rmatvec=lambda y: M.T @ y,
    ...                    dtype=torch.float64, device="cpu", name="M")
    >>> torch.allclose((A.T @ A).to_dense(), M.T @ M)
    True
    >>> A.n_matvecs  # to_dense applied A.T @ A to 3 columns: 3 matvecs + 3 rmatvecs
    6
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, Sequence, Union, overload

import torch
from torch import Tensor

from ..errors import OptionError, OptionTypeError

__all__ = ["LinearOperator", "DenseOperator", "IdentityOperator", "aslinearoperator"]

_Fn = Optional[Callable[[Tensor], Tensor]]


class LinearOperator:
    """A linear map from C^n (or R^n) to C^m given by functions.

    ``matvec(x[n]) -> [m]`` is required; ``rmatvec(y[m]) -> [n]`` applies the adjoint A^H.
    ``matmat`` / ``rmatmat`` (``[n, k] -> [m, k]``) are optional: without them the operator
    applies the vector function column by column, or with ``torch.vmap`` when
    ``vectorized=True``. ``n_matvecs`` counts applications of A or A^H (a matmat of k
    columns counts k); composite operators count their own applications.
    ``block_size``: a hint that one ``matmat`` of about this many columns is much cheaper than
    as many ``matvec`` calls (e.g. batched JVPs); :func:`~spectral_hooks.linalg.eigs` then runs
    block Krylov of this width on an accelerator (on the CPU one column per step: fewest
    applications; with ``materialize="auto"`` it materialises the operator where its n
    columns cost less than a Krylov run). Composites inherit the largest hint of their parts.
    """

    device: torch.device
    name: str
    n_matvecs: int

    def __init__(
        self,
        shape: Sequence[int],
        *,
        matvec: Callable[[Tensor], Tensor],
        rmatvec: _Fn = None,
        matmat: _Fn = None,
        rmatmat: _Fn = None,
        dtype: torch.dtype,
        device: Union[str, torch.device],
        vectorized: bool = False,
        name: Optional[str] = None,
        block_size: Optional[int] = None,
        parts: Sequence["LinearOperator"] = (),
    ) -> None:
        shape = tuple(int(s) for s in shape)
        if len(shape) != 2 or min(shape) < 1:
            raise ValueError(f"LinearOperator shape must be (m, n) with m, n >= 1, got {shape}")
        if not callable(matvec):
            raise TypeError("LinearOperator needs a callable matvec")
        if not isinstance(dtype, torch.dtype) or not (dtype.is_floating_point or
                                                      dtype.is_complex):
            raise TypeError(f"dtype must be a floating or complex torch.dtype, got {dtype!r} "
                            "(the solvers' Krylov vectors are in this precision)")
        self.shape = shape
        self.dtype = dtype
        self.device = torch.device(device)
        self.name = name or "LinearOperator"
        self.n_matvecs = 0
        #: the operators this one applies (a composite's factors or terms): they are told
        #: what it is told about finite checks (:attr:`caller_checks_finite`)
        self.parts: tuple[LinearOperator, ...] = tuple(parts)
        self._caller_checks_finite = False
        self._matvec, self._rmatvec = matvec, rmatvec
        self._matmat, self._rmatmat = matmat, rmatmat
        self._vectorized = vectorized
        if block_size is not None and (isinstance(block_size, bool) or
                                       not isinstance(block_size, int) or block_size < 1):
            raise OptionError("block_size", block_size, "a positive int or None")
        self.block_size = block_size

    def __repr__(self) -> str:
        return f"<{self.name} shape={self.shape} dtype={self.dtype} device={self.device}>"

    @property
    def caller_checks_finite(self) -> bool:
        """True while a caller that tests every product for NaN / Inf itself (the solvers'
        ``OpBatch``, on the device, read once per Krylov expansion) applies this operator: an
        operator whose own apply also tests its output (one host sync each) may skip it.
        Setting it sets it on :attr:`parts` too: a NaN or Inf inside a composite reaches its
        product (0 x Inf is NaN), and a product without one is right whatever was skipped."""
        return self._caller_checks_finite

    @caller_checks_finite.setter
    def caller_checks_finite(self, value: bool) -> None:
        self._caller_checks_finite = value
        for part in self.parts:
            part.caller_checks_finite = value

    @contextmanager
    def checked_by_caller(self) -> Iterator["LinearOperator"]:
        """:attr:`caller_checks_finite` on while the block runs (a caller that tests every
        product of this operator for NaN / Inf itself), off again after it."""
        self.caller_checks_finite = True
        try:
            yield self
        finally:
            self.caller_checks_finite = False

    def nonfinite_error(self, adjoint: bool = False) -> Optional[FloatingPointError]:
        """The error a caller raises when a product of this operator (of its adjoint) holds
        NaN or Inf, or None for the caller's generic one. Operators that know where they come
        from (a block Jacobian: layer, sample, token) override it to say so. A composite finds
        the part at fault: the first whose product of a vector of ones is not finite (a linear
        map's NaN / Inf comes from its coefficients), and gives that part's error."""
        for part in self.parts:
            err = part._fault()
            if err is not None:
                return err
        return None

    def _fault(self) -> Optional[FloatingPointError]:
        """This operator's error if its product of a vector of ones is not finite (applied
        with its own checks on, which may raise it), else None."""
        self.caller_checks_finite = False
        n = self.shape[1]
        try:
            y = self.matvec(torch.ones(n, dtype=self.dtype, device=self.device) / n ** 0.5)
        except FloatingPointError as err:
            return err
        if bool(torch.isfinite(y).all()):
            return None
        return self.nonfinite_error() or FloatingPointError(f"{self!r} returned NaN or Inf")

    # -- checks -------------------------------------------------------------------------
    def _check_in(self, x: Tensor, n: int, what: str, ndim: int) -> Tensor:
        if not isinstance(x, Tensor):
            raise TypeError(f"{self!r}.{what} expects a torch.Tensor, got {type(x).__name__}")
        if x.ndim != ndim or x.shape[0] != n:
            want = f"[{n}]" if ndim == 1 else f"[{n}, k]"
            raise ValueError(
                f"{self!r}.{what}: operand shape {tuple(x.shape)} does not match operator "
                f"shape {self.shape} (expected {want})"
            )
        return x

    def _check_out(self, y: Tensor, shape: tuple, what: str) -> Tensor:
        if not isinstance(y, Tensor):
            raise TypeError(f"{self!r}.{what} returned {type(y).__name__}, not a torch.Tensor")
        if tuple(y.shape) != shape:
            raise ValueError(
                f"{self!r}.{what} returned shape {tuple(y.shape)}, expected {shape}"
            )
        if y.is_complex() and not self.dtype.is_complex:
            raise TypeError(f"{self!r}.{what} returned a complex tensor for a real operand: "
                            "declare the operator's dtype complex (e.g. torch.complex128)")
        return y

    def _real_on_complex(self, apply: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
        """A real operator on a complex operand: A Re x + i A Im x (two applications)."""
        return torch.complex(apply(x.real.contiguous()), apply(x.imag.contiguous()))

    def _splits(self, x: Tensor) -> bool:
        return x.is_complex() and not self.dtype.is_complex

    @property
    def has_adjoint(self) -> bool:
        """Whether A^H can be applied (an ``rmatvec`` or ``rmatmat`` was given)."""
        return self._rmatvec is not None or self._rmatmat is not None

    def _need_adjoint(self) -> None:
        if not self.has_adjoint:
            raise NotImplementedError(
                f"{self!r} has no rmatvec/rmatmat, but the adjoint A^H is needed here"
            )

    # -- application --------------------------------------------------------------------
    def matvec(self, x: Tensor) -> Tensor:
        """A x for x of shape [n]; returns [m]."""
        m, n = self.shape
        self._check_in(x, n, "matvec", 1)
        if self._splits(x):
            return self._real_on_complex(self.matvec, x)
        self.n_matvecs += 1
        return self._check_out(self._matvec(x), (m,), "matvec")

    def rmatvec(self, y: Tensor) -> Tensor:
        """A^H y for y of shape [m]; returns [n] (``NotImplementedError`` without an adjoint)."""
        m, n = self.shape
        self._check_in(y, m, "rmatvec", 1)
        self._need_adjoint()
        if self._splits(y):
            return self._real_on_complex(self.rmatvec, y)
        self.n_matvecs += 1
        if self._rmatvec is None:
            return self._check_out(self._rmatmat(y[:, None])[:, 0], (n,), "rmatvec")  # pyright: ignore[reportOptionalCall]
        return self._check_out(self._rmatvec(y), (n,), "rmatvec")

    def _columns(self, fn: Callable[[Tensor], Tensor], X: Tensor) -> Tensor:
        if self._vectorized:
            return torch.vmap(fn, in_dims=1, out_dims=1)(X)
        columns = [fn(X[:, j]) for j in range(X.shape[1])]
        for y in columns[:1]:
            self._check_out(y, (y.shape[0] if isinstance(y, Tensor) else 0,), "matvec")
        return torch.stack(columns, dim=1)

    def matmat(self, X: Tensor) -> Tensor:
        """A X for X of shape [n, k]; returns [m, k] (k applications)."""
        m, n = self.shape
        self._check_in(X, n, "matmat", 2)
        if self._splits(X):
            return self._real_on_complex(self.matmat, X)
        k = X.shape[1]
        self.n_matvecs += k
        if self._matmat is not None:
            return self._check_out(self._matmat(X), (m, k), "matmat")
        return self._check_out(self._columns(self._matvec, X), (m, k), "matmat")

    def rmatmat(self, Y: Tensor) -> Tensor:
        """A^H Y for Y of shape [m, k]; returns [n, k] (``NotImplementedError`` without an
        adjoint).
        """
        m, n = self.shape
        self._check_in(Y, m, "rmatmat", 2)
        self._need_adjoint()
        if self._splits(Y):
            return self._real_on_complex(self.rmatmat, Y)
        k = Y.shape[1]
        self.n_matvecs += k
        if self._rmatmat is not None:
            return self._check_out(self._rmatmat(Y), (n, k), "rmatmat")
        return self._check_out(self._columns(self._rmatvec, Y), (n, k), "rmatmat")  # pyright: ignore[reportArgumentType]

    def to_dense(self) -> Tensor:
        """The m x n matrix, by ``matmat`` on the identity (n matvecs)."""
        eye = torch.eye(self.shape[1], dtype=self.dtype, device=self.device)
        return self.matmat(eye)

    # -- algebra ------------------------------------------------------------------------
    @property
    def T(self) -> "LinearOperator":
        """The adjoint A^H (for real operators the transpose)."""
        return _Adjoint(self)

    @property
    def H(self) -> "LinearOperator":
        """The adjoint A^H as an operator (the same as ``T`` for a real operator)."""
        return self.T

    @overload
    def __matmul__(self, other: "LinearOperator") -> "LinearOperator": ...

    @overload
    def __matmul__(self, other: Tensor) -> Tensor: ...

    def __matmul__(self, other: "LinearOperator | Tensor") -> "LinearOperator | Tensor":
        if isinstance(other, LinearOperator):
            return _Product(self, other)
        if isinstance(other, Tensor):
            return self.matvec(other) if other.ndim == 1 else self.matmat(other)
        return NotImplemented

    def __add__(self, other: "LinearOperator") -> "LinearOperator":
        if isinstance(other, LinearOperator):
            return _Sum(self, other, 1.0)
        return NotImplemented

    def __sub__(self, other: "LinearOperator") -> "LinearOperator":
        if isinstance(other, LinearOperator):
            return _Sum(self, other, -1.0)
        return NotImplemented

    def __mul__(self, alpha: "float | complex | Tensor") -> "LinearOperator":
        if isinstance(alpha, (int, float, complex)) or (
            isinstance(alpha, Tensor) and alpha.ndim == 0
        ):
            return _Scaled(self, alpha)
        return NotImplemented

    __rmul__ = __mul__

    def __neg__(self) -> "LinearOperator":
        return _Scaled(self, -1.0)


def _result_dtype(a: LinearOperator, b: LinearOperator) -> torch.dtype:
    return torch.promote_types(a.dtype, b.dtype)


def block_hint(*ops: LinearOperator) -> Optional[int]:
    """The block-size hint of a composite of ``ops``: the widest of theirs, or None."""
    hints = [o.block_size for o in ops if o.block_size is not None]
    return max(hints) if hints else None


def _check_device(a: LinearOperator, b: LinearOperator, what: str) -> None:
    if a.device != b.device:
        raise ValueError(f"cannot {what} {a!r} and {b!r}: they live on different devices")


class _Adjoint(LinearOperator):
    def __init__(self, A: LinearOperator) -> None:
        A._need_adjoint()
        m, n = A.shape
        super().__init__(
            (n, m), matvec=A.rmatvec, rmatvec=A.matvec, matmat=A.rmatmat, rmatmat=A.matmat,
            dtype=A.dtype, device=A.device, name=f"({A.name})^H", block_size=A.block_size,
            parts=(A,),
        )
        self.base = A

    @property
    def T(self) -> LinearOperator:
        return self.base


class _Product(LinearOperator):
    def __init__(self, A: LinearOperator, B: LinearOperator) -> None:
        if A.shape[1] != B.shape[0]:
            raise ValueError(
                f"cannot compose {A!r} @ {B!r}: inner dimensions differ "
                f"(shapes {A.shape} and {B.shape})"
            )
        _check_device(A, B, "compose")
        has_adj = A.has_adjoint and B.has_adjoint
        super().__init__(
            (A.shape[0], B.shape[1]),
            matvec=lambda x: A.matvec(B.matvec(x)),
            matmat=lambda X: A.matmat(B.matmat(X)),
            rmatvec=(lambda y: B.rmatvec(A.rmatvec(y))) if has_adj else None,
            rmatmat=(lambda Y: B.rmatmat(A.rmatmat(Y))) if has_adj else None,
            dtype=_result_dtype(A, B), device=A.device, name=f"({A.name} @ {B.name})",
            block_size=block_hint(A, B), parts=(A, B),
        )


class _Sum(LinearOperator):
    def __init__(self, A: LinearOperator, B: LinearOperator, sign: float) -> None:
        if A.shape != B.shape:
            raise ValueError(f"cannot add {A!r} and {B!r}: shapes {A.shape} and {B.shape} differ")
        _check_device(A, B, "add")
        has_adj = A.has_adjoint and B.has_adjoint
        op = "+" if sign > 0 else "-"
        super().__init__(
            A.shape,
            matvec=lambda x: A.matvec(x) + sign * B.matvec(x),
            matmat=lambda X: A.matmat(X) + sign * B.matmat(X),
            rmatvec=(lambda y: A.rmatvec(y) + sign * B.rmatvec(y)) if has_adj else None,
            rmatmat=(lambda Y: A.rmatmat(Y) + sign * B.rmatmat(Y)) if has_adj else None,
            dtype=_result_dtype(A, B), device=A.device, name=f"({A.name} {op} {B.name})",
            block_size=block_hint(A, B), parts=(A, B),
        )


class _Scaled(LinearOperator):
    def __init__(self, A: LinearOperator, alpha) -> None:
        has_adj = A.has_adjoint
        calpha = (alpha.conjugate() if isinstance(alpha, complex)
                  else alpha.conj() if isinstance(alpha, Tensor) else alpha)
        dtype = A.dtype
        if isinstance(alpha, complex) or (isinstance(alpha, Tensor) and alpha.is_complex()):
            dtype = torch.promote_types(dtype, torch.complex64)
        super().__init__(
            A.shape,
            matvec=lambda x: alpha * A.matvec(x),
            matmat=lambda X: alpha * A.matmat(X),
            rmatvec=(lambda y: calpha * A.rmatvec(y)) if has_adj else None,
            rmatmat=(lambda Y: calpha * A.rmatmat(Y)) if has_adj else None,
            dtype=dtype, device=A.device, name=f"({alpha} * {A.name})",
            block_size=A.block_size, parts=(A,),
        )


class DenseOperator(LinearOperator):
    """A LinearOperator backed by an explicit [m, n] matrix.

    Example::

        >>> A = DenseOperator(torch.eye(3))
        >>> A @ torch.ones(3)
        tensor([1., 1., 1.])
    """

    n_matvecs: int  # (to_dense counts its columns too)

    def __init__(self, matrix: Tensor, *, name: Optional[str] = None) -> None:
        if not isinstance(matrix, Tensor):
            raise TypeError(f"DenseOperator expects a torch.Tensor, got {type(matrix).__name__}")
        if matrix.ndim != 2:
            raise ValueError(
                f"DenseOperator expects a 2-D matrix, got shape {tuple(matrix.shape)}"
            )
        if not (matrix.is_floating_point() or matrix.is_complex()):
            raise TypeError(f"DenseOperator expects a floating or complex matrix, got dtype "
                            f"{matrix.dtype} (an integer matrix would round every Krylov "
                            "vector to integers): convert it, e.g. matrix.double()")
        self.matrix = matrix
        Mh = matrix.mH
        super().__init__(
            tuple(matrix.shape),
            matvec=lambda x: matrix @ x, rmatvec=lambda y: Mh @ y,
            matmat=lambda X: matrix @ X, rmatmat=lambda Y: Mh @ Y,
            dtype=matrix.dtype, device=matrix.device, name=name or "DenseOperator",
        )

    def to_dense(self) -> Tensor:
        """A copy of the matrix (counted as one application per column)."""
        self.n_matvecs += self.shape[1]
        return self.matrix.clone()


class IdentityOperator(LinearOperator):
    """The n x n identity."""

    def __init__(self, n: int, dtype: torch.dtype = torch.float64,
                 device: Union[str, torch.device] = "cpu") -> None:
        ident = lambda x: x.clone()  # noqa: E731
        super().__init__(
            (n, n), matvec=ident, rmatvec=ident, matmat=ident, rmatmat=ident,
            dtype=dtype, device=device, name="Identity",
        )


def aslinearoperator(obj: Any) -> LinearOperator:
    """Return ``obj`` if it is a LinearOperator, wrap a 2-D tensor in a DenseOperator."""
    if isinstance(obj, LinearOperator):
        return obj
    if isinstance(obj, Tensor):
        return DenseOperator(obj)
    raise OptionTypeError("obj", obj, "a LinearOperator or a 2-D torch.Tensor")
