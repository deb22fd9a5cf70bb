"""A batch of operators applied in lockstep (dense [..., m, n] tensors or LinearOperators).

Internal helper shared by :mod:`krylov` and :mod:`svd`: it converts inputs to a working
precision (float64 / complex128), counts applications per member, and turns NaN/Inf in an
operator's output into a FloatingPointError that names the operator.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from ..errors import OptionError, OptionTypeError
from .operators import LinearOperator
from .protocols import BatchGroup, BatchMember


class OpBatch:
    """B operators of one shape (m, n), applied to [B, n, c] blocks in working precision."""

    batch_shape: Tuple[int, ...]  # the leading dimensions of a dense input; (B,) for a list
    shape: Tuple[int, ...]        # (m, n)
    is_complex: bool
    device: torch.device
    wdtype: torch.dtype           # the working precision: float64 or complex128
    B: int
    names: List[str]              # each operator's name in messages
    counts: List[int]             # applications of each operator so far

    def __init__(self, op: Union[Tensor, LinearOperator, Sequence[LinearOperator]], *,
                 what: str) -> None:
        self.dense: Optional[Tensor] = None
        self.ops: Optional[List[LinearOperator]] = None
        if isinstance(op, Tensor):
            if op.ndim < 2:
                raise OptionError("op", f"a tensor of shape {tuple(op.shape)}",
                                  f"{what}: a dense operator of shape [..., m, n]")
            if not (op.is_floating_point() or op.is_complex()):
                raise OptionError("op", f"a tensor of dtype {op.dtype}",
                                  f"{what}: a floating or complex operator")
            if op.is_meta:
                raise OptionError("op", f"a tensor on device {op.device}",
                                  f"{what}: a tensor holding data")
            if op.numel() == 0:
                raise OptionError("op", f"an empty tensor of shape {tuple(op.shape)}",
                                  f"{what}: at least one operator of at least 1 x 1")
            self.batch_shape = tuple(op.shape[:-2])
            self.shape = tuple(op.shape[-2:])
            self.is_complex = op.is_complex()
            self.device = op.device
            self.wdtype = torch.complex128 if self.is_complex else torch.float64
            # the solvers are not differentiable: a tensor that requires grad is read as data
            self.dense = op.detach().reshape(-1, *self.shape).to(self.wdtype)
            self.B = self.dense.shape[0]
            self.names = [f"dense matrix #{b}" for b in range(self.B)]
        elif isinstance(op, LinearOperator) or (
            isinstance(op, Sequence) and len(op) > 0
            and all(isinstance(o, LinearOperator) for o in op)
        ):
            single = isinstance(op, LinearOperator)
            self.ops = [op] if single else list(op)
            self.batch_shape = () if single else (len(self.ops),)
            shapes = {o.shape for o in self.ops}
            if len(shapes) != 1:
                raise ValueError(f"{what}: operators in a list must share one shape, got "
                                 f"{sorted(shapes)}")
            devices = {o.device for o in self.ops}
            if len(devices) != 1:
                raise ValueError(f"{what}: operators in a list must share one device, got "
                                 f"{sorted(str(d) for d in devices)}")
            self.shape = self.ops[0].shape
            self.device = self.ops[0].device
            self.is_complex = any(o.dtype.is_complex for o in self.ops)
            self.wdtype = torch.complex128 if self.is_complex else torch.float64
            self.B = len(self.ops)
            self.names = [repr(o) for o in self.ops]
        else:
            raise OptionTypeError(
                "op", op, f"{what}: a LinearOperator, a list of LinearOperators or a dense "
                "tensor [..., m, n]")
        if self.B == 0:
            raise ValueError(f"{what}: empty batch")
        self.counts = [0] * self.B
        self.what = what

    def member(self, b: int) -> "OpBatch":
        """Member b on its own (under its name in this batch)."""
        one = OpBatch(self.dense[b] if self.dense is not None else self.ops[b],  # pyright: ignore[reportOptionalSubscript]
                      what=self.what)
        one.names = [self.names[b]]
        return one

    def grouped(self) -> bool:
        """Is any operator a member of a :class:`BatchGroup` (one call applies them all)?"""
        return self.ops is not None and any(_group_of(o) is not None for o in self.ops)

    def check_finite(self, Y: Tensor, mask: Sequence[bool], adjoint: bool = False) -> None:
        """Raise :meth:`nonfinite` for the first masked-in member with NaN / Inf in Y."""
        if bool(torch.isfinite(Y).all()):  # one reduction, one sync: the usual case
            return
        ok = torch.isfinite(Y.reshape(Y.shape[0], -1)).all(dim=1).tolist()
        for b, (m, good) in enumerate(zip(mask, ok)):
            if m and not good:
                raise self.nonfinite(b, adjoint)

    def nonfinite(self, b: int, adjoint: bool = False) -> FloatingPointError:
        """The error for member b's NaN / Inf product: the operator's own
        (``LinearOperator.nonfinite_error``: e.g. a block Jacobian naming its layer and token)
        where it has one, else a FloatingPointError naming the operator."""
        if self.ops is not None:
            err = self.ops[b].nonfinite_error(adjoint)
            if err is not None:
                return err
        return FloatingPointError(f"{self.what}: operator {self.names[b]} returned NaN or Inf")

    def own_dtype(self, b: int) -> torch.dtype:
        """Member b's own dtype (the working one for a dense tensor, which is converted)."""
        return self.ops[b].dtype if self.ops is not None else self.wdtype

    def apply(self, X: Tensor, mask: Sequence[bool], *, adjoint: bool = False,
              check: bool = True) -> Tensor:
        """A_b X_b (or A_b^H X_b) for members with mask[b]; other rows are zero.

        ``check=False`` skips the NaN / Inf test (a caller that reduces the result anyway
        tests that and calls :meth:`check_finite` itself)."""
        c = X.shape[-1]
        if self.dense is not None and X.is_complex() and not self.is_complex:
            # real matrices on a complex block: both parts in one product of 2c columns
            Xr = torch.view_as_real(X.contiguous()).reshape(self.B, X.shape[1], 2 * c)
            Yr = self.apply(Xr, mask, adjoint=adjoint, check=check)  # (counts 2c)
            return torch.view_as_complex(Yr.reshape(self.B, Yr.shape[1], c, 2).contiguous())
        if self.dense is not None:
            M = self.dense.mH if adjoint else self.dense
            if c <= 8 or not all(mask):
                # a few columns: per-member gemv/gemm is ~2x faster than batched matmul on
                # CPU (measured, 6 x 768^2, one thread) and skips masked-out members; a
                # strided column (a slice of a Krylov basis) is copied first: gemv on a
                # contiguous vector is ~1.7x faster (measured, 768^2, one thread)
                X = X.contiguous()
                Y = (torch.empty if all(mask) else torch.zeros)(
                    self.B, M.shape[-2], c, dtype=X.dtype, device=X.device)
                for b in range(self.B):
                    if mask[b]:
                        torch.matmul(M[b], X[b], out=Y[b])
            else:
                Y = torch.matmul(M, X)
        elif self.B == 1 and mask[0]:
            Y = self._one(self.ops[0], X[0], adjoint).unsqueeze(0)  # one operator: no copies  # pyright: ignore[reportOptionalSubscript]
            self.counts[0] += c if X.is_complex() and not self.ops[0].dtype.is_complex else 0  # pyright: ignore[reportOptionalSubscript]
        else:
            rows = self.shape[1] if adjoint else self.shape[0]
            Y = torch.zeros(self.B, rows, c, device=X.device,
                            dtype=torch.complex128 if X.is_complex() else self.wdtype)
            grouped = self._apply_groups(X, Y, mask, adjoint)
            for b, o in enumerate(self.ops):  # pyright: ignore[reportArgumentType]
                if not mask[b] or b in grouped:
                    continue
                Y[b] = self._one(o, X[b], adjoint)
                if X.is_complex() and not o.dtype.is_complex:
                    self.counts[b] += c  # real and imaginary parts: two applications
        for b in range(self.B):
            if mask[b]:
                self.counts[b] += c
        if check:
            self.check_finite(Y, mask, adjoint)
        return Y

    def _apply_groups(self, X: Tensor, Y: Tensor, mask: Sequence[bool], adjoint: bool) -> set:
        """Members whose operators share a ``batch_group`` are applied with ONE call.

        Protocol (:class:`~spectral_hooks.linalg.protocols.BatchMember`): an operator that is
        slot ``batch_index`` of a :class:`~spectral_hooks.linalg.protocols.BatchGroup`. Slots of
        members not active here get zeros and their results are ignored. Used when at least two
        active members share a group; returns the members handled.
        """
        groups: dict = {}
        for b, o in enumerate(self.ops):  # pyright: ignore[reportArgumentType]
            g = _group_of(o) if mask[b] else None
            if g is None:
                continue
            i = o.batch_index  # pyright: ignore[reportAttributeAccessIssue]
            slots = groups.setdefault(id(g), (g, {}))[1]
            if 0 <= i < g.size and i not in slots:
                slots[i] = b
        done: set = set()
        c = X.shape[-1]
        for g, slots in groups.values():
            if len(slots) < 2:
                continue
            split = X.is_complex() and not g.dtype.is_complex
            w = 2 * c if split else c
            Xg = torch.zeros(g.size, X.shape[1], w, dtype=g.dtype, device=X.device)
            for i, b in slots.items():
                Xg[i] = torch.cat([X[b].real, X[b].imag], -1).to(g.dtype) if split else \
                    X[b].to(g.dtype)
            Yg = (g.rmatmat_all if adjoint else g.matmat_all)(Xg)
            for i, b in slots.items():
                Yb = torch.complex(Yg[i, :, :c], Yg[i, :, c:]) if split else Yg[i]
                Y[b] = Yb.to(self.wdtype)
                if split:
                    self.counts[b] += c  # real and imaginary parts: two applications
                done.add(b)
        return done

    @staticmethod
    def _one(o: LinearOperator, X: Tensor, adjoint: bool) -> Tensor:
        """One member's product. Every product applied here is tested for NaN / Inf by
        :meth:`apply` or by its caller (on the device, read once per Krylov expansion), so the
        operator is told it may skip its own test (``caller_checks_finite``: a host sync per
        application in ``linearize``'s operators)."""
        # a complex operand of a real operator stays complex: the operator applies itself to
        # both parts (LinearOperator), in its own precision
        own = torch.promote_types(o.dtype, torch.complex64) if X.is_complex() else o.dtype
        if X.dtype != own:
            X = X.to(own)
        with o.checked_by_caller():
            Y = o.rmatmat(X) if adjoint else o.matmat(X)
        wdtype = torch.complex128 if Y.is_complex() or X.is_complex() else torch.float64
        return Y if Y.dtype == wdtype else Y.to(wdtype)

    def need_adjoint(self) -> None:
        """Raise ``NotImplementedError`` unless every operator of the batch has an adjoint."""
        if self.ops is not None:
            for o in self.ops:
                o._need_adjoint()


def _group_of(op: LinearOperator) -> Optional[BatchGroup]:
    """The :class:`BatchGroup` ``op`` is a member of (``protocols.BatchMember``), or None."""
    if isinstance(op, BatchMember) and isinstance(op.batch_group, BatchGroup):
        return op.batch_group
    return None
