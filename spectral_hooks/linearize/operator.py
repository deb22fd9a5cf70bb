"""Typed Jacobian operators: what a block Jacobian is, stated in its constructor.

    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> import spectral_hooks as sh
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
    >>> with sh.instrument(model) as probe, torch.no_grad():
    ...     _ = model(input_ids=torch.arange(16).reshape(2, 8))
    >>> from spectral_hooks.linearize import block_jacobian, jacobian_product
    >>> J = block_jacobian(probe.anatomy, probe.recording, 1)
    >>> J.layer, J.sample, J.positions, J.kind, J.single_query_mode
    (1, 0, (7,), 'token', 'split')
    >>> P = jacobian_product(probe.anatomy, probe.recording, 0, 1)
    >>> P.first, P.last, tuple(F.layer for F in P.factors)
    (0, 1, (0, 1))

:class:`BlockJacobian` is the Jacobian of one block at its recorded input (matvec = JVP,
rmatvec = VJP); :class:`StackedBlockJacobian` is one slot of a layer group
(``linearize.group``) and so also a :class:`~spectral_hooks.linalg.protocols.BatchMember`;
:class:`JacobianProduct` is J_last ... J_first at one position. Every field is set once, in
the constructor.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol, Sequence, Tuple, Union, cast

import torch
from torch import Tensor

from ..errors import OptionError
from ..linalg import BatchGroup, LinearOperator
from .finite import replay_error
from .function import KINDS

__all__ = ["BlockJacobian", "StackedBlockJacobian", "JacobianProduct", "KINDS",
           "SINGLE_QUERY_MODES"]

SINGLE_QUERY_MODES = ("split", "concat", None)
_Fn = Callable[[Tensor], Tensor]


class JacobianEngine(Protocol):
    """What an operator's engine provides (``engine.Engine``): batched JVPs and VJPs."""

    def jvp(self, V: Tensor) -> Tensor:
        """V [m, d] or [k, m, d] -> J V."""
        ...

    def vjp(self, U: Tensor) -> Tensor:
        """U [m, d] or [k, m, d] -> U J."""
        ...


def _positions(positions: Union[Tensor, Sequence[int]]) -> Tuple[int, ...]:
    if isinstance(positions, Tensor):
        return tuple(int(p) for p in positions.flatten().tolist())
    return tuple(int(p) for p in positions)


class BlockJacobian(LinearOperator):
    """The Jacobian of block ``layer`` at its recorded input, for batch row ``sample``.

    Fields: ``layer`` (int), ``sample`` (int), ``positions`` (tuple of the recording rows
    used: one for ``kind="token"``, every real row for ``kind="sequence"``), ``kind``
    ("token" | "sequence"), ``single_query_mode`` ("split": batched JVPs with ``block_size``
    set, "concat", or None: the full sequence is replayed), ``engine`` (the lazily built
    JVP/VJP machinery). ``single_query`` is ``single_query_mode is not None``.
    Shape (m d, m d) with m = len(positions), flattened position-major.
    """

    layer: int
    sample: int
    positions: Tuple[int, ...]
    kind: str
    single_query_mode: Optional[str]
    engine: Union[JacobianEngine, BatchGroup]

    def __init__(self, n: int, *, matvec: _Fn, rmatvec: _Fn, matmat: _Fn, rmatmat: _Fn,
                 dtype: torch.dtype, device: Union[str, torch.device], name: str, layer: int,
                 sample: int, positions: Union[Tensor, Sequence[int]], kind: str,
                 single_query_mode: Optional[str],
                 engine: Union[JacobianEngine, BatchGroup],
                 block_size: Optional[int] = None) -> None:
        if kind not in KINDS:
            raise OptionError("kind", kind, f"one of {KINDS}")
        if single_query_mode not in SINGLE_QUERY_MODES:
            raise OptionError("single_query_mode", single_query_mode,
                              f"one of {SINGLE_QUERY_MODES}")
        super().__init__((n, n), matvec=matvec, rmatvec=rmatvec, matmat=matmat,
                         rmatmat=rmatmat, dtype=dtype, device=device, name=name,
                         block_size=block_size)
        self.layer, self.sample = int(layer), int(sample)
        self.positions = _positions(positions)
        self.kind = kind
        self.single_query_mode = single_query_mode
        self.engine = engine

    def nonfinite_error(self, adjoint: bool = False) -> FloatingPointError:
        """A NaN / Inf product: the replay of this block overflows (named by layer, sample and
        token, as the operator's own per-application test says it)."""
        return replay_error(layer=self.layer, sample=self.sample, positions=self.positions,
                            what="VJP" if adjoint else "JVP", dtype=self.dtype)

    @property
    def single_query(self) -> bool:
        """True where only the query row is recomputed (see ``linearize.single_query``)."""
        return self.single_query_mode is not None


class StackedBlockJacobian(BlockJacobian):
    """Slot ``batch_index`` of a layer group (``linearize.group``): a token Jacobian that ``linalg.eigs`` applies
    together with its siblings (one ``matmat_all`` per Krylov step)."""

    batch_group: BatchGroup
    batch_index: int

    def __init__(self, n: int, *, batch_group: BatchGroup, batch_index: int,
                 **fields: Any) -> None:
        super().__init__(n, engine=batch_group, **fields)
        self.batch_group, self.batch_index = batch_group, int(batch_index)


class JacobianProduct(LinearOperator):
    """P = J_last ... J_first: token Jacobians of consecutive layers at one position.

    Fields: ``first``, ``last`` (layers), ``sample``, ``positions`` (the recording rows of
    each factor, as in :class:`BlockJacobian`), ``factors`` (the BlockJacobians, first to last).
    """

    first: int
    last: int
    sample: int
    positions: Tuple[int, ...]
    factors: Tuple[BlockJacobian, ...]

    def __init__(self, factors: Sequence[BlockJacobian]) -> None:
        if not factors:
            raise OptionError("factors", list(factors), "at least one BlockJacobian")
        factors = tuple(factors)
        chain: LinearOperator = factors[0]
        for J in factors[1:]:
            chain = cast(LinearOperator, J @ chain)
        first, last = factors[0].layer, factors[-1].layer
        super().__init__(chain.shape, matvec=chain.matvec, rmatvec=chain.rmatvec,
                         matmat=chain.matmat, rmatmat=chain.rmatmat, dtype=chain.dtype,
                         device=chain.device, name=f"P[layers {first}..{last}]",
                         block_size=chain.block_size, parts=(chain,))
        self.first, self.last = first, last
        self.sample, self.positions = factors[0].sample, factors[0].positions
        self.factors = factors
