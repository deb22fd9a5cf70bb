"""Products of operator chains that share factors, applied in one sweep.

Example::

    >>> import torch
    >>> from spectral_hooks.linalg import DenseOperator, svds
    >>> g = torch.Generator().manual_seed(0)
    >>> A, B = (DenseOperator(torch.randn(8, 8, generator=g, dtype=torch.float64))
    ...         for _ in range(2))
    >>> P1, P2 = ChainProducts([[A], [A, B]]).members     # P1 = A, P2 = B A
    >>> X = torch.randn(8, 3, dtype=torch.float64, generator=g)
    >>> torch.allclose(P2.matmat(X), B.matmat(A.matmat(X)))
    True
    >>> res = svds([P1, P2], 2)          # in lockstep: every step, one sweep through A then B
    >>> res.S.shape
    torch.Size([2, 2])

The end-to-end products of a stack, P_l = J_l ... J_1 for every depth l, pass through the
same factors: applied one by one, a step of a solver on all of them costs 1 + 2 + ... + L
sequential factor applications. As a :class:`~spectral_hooks.linalg.protocols.BatchGroup`
(``matmat_all``), one sweep through the factors serves every product: at position i, the
columns of every chain that has a factor there are applied in one call, per distinct factor
(chains whose i-th factor differs, e.g. one ablated layer, get one call per factor; a factor
(J + J^H) / 2 that names J as ``hermitian_part_of`` rides on J's call there, plus one call of
J^H for its own columns). L
sequential applications instead of L(L+1)/2, with the same columns in all (on an accelerator,
where an application costs its launches, that is the time; on a CPU the FLOPs are the same).
Each member is also a plain :class:`~spectral_hooks.linalg.LinearOperator` (its own chain,
factor by factor), and ``n_matvecs`` of every factor counts the columns applied, as the
separate products would.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .operators import LinearOperator, block_hint

__all__ = ["ChainProducts"]


class ChainProducts:
    """The products of ``chains`` (chain j = [A_1, ..., A_l], A_1 applied first: P_j = A_l
    ... A_1), as one :class:`~spectral_hooks.linalg.protocols.BatchGroup` whose ``members``
    are LinearOperators (module doc). Factors may be rectangular where they compose (A_{i+1}
    takes A_i's output); every product is m x n. ``counted``: the operators whose
    ``n_matvecs`` measure the work (default: the factors); :attr:`spent` [j] is the part of it
    done for chain j. ``names``: the members' names (default: from their factors)."""

    def __init__(self, chains: Sequence[Sequence[LinearOperator]], *,
                 counted: Optional[Sequence[LinearOperator]] = None,
                 names: Optional[Sequence[str]] = None) -> None:
        self.chains: List[List[LinearOperator]] = [list(chain) for chain in chains]
        if not self.chains or any(not chain for chain in self.chains):
            raise ValueError("ChainProducts: needs at least one chain, and no empty chain")
        for op in (o for chain in self.chains for o in chain):
            if not isinstance(op, LinearOperator):
                raise TypeError(f"ChainProducts: factors must be LinearOperators, got {op!r}")
        first = self.chains[0][0]
        m, n = self.chains[0][-1].shape[0], first.shape[1]
        for chain in self.chains:
            _check_chain(chain, (m, n), first.device)
        if names is not None and len(names) != len(self.chains):
            raise ValueError(f"ChainProducts: {len(names)} names for {len(self.chains)} chains")
        self.factors: List[LinearOperator] = list({id(o): o for c in self.chains for o in c}
                                                  .values())
        self.counted: List[LinearOperator] = self.factors if counted is None else list(counted)
        self.size: int = len(self.chains)
        self.m: int = m
        self.n: int = n
        self.device: torch.device = first.device
        self.dtype: torch.dtype = first.dtype
        for op in self.factors:
            self.dtype = torch.promote_types(self.dtype, op.dtype)
        self.spent: List[int] = [0] * self.size
        self.members: List[LinearOperator] = [
            _ChainMember(self, j, None if names is None else names[j]) for j in range(self.size)]

    def matmat_all(self, X: Tensor) -> Tensor:
        """X [size, n, c] -> [size, m, c]: slot j is P_j X[j] (one sweep, A_1 first)."""
        return self._sweep(X, adjoint=False)

    def rmatmat_all(self, X: Tensor) -> Tensor:
        """X [size, m, c] -> [size, n, c]: slot j is P_j^H X[j] (one sweep, the last factor
        of the longest chain first)."""
        return self._sweep(X, adjoint=True)

    def _sweep(self, X: Tensor, adjoint: bool) -> Tensor:
        cur = list(X.to(self.dtype).unbind(0))
        c = X.shape[-1]
        live = self._live(X)
        longest = max(len(chain) for chain in self.chains)
        for i in (range(longest - 1, -1, -1) if adjoint else range(longest)):
            groups = self._at(i, live)
            here = {id(op) for op, _ in groups}
            halves: Dict[int, List[int]] = {}  # J -> the chains applying (J + J^H) / 2 here
            for op, js in groups:
                if _base(op) is not None:
                    halves.setdefault(id(_base(op)), []).extend(js)
            for op, js in groups:
                if _base(op) is not None and id(_base(op)) in here:
                    continue  # a Hermitian part: served by its base factor's call below
                part = halves.get(id(op), [])
                every = js + part
                X_i = torch.cat([cur[j] for j in every], dim=1) if len(every) > 1 else cur[every[0]]
                Y_i = self._apply(op, X_i, adjoint, every)
                for j, Y in zip(every, Y_i.split(c, dim=1)):
                    cur[j] = Y
                if part:  # (op + op^H) / 2 for those chains: the other half
                    Y_p = self._apply(op, X_i[:, len(js) * c:], not adjoint, part)
                    for j, Y in zip(part, Y_p.split(c, dim=1)):
                        cur[j] = 0.5 * (cur[j] + Y)
        rows = self.n if adjoint else self.m
        for j, running in enumerate(live):
            if not running:  # a slot the solver no longer runs: zeros of the product's shape
                cur[j] = X.new_zeros(rows, c, dtype=self.dtype)
        return torch.stack(cur)

    def _live(self, X: Tensor) -> List[bool]:
        """The slots to apply: on the CPU those with a nonzero block (a solver passes zeros
        for members it no longer runs; one read skips their FLOPs), elsewhere all (a read is
        a device sync there, and a launch costs more than the FLOPs)."""
        if X.device.type != "cpu":
            return [True] * self.size
        return (X.reshape(self.size, -1) != 0).any(dim=1).tolist()

    def _at(self, i: int, live: List[bool]) -> List[Tuple[LinearOperator, List[int]]]:
        """The distinct factors at position i, each with the live chains that apply it
        there."""
        groups: Dict[int, Tuple[LinearOperator, List[int]]] = {}
        for j, chain in enumerate(self.chains):
            if live[j] and i < len(chain):
                groups.setdefault(id(chain[i]), (chain[i], []))[1].append(j)
        return list(groups.values())

    def _apply(self, op: LinearOperator, X: Tensor, adjoint: bool, js: List[int], *,
               checked: bool = True) -> Tensor:
        """op (op^H) X, its work shared out equally among chains ``js`` (equal columns).
        ``checked``: the caller tests the product for NaN / Inf (a sweep: the solvers test
        what ``matmat_all`` returns, ``linalg.batch`` or the quadrature on the device), so
        the factor may skip its own test (a host sync); else the factor keeps its setting."""
        before = sum(o.n_matvecs for o in self.counted)
        was = op.caller_checks_finite
        op.caller_checks_finite = was or checked
        try:
            Xo = X.to(_operand_dtype(X, op)) if X.dtype != op.dtype else X
            Y = op.rmatmat(Xo) if adjoint else op.matmat(Xo)
        finally:
            op.caller_checks_finite = was
        share = (sum(o.n_matvecs for o in self.counted) - before) / len(js)
        for j in js:
            self.spent[j] += int(round(share))
        return Y.to(self.dtype) if Y.dtype != self.dtype else Y

    def chain_product(self, j: int, X: Tensor, adjoint: bool) -> Tensor:
        """Chain j alone, factor by factor (its member's own product: the factors test
        their products themselves unless the member's caller does, ``caller_checks_finite``
        reaching them as its parts)."""
        chain = self.chains[j]
        out = X
        for op in (reversed(chain) if adjoint else chain):
            out = self._apply(op, out, adjoint, [j], checked=False)
        return out


def _operand_dtype(X: Tensor, op: LinearOperator) -> torch.dtype:
    """The factor's precision, complex where X is: a real factor applies itself to both parts
    of a complex block (cast to real, a chain with a complex factor lost its imaginary parts
    after it, and a solver's residuals agreed with the wrong product)."""
    if X.is_complex() and not op.dtype.is_complex:
        return torch.promote_types(op.dtype, torch.complex64)
    return op.dtype


def _check_chain(chain: List[LinearOperator], shape: Tuple[int, int],
                 device: torch.device) -> None:
    """Each factor a LinearOperator on ``device`` taking the previous one's output; the
    chain's product of ``shape`` (m, n)."""
    rows = shape[1]
    for op in chain:
        if op.shape[1] != rows or op.device != device:
            raise ValueError(f"ChainProducts: a factor must take {rows} rows on {device} "
                             f"(the previous factor's output), got {op!r}")
        rows = op.shape[0]
    if rows != shape[0]:
        raise ValueError(f"ChainProducts: every product must be {shape[0]} x {shape[1]}, got "
                         f"one of {rows} x {shape[1]} ending in {chain[-1]!r}")


def _base(op: LinearOperator) -> Optional[LinearOperator]:
    """J where ``op`` is (J + J^H) / 2 and says so (``hermitian_part_of``, set by
    ``metrics.schur.symmetric_part``), else None."""
    base = getattr(op, "hermitian_part_of", None)
    return base if isinstance(base, LinearOperator) else None


class _ChainMember(LinearOperator):
    """Slot j of a :class:`ChainProducts`: P_j as a LinearOperator (alone: its chain factor
    by factor; in a solver's batch with other slots: their sweeps)."""

    def __init__(self, group: ChainProducts, j: int, name: Optional[str]) -> None:
        chain = group.chains[j]
        parts = tuple({id(o): o for o in chain}.values())

        def mm(X: Tensor) -> Tensor:
            return group.chain_product(j, X, adjoint=False)

        def rmm(X: Tensor) -> Tensor:
            return group.chain_product(j, X, adjoint=True)

        adjoint = all(o.has_adjoint for o in chain)
        names = [o.name for o in reversed(chain)]
        if name is None:
            name = " @ ".join(names) if len(names) <= 3 else \
                f"{names[0]} @ ... @ {names[-1]} ({len(names)} factors)"
        super().__init__((group.m, group.n), matvec=lambda x: mm(x[:, None])[:, 0], matmat=mm,
                         rmatvec=(lambda y: rmm(y[:, None])[:, 0]) if adjoint else None,
                         rmatmat=rmm if adjoint else None, dtype=group.dtype,
                         device=group.device, name=name, block_size=block_hint(*chain),
                         parts=parts)
        self.batch_group = group
        self.batch_index = j
