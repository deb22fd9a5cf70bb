"""Layers together: the token Jacobians of a group of blocks as ONE batched operator.

Blocks of one structure (same class, parameter names and shapes, recorded call inputs of the
same shapes) run the same traced JVP graph (:mod:`.shared`) on different graph inputs: their
own weights, fixed keys/values, mask and rotary tables. Stacking those inputs along a new
leading axis and mapping the graph over it with ``torch.vmap`` gives one graph for the whole
group: a product with G layers' Jacobians is one pass (on an accelerator one set of kernel
launches), not G. The vmapped graph is traced once more with ``make_fx`` (plain batched aten
ops at run time, no vmap dispatch per call) and cached with the structure's graph.

    >>> from transformers import LlamaConfig, LlamaModel
    >>> import spectral_hooks as sh
    >>> from spectral_hooks.linalg import eigs
    >>> cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
    ...                   num_attention_heads=4, num_key_value_heads=2, vocab_size=50)
    >>> model = LlamaModel(cfg).eval()
    >>> with sh.instrument(model) as probe:
    ...     _ = model(torch.tensor([[1, 2, 3, 4, 5]]))
    ...     ops = block_jacobian_group(probe.anatomy, probe.recording, [0, 1, 2])
    >>> [J.layer for J in ops], ops[0].batch_group.size
    ([0, 1, 2], 3)
    >>> res = eigs(ops, 4)          # every Krylov step applies the three layers at once
    >>> res.values.shape[0], res.values.shape[1] in (4, 5)   # k + 1 where a conjugate pair straddles k
    (3, True)

Each member is a :class:`~.operator.StackedBlockJacobian` (a ``linalg`` ``BatchMember``):
``linalg.eigs`` / ``svds`` applied to the list call the group's ``matmat_all`` once per step;
applied alone, a member runs its own layer's operator. ``J - I`` of a member is a member of the
group's shifted twin (:meth:`BlockGroup.shifted`), so ``svds`` of the list of J_l - I batches
too. Every member is checked on the first products of each width (JVP and VJP) against a direct
``torch.func`` product of its own block (one per member, as the per-layer operators are); a
member that disagrees is applied through its own operator from then on (a fallback warning).

Which layers group: :func:`block_jacobian_group` returns None where fewer than two layers have
a split single-query operator of one structure (bidirectional models, TransformerLens bridges,
per-layer attention types that change the traced graph); the caller then uses the per-layer
operators. Memory: a group holds a stacked copy of its blocks' graph inputs (the analysis-dtype
weights: G x a block's weights) and, per width W in use, G x W rows of the block's activations.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

import torch
from torch import Tensor
from torch.fx.experimental.proxy_tensor import make_fx

from ..errors import fallback
from ..linalg import IdentityOperator, LinearOperator
from .engine import DENSE_WIDTH, Engine
from .finite import checked
from .function import REPLAY_ERRORS, agreement_tol, math_sdpa, one_snapshot_mode
from .operator import BlockJacobian, StackedBlockJacobian
from .shared import (
    clear_traces,
    disagreement_terms,
    structure_graphs,
    structure_key,
    transposed_graph,
)
from .single_query import SingleQueryFunction

if TYPE_CHECKING:
    from ..anatomy import Anatomy
    from ..recording import Recording

log: logging.Logger = logging.getLogger("spectral_hooks.linearize")

__all__ = ["BlockGroup", "block_jacobian_group", "group_operators", "group_capacity",
           "layer_bytes", "free_memory", "GROUP_WIDTHS"]

#: The widths of the traced graphs a group runs: one column (a Krylov step) and batched
#: products in passes of the narrowest of 32, 64, 128 columns that holds them.
GROUP_WIDTHS = (1, 32, 64, DENSE_WIDTH)


def _vmapped(graph: Callable, size: int, example: List[Tensor]) -> Callable:
    """``graph`` mapped over a leading group axis of ``size`` on all its inputs, traced once
    (make_fx) per graph and size and kept on ``graph`` itself: it lives as long as the graph
    it maps (shared where the structure's graph is shared), and never outlives it to meet
    another trace of the same structure; the plain vmap where the trace fails."""
    kept = graph.__dict__.setdefault("_spectral_hooks_vmapped", {})
    got = kept.get(size)
    if got is not None:
        return got
    mapped = torch.vmap(graph)
    try:
        with math_sdpa(), one_snapshot_mode():
            gm = make_fx(mapped)(*example)
    except REPLAY_ERRORS as err:  # an op make_fx cannot trace under vmap: map at run time
        log.info("vmapped group graph not traceable (%s): torch.vmap at run time", err)
        return mapped
    kept[size] = gm
    return gm


def clear_group_graphs() -> None:
    """Forget the cached vmapped graphs: they are kept on the traced graphs they map, so this
    forgets the traced structure graphs (``shared.clear_traces``).

    >>> clear_group_graphs()
    """
    clear_traces()


class _Width:
    """One width's batched JVP and VJP for the whole group (built lazily)."""

    def __init__(self, group: "BlockGroup", W: int) -> None:
        self.group, self.W = group, W
        fn = group.fns[0]
        primal, self.tangent = structure_graphs(fn, W)
        X0 = torch.stack([f.x0.expand(W, *f.x0.shape) for f in group.fns])
        with torch.no_grad():
            self.residuals = tuple(torch.vmap(primal)(*group.inputs, X0))
        self.jvp = _vmapped(self.tangent, group.size, [*self.residuals, X0])
        self.vjp: Optional[Callable] = None
        self.transposed: Optional[Callable] = None  # one layer's VJP graph
        self.checked: Dict[str, set] = {"jvp": set(), "vjp": set()}  # members checked

    def transpose(self) -> Callable:
        if self.vjp is None:
            fn = self.group.fns[0]
            graph = self.transpose_one()
            X0 = torch.zeros(self.group.size, self.W, *fn.x0.shape, dtype=fn.x0.dtype,
                             device=fn.x0.device)
            self.vjp = _vmapped(graph, self.group.size, [*self.residuals, X0])
        return self.vjp

    def transpose_one(self) -> Callable:
        if self.transposed is None:
            one = tuple(r[0] for r in self.residuals)
            self.transposed = transposed_graph(self.tangent, one, self.W, self.group.fns[0].x0)
        return self.transposed

    def one(self, i: int, T: Tensor, adjoint: bool) -> Tensor:
        """Member i alone: the structure's graph on its slice of the residuals."""
        graph = self.transpose_one() if adjoint else self.tangent
        return graph(*(r[i] for r in self.residuals), T)


class BlockGroup:
    """G same-structure blocks' token Jacobians applied in one pass: the ``linalg``
    ``BatchGroup`` protocol (``size``, ``dtype``, ``matmat_all``, ``rmatmat_all``), with
    ``shift`` (the group of J_l - shift I when nonzero)."""

    size: int
    dtype: torch.dtype
    device: torch.device
    n: int
    layers: List[int]
    n_calls: int

    def __init__(self, ops: Sequence[BlockJacobian], *, shift: float = 0.0,
                 base: Optional["BlockGroup"] = None, capacity: Optional[int] = None) -> None:
        self.ops = list(ops)
        self.size = len(self.ops)
        self.fns: List[SingleQueryFunction] = [_split_fn(op) for op in self.ops]
        self.layers = [op.layer for op in self.ops]
        self.dtype, self.device, self.n = self.ops[0].dtype, self.ops[0].device, self.ops[0].shape[0]
        self.shift = float(shift)
        self._base = base
        self.n_calls = 0
        if base is None:
            first = self.fns[0].inputs()
            self.key = structure_key(self.fns[0], 1)
            cap = max(capacity or 0, self.size)
            self.inputs = [t.new_empty((cap, *t.shape)) for t in first]
            for i, f in enumerate(self.fns):
                self._take(i, f)
            self._widths: Dict[int, _Width] = {}
            self._shifted: Dict[float, BlockGroup] = {}
            self.solo: set = set()  # members applied through their own operator
            # columns applied per slot (nonzero columns: a slot not in use gets zeros), kept
            # on the device and read once (columns_applied)
            self._columns = torch.zeros(self.size, dtype=torch.int64, device=self.device)
            self._host_columns: Optional[List[int]] = None

    def _take(self, i: int, fn: SingleQueryFunction) -> None:
        """Copy layer i's graph inputs into slot i of the stacked copy and make the layer
        read them there (its own copy is then freed: the weights are held once)."""
        for t, x in zip(self.inputs, fn.inputs()):
            t[i].copy_(x)
        fn.use_inputs([t[i] for t in self.inputs])

    def add(self, op: BlockJacobian) -> bool:
        """Take ``op`` as the next member (before any product): False where it does not fit
        (another structure, no split single-query replay, or the group is full)."""
        if self._base is not None or getattr(self, "_widths", None):
            raise RuntimeError("a layer group takes members only before its first product")
        try:
            fn = _split_fn(op)
            fits = (structure_key(fn, 1) == self.key and self.size < self.inputs[0].shape[0]
                    and op.sample == self.ops[0].sample)
        except (TypeError, *REPLAY_ERRORS):
            return False
        if not fits:
            return False
        self._take(self.size, fn)
        self.ops.append(op)
        self.fns.append(fn)
        self.layers.append(op.layer)
        self.size += 1
        return True

    def seal(self) -> "BlockGroup":
        """Drop the unused slots (call after the last :meth:`add`); returns the group."""
        self.inputs = [t[:self.size] for t in self.inputs]
        self._columns = torch.zeros(self.size, dtype=torch.int64, device=self.device)
        return self

    @property
    def root(self) -> "BlockGroup":
        """The group whose graphs and buffers this one shares (itself unless shifted)."""
        return self if self._base is None else self._base

    def shifted(self, shift: float) -> "BlockGroup":
        """The group of J_l - shift I (same graphs and residuals; one object per shift, so
        that the shifted members batch together too)."""
        root, total = self.root, self.shift + shift
        if not total:
            return root
        got = root._shifted.get(total)
        if got is None:
            got = root._shifted[total] = BlockGroup(self.ops, shift=total, base=root)
        return got

    def members(self) -> List[StackedBlockJacobian]:
        """One :class:`StackedBlockJacobian` per slot, each applied through this group."""
        return [_member(self, i) for i in range(self.size)]

    def _width(self, c: int) -> Optional[_Width]:
        """The group's graphs at the width for ``c`` columns (traced on first use); None where
        the block structure cannot be traced (data-dependent control flow, e.g. routing that
        reads its expert choices on the host): every member is then applied through its own
        operator, which handles such blocks."""
        root = self.root
        if root.inputs[0].shape[0] != root.size:
            root.seal()
        W = next((w for w in GROUP_WIDTHS if w >= c), GROUP_WIDTHS[-1])
        got = root._widths.get(W)
        if got is None and len(root.solo) < root.size:
            try:
                got = root._widths[W] = _Width(root, W)
            except REPLAY_ERRORS as why:
                root.solo.update(range(root.size))
                fallback("linearize.group_untraceable",
                         f"layers {root.layers} cannot be traced as one group ({type(why).__name__}"
                         f": {str(why).splitlines()[0]}): each is applied on its own (slower)")
        return got

    def columns_applied(self, i: int) -> int:
        """Columns applied to slot i's operator (J_i or J_i^T, any shift) by the group so far
        (read from the device once after the latest application)."""
        root = self.root
        if root._host_columns is None:
            root._host_columns = root._columns.tolist()
        return root._host_columns[i]

    def matmat_all(self, X: Tensor) -> Tensor:
        """X [G, n, c] -> [G, n, c]: slot l is (J_l - shift I) X[l], in one pass."""
        return self._apply(X, adjoint=False)

    def rmatmat_all(self, X: Tensor) -> Tensor:
        """X [G, n, c] -> [G, n, c]: slot l is (J_l - shift I)^T X[l], in one pass."""
        return self._apply(X, adjoint=True)

    def _apply(self, X: Tensor, adjoint: bool) -> Tensor:
        """X [G, n, c] -> [G, n, c]: slot l is (J_l - shift I) X[l] (or its transpose)."""
        root = self.root
        G, n, c = X.shape
        X = X.to(self.dtype)
        width = self._width(c)
        if width is None:  # every member through its own operator
            Y = torch.stack([op.rmatmat(x) if adjoint else op.matmat(x)
                             for op, x in zip(self.ops, X)])
            root._columns += (X != 0).any(dim=1).sum(dim=-1)
            root._host_columns = None
            return Y - self.shift * X if self.shift else Y
        W = width.W
        f = width.transpose() if adjoint else width.jvp
        T = X.permute(0, 2, 1).reshape(G, c, 1, n)
        outs = []
        for c0 in range(0, c, W):  # passes of W columns, the last zero-padded
            chunk = T[:, c0:c0 + W]
            w = chunk.shape[1]
            if w < W:
                chunk = torch.cat([chunk, chunk.new_zeros(G, W - w, 1, n)], 1)
            out = f(*width.residuals, chunk)
            outs.append(out[:, :w])
        Y = outs[0] if len(outs) == 1 else torch.cat(outs, 1)
        root.n_calls += len(outs)
        root._columns += (X != 0).any(dim=1).sum(dim=-1)
        root._host_columns = None
        what = "vjp" if adjoint else "jvp"
        if len(width.checked[what]) < self.size:
            self._check(width, what, T[:, :W], Y[:, :W], range(self.size))
        for i in root.solo:
            op = self.ops[i]
            Y[i] = (op.rmatmat(X[i]) if adjoint else op.matmat(X[i])).T.reshape(c, 1, n)
        Y = Y.reshape(G, c, n).permute(0, 2, 1)
        return Y - self.shift * X if self.shift else Y

    def apply_one(self, i: int, X: Tensor, adjoint: bool = False) -> Tensor:
        """(J_i - shift I) X (or its transpose) for member i alone, X [n, c]: the structure's
        graph on member i's residuals (no per-layer build)."""
        root = self.root
        op = self.ops[i]
        if i in root.solo:
            Y = op.rmatmat(X) if adjoint else op.matmat(X)
            return Y - self.shift * X if self.shift else Y
        n, c = X.shape
        X = X.to(self.dtype)
        width = self._width(c)
        if width is None:  # every member is applied on its own now
            return self.apply_one(i, X, adjoint)
        W = width.W
        T = X.T.reshape(c, 1, n)
        outs = []
        for c0 in range(0, c, W):
            chunk = T[c0:c0 + W]
            w = chunk.shape[0]
            if w < W:
                chunk = torch.cat([chunk, chunk.new_zeros(W - w, 1, n)])
            outs.append(width.one(i, chunk, adjoint)[:w])
        Y = outs[0] if len(outs) == 1 else torch.cat(outs)
        root._columns[i] += c
        root._host_columns = None
        what = "vjp" if adjoint else "jvp"
        if i not in width.checked[what]:
            self._check(width, what, T[None, :W].expand(self.size, -1, -1, -1),
                        Y[None, :W].expand(self.size, -1, -1, -1), [i])
            if i in root.solo:
                return self.apply_one(i, X, adjoint)
        Y = Y.reshape(c, n).T
        return Y - self.shift * X if self.shift else Y

    def _check(self, width: _Width, what: str, T: Tensor, Y: Tensor, members) -> None:
        """Members' first products at this width against their own block's direct
        ``torch.func`` product (every member's disagreement read from the device at once);
        a member that disagrees is applied on its own from now."""
        root = self.root
        todo = [i for i in members if i not in root.solo and i not in width.checked[what]]
        terms, failed = [], {}
        for i in todo:
            try:
                terms.append(disagreement_terms(self.fns[i], T[i], Y[i],
                                                adjoint=what == "vjp"))
            except REPLAY_ERRORS as why:  # no direct product to check against
                failed[i] = f"{type(why).__name__}: {why}"
                terms.append((T.new_full((), float("inf")), T.new_ones(())))
        if not todo:
            return
        errs, sizes = torch.stack([torch.stack(t) for t in terms]).T.tolist()
        tol = agreement_tol(self.dtype)
        for i, err, size in zip(todo, errs, sizes):
            if size == 0:
                continue  # a zero block: nothing checked yet
            width.checked[what].add(i)
            if not err <= tol:
                root.solo.add(i)
                fallback("linearize.group_member_alone",
                         f"the grouped {what.upper()} of layer {self.layers[i]} disagrees with "
                         f"its own block ({failed.get(i, f'{err:.1e}')}): it is applied on "
                         "its own (slower)")


def _real_parts(f: Callable[[Tensor], Tensor], X: Tensor) -> Tensor:
    if X.is_complex():
        return torch.complex(f(X.real), f(X.imag))
    return f(X)


def _split_fn(op: BlockJacobian) -> SingleQueryFunction:
    engine = op.engine
    fn = engine.fn if isinstance(engine, Engine) else None
    if not isinstance(fn, SingleQueryFunction) or not fn.split:
        raise TypeError(f"{op!r} is not a split single-query block Jacobian")
    return fn


class GroupedBlockJacobian(StackedBlockJacobian):
    """A member of a :class:`BlockGroup`: applied alone it runs its own layer's operator;
    ``J - I`` is a member of the group's shifted twin (so it batches as well)."""

    @property
    def n_matvecs(self) -> int:  # pyright: ignore[reportIncompatibleVariableOverride]
        """Its own applications plus the group's columns for its slot."""
        group = self.batch_group
        assert isinstance(group, BlockGroup)  # set by _member
        return self._direct + group.columns_applied(self.batch_index)

    @n_matvecs.setter
    def n_matvecs(self, value: int) -> None:
        group = getattr(self, "batch_group", None)
        grouped = group.columns_applied(self.batch_index) if isinstance(group, BlockGroup) \
            else 0
        self._direct = value - grouped

    def __sub__(self, other: LinearOperator) -> LinearOperator:
        if isinstance(other, IdentityOperator) and other.shape == self.shape:
            group = self.batch_group
            assert isinstance(group, BlockGroup)  # set by _member
            return _member(group.shifted(1.0), self.batch_index)
        return super().__sub__(other)


def _member(group: BlockGroup, i: int) -> GroupedBlockJacobian:
    op, s = group.ops[i], group.shift

    made: List[GroupedBlockJacobian] = []
    at: Dict[str, Any] = dict(layer=op.layer, sample=op.sample, positions=op.positions)

    def apply(X: Tensor, adjoint: bool) -> Tensor:
        out = _real_parts(lambda V: group.apply_one(i, V, adjoint), X)
        if made and made[0].caller_checks_finite:  # a solver tests the products itself
            return out
        return checked(out, what="VJP" if adjoint else "JVP", **at)

    def matmat(X: Tensor) -> Tensor:
        return apply(X, False)

    def rmatmat(X: Tensor) -> Tensor:
        return apply(X, True)

    name = op.name if not s else f"({op.name} - {s:g} I)"
    member = GroupedBlockJacobian(
        op.shape[0], batch_group=group, batch_index=i,
        matvec=lambda x: matmat(x[:, None])[:, 0], rmatvec=lambda y: rmatmat(y[:, None])[:, 0],
        matmat=matmat, rmatmat=rmatmat,
        dtype=op.dtype, device=op.device, name=name, layer=op.layer, sample=op.sample,
        positions=op.positions, kind="token", single_query_mode="split",
        block_size=op.block_size)
    made.append(member)
    return member


#: Share of the free device memory (host memory on the CPU) a layer group may take.
GROUP_MEMORY_SHARE = 0.5
#: Cap of one group's memory: with a bf16 Llama-3-8B (16 GB) resident, the section's peak
#: stays near 40 GiB (issue 37).
GROUP_MEMORY_CAP = 24 * 2 ** 30
#: Rows of activations a group member holds: one per column of every traced width in use.
_ROWS = sum(GROUP_WIDTHS)


def layer_bytes(op: BlockJacobian) -> int:
    """Memory one member of a layer group takes (the formula the guide states):
    (P + R * A + 2 * T * d) * b, with P the block's parameters (held once, in the analysis
    dtype of b bytes), R = 1 + 32 + 64 + 128 rows of activations (one per column of each
    traced width), A = 2 x the summed output widths of the block's linear maps (their outputs
    and tangents) and 2 T d the fixed keys/values of T tokens. The O(k d) solver state of
    each problem (Krylov bases of ~6k vectors) is added by :func:`group_capacity`."""
    fn = _split_fn(op)
    b = torch.finfo(op.dtype).bits // 8
    params = sum(t.numel() for t in fn.params.values())
    widths = sum(m.out_features for m in fn.block.modules() if isinstance(m, torch.nn.Linear))
    widths = widths or 8 * op.shape[0]  # no nn.Linear (Conv1D, fused kernels): ~8 d
    keys, values = fn.cache.keys, fn.cache.values
    kv = int(keys.numel() + values.numel()) if keys is not None and values is not None else 0
    return (params + _ROWS * 2 * widths + kv) * b


def free_memory(device: torch.device) -> int:
    """Free bytes on ``device`` (CUDA: ``torch.cuda.mem_get_info``; else the host's
    available memory, /proc/meminfo, or 8 GiB where unknown)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # no /proc (macOS, Windows): the documented 8 GiB assumption
        return 8 * 2 ** 30
    return 8 * 2 ** 30


def group_capacity(op: BlockJacobian, n_layers: int, *, k: int = 16) -> int:
    """Layers a group may hold: min(n_layers, M / (layer_bytes + 6 k d * 16 * 3)) with
    M = min(GROUP_MEMORY_SHARE x free memory, GROUP_MEMORY_CAP); 1 for an operator that
    cannot group (no split single-query replay)."""
    try:
        per = layer_bytes(op)
    except TypeError:
        return 1
    per += 6 * k * op.shape[0] * 16 * 3
    budget = min(GROUP_MEMORY_SHARE * free_memory(op.device), GROUP_MEMORY_CAP)
    return max(1, min(n_layers, int(budget // per)))


def group_operators(ops: Sequence[BlockJacobian]) -> List[List[BlockJacobian]]:
    """``ops`` partitioned into groups that can run together: split single-query token
    operators of one block structure (lists of one: a layer that runs on its own), in order
    of first appearance."""
    groups: Dict[Any, List[BlockJacobian]] = {}
    for j, op in enumerate(ops):
        try:
            fn = _split_fn(op)
            key: Any = (structure_key(fn, 1), op.sample, tuple(op.positions))
        except (TypeError, *REPLAY_ERRORS):
            key = ("alone", j)
        groups.setdefault(key, []).append(op)
    return list(groups.values())


def block_jacobian_group(anatomy: Anatomy, recording: Recording, layers: Sequence[int], *,
                         sample: int = 0, position: int = -1,
                         dtype: torch.dtype = torch.float64
                         ) -> Optional[List[StackedBlockJacobian]]:
    """Token Jacobians of ``layers`` as members of one :class:`BlockGroup` (see the module
    doc), or None where they do not form one group (different structures, no split
    single-query replay, fewer than two layers)."""
    from . import block_jacobian  # the package face builds and checks each layer's operator

    ops = [block_jacobian(anatomy, recording, layer, sample=sample, position=position,
                          dtype=dtype) for layer in layers]
    parts = group_operators(ops)
    if len(parts) != 1 or len(ops) < 2:
        return None
    return BlockGroup(ops).members()
