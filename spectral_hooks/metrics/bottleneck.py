"""End-to-end bottleneck and perturbation propagation through chained block Jacobians.

Example::

    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> Js = [torch.eye(32, dtype=torch.float64) + torch.randn(32, 32, generator=g,
    ...                                                      dtype=torch.float64) / 6
    ...       for _ in range(3)]
    >>> table = bottleneck_table(Js, k=8)                  # matrix-free, top-8 of each P_l
    >>> list(table["depth"]), bool(table["truncated"].all())
    ([1, 2, 3], True)
    >>> exact = bottleneck_table(Js, dense=True)           # all 32 singular values
    >>> int(exact["n_singular"].iloc[0])
    32
    >>> list(propagation_table(Js, k=4).columns[:4])
    ['layer', 'norm', 'growth', 'alignment_top']

METRICS.md section 2: P_l = J_l ... J_1 (operators[0] is J_1, applied first); for every depth
l the ranks of section 4 (``linalg.ranks``) of its singular values. Dense: the exact singular
values of the matrix product. Matrix-free: the top-k by Lanczos bidiagonalisation of the
composed operator (each matvec of P_l costs l block matvecs); ``erank``,
``participation_ratio``, ``stable_rank`` and ``surviving`` are then those of the truncated
spectrum (``truncated=True`` unless k = d: ``surviving`` = min(exact, k), ``stable_rank`` and
``participation_ratio`` are lower bounds), and ``n_probes`` > 0 adds the SLQ estimates of the
full-spectrum erank and surviving with their standard errors (``RANK_ESTIMATE_COLUMNS``,
``metrics.rank_estimates``). The estimates of every depth (every ablated layer) run in
lockstep: the products are members of one ``linalg.ChainProducts``, so a Lanczos step of all
of them is one sweep down and one up the chain, L sequential block applications each, where
the depths one at a time took l for every depth l (the same columns in all). The end-to-end
Jacobians of a bidirectional stack (``end_to_end_table``) run the same way: they are chains
of full-sequence block Jacobians between a row's scatter and its read.
"""

from __future__ import annotations

import itertools
from typing import Optional, Sequence, TypeAlias, cast

import pandas as pd
import torch
from torch import Tensor
from torch.profiler import record_function

from spectral_hooks.linalg import (
    ChainProducts,
    DenseOperator,
    LinearOperator,
    effective_rank,
    participation_ratio,
    stable_rank,
    surviving,
    svds,
)
from spectral_hooks.metrics.jacobian import SCHUR_MAX_D, schur_diagonal, symmetric_part
from spectral_hooks.metrics.nulls import gamma_null
from spectral_hooks.metrics.rank_estimates import (
    RANK_ESTIMATE_COLUMNS,
    rank_estimates_of,
)

from ..checks import check_choice, check_int, check_type
from ..errors import OptionError, OptionTypeError

__all__ = ["bottleneck_table", "end_to_end_table", "single_layer_ablation_table",
           "propagation_table", "VARIANTS", "BOTTLENECK_COLUMNS", "PROPAGATION_COLUMNS",
           "RANK_ESTIMATE_COLUMNS", "ALL_LAYERS", "selected_depths"]

VARIANTS = ("trained", "init", "symmetric", "schur")
BOTTLENECK_COLUMNS = ("variant", "ablated_layer", "depth", "erank", "participation_ratio",
                      "stable_rank", "surviving", "sigma_max", "n_singular", "truncated",
                      "n_matvecs")
#: matrix-free tables (n_probes > 0) append RANK_ESTIMATE_COLUMNS: erank_est and surviving_est
#: (SLQ over all singular values), each with its standard error (_se) and quadrature bracket
#: (_lo, _hi)
#: ``ablated_layer`` of rows where every layer is ablated (or none: trained, init)
ALL_LAYERS = -1
PROPAGATION_COLUMNS = ("layer", "norm", "growth", "alignment_top", "alignment_in",
                       "alignment_null", "k")

_Op: TypeAlias = "LinearOperator | Tensor"


def _dims(operators: Sequence[_Op], what: str) -> int:
    want = "a sequence of LinearOperators or [d, d] tensors (one per layer)"
    if isinstance(operators, (Tensor, LinearOperator)) or not isinstance(operators, Sequence):
        raise OptionTypeError("operators", operators, want, hint=what)
    if len(operators) == 0:
        raise OptionError("operators", operators, "at least one operator: " + want, hint=what)
    shapes = set()
    for i, o in enumerate(operators):
        if isinstance(o, Tensor):
            if o.ndim != 2 or o.is_complex() or not o.is_floating_point():
                raise OptionError(f"operators[{i}]", o, "a real floating [d, d] tensor", hint=what)
            shapes.add(tuple(o.shape))
        elif isinstance(o, LinearOperator):
            shapes.add(o.shape)
        else:
            raise OptionTypeError(f"operators[{i}]", o, "a LinearOperator or a [d, d] tensor",
                                  hint=what)
    if len(shapes) != 1 or len({s for sh in shapes for s in sh}) != 1:
        raise ValueError(f"{what}: operators must all be square of one size, got shapes "
                         f"{sorted(shapes)}")
    return next(iter(shapes))[0]


def _as_op(o: _Op) -> LinearOperator:
    return o if isinstance(o, LinearOperator) else DenseOperator(o.to(torch.float64))


def _as_dense(o: _Op) -> Tensor:
    return (o if isinstance(o, Tensor) else o.to_dense()).to(torch.float64)


def _count(ops: Sequence[_Op]) -> int:
    return sum(o.n_matvecs for o in ops if isinstance(o, LinearOperator))


def _rank_row(variant: str, depth: int, s: Tensor, tau: float, truncated: bool,
              n_matvecs: int, ablated_layer: int = ALL_LAYERS) -> dict:
    s = s.cpu()  # one copy; the row's reads below touch no device
    with record_function("spectral_hooks.host"):
        return dict(variant=variant, ablated_layer=int(ablated_layer), depth=depth,
                    erank=float(effective_rank(s)),
                    participation_ratio=float(participation_ratio(s)),
                    stable_rank=float(stable_rank(s)), surviving=int(surviving(s, tau)),
                    sigma_max=float(s.max()), n_singular=int(s.shape[0]),
                    truncated=bool(truncated), n_matvecs=int(n_matvecs))


def _check_probes(n_probes: int, steps: int, what: str) -> None:
    probes = "0 (no estimates) or an int >= 2"
    if check_int("n_probes", n_probes, minimum=0, accepted=probes, hint=what) == 1:
        raise OptionError("n_probes", n_probes, probes, hint=what)
    check_int("steps", steps, minimum=1, hint=what)


def _columns(dense: bool, n_probes: int) -> list[str]:
    extra: tuple[str, ...] = RANK_ESTIMATE_COLUMNS if not dense and n_probes else ()
    return [*BOTTLENECK_COLUMNS, *extra]


def bottleneck_table(operators: Sequence[_Op], *, k: int = 32, variant: str = "trained",
                     dense: bool = False, seed: int = 0, tau: float = 1e-2,
                     method: str = "lanczos", tol: float = 1e-8, n_probes: int = 16,
                     steps: int = 48, depths: Optional[Sequence[int]] = None) -> pd.DataFrame:
    """Ranks of the cumulative products P_l = J_l ... J_1, one row per depth l = 1..L (or per
    depth of ``depths``: matrix-free, the others cost nothing).

    >>> A = torch.zeros(6, 6, dtype=torch.float64); A[0, 0], A[1, 1] = 1.0, 0.5
    >>> row = bottleneck_table([A, A], dense=True).iloc[1]  # P_2 = diag(1, 0.25, 0, ...)
    >>> int(row["surviving"]), round(float(row["stable_rank"]), 4)
    (2, 1.0625)

    ``variant``: ``"trained"`` and ``"init"`` use the operators as given (the label says
    which model they came from); ``"symmetric"`` replaces each J_l by (J_l + J_l^T)/2
    (matrix-free, :func:`symmetric_part`); ``"schur"`` replaces each J_l = Q T Q^* by its
    normal part Q diag(T) Q^* (:func:`schur_diagonal`, real variant), which needs dense
    [d, d] tensors with d <= SCHUR_MAX_D and always runs in dense mode. Matrix-free needs
    1 <= k <= d (``method``/``tol``/``seed`` go to ``linalg.svds``); dense ignores k.
    Columns: ``variant, depth, erank, participation_ratio, stable_rank, surviving``
    (#{sigma_i >= tau sigma_1}), ``sigma_max, n_singular`` (singular values used),
    ``truncated`` (ranks of the top-k only), ``n_matvecs`` (block matvecs so far); matrix-free
    with ``n_probes`` > 0 (0: none), also ``RANK_ESTIMATE_COLUMNS``: SLQ estimates over all
    singular values (``n_probes`` probes, ``steps`` Lanczos steps on P_l^T P_l, seed
    ``seed + depth``) with their standard errors.
    """
    what = "bottleneck_table"
    d = _dims(operators, what)
    _check_probes(n_probes, steps, what)
    check_choice("variant", variant, VARIANTS, hint=what)
    if variant == "schur":
        _check_schur(operators, d, what)
        operators = [schur_diagonal(cast(Tensor, o).to(torch.float64)) for o in operators]
        dense = True
    wanted = selected_depths(depths, len(operators), what)
    start = _count(operators)
    rows = []
    if dense:
        mats = [_as_dense(o) for o in operators]
        if variant == "symmetric":
            mats = [0.5 * (M + M.T) for M in mats]
        P = torch.eye(d, dtype=torch.float64, device=mats[0].device)
        for depth, M in enumerate(mats, start=1):
            P = M @ P
            if depth in wanted:
                rows.append(_rank_row(variant, depth, torch.linalg.svdvals(P), tau, False,
                                      _count(operators) - start))
        return pd.DataFrame(rows, columns=list(BOTTLENECK_COLUMNS))
    check_int("k", k, minimum=1, maximum=d, accepted=f"an int with 1 <= k <= d = {d}", hint=what)
    ops = [_as_op(o) for o in operators]
    if variant == "symmetric":
        ops = [symmetric_part(o) for o in ops]
    depths = sorted(wanted)  # only the products of these depths cost
    rows = _matrix_free_rows([ops[:depth] for depth in depths], operators, variant, k=k,
                             seeds=[seed + depth for depth in depths], depths=depths, tau=tau,
                             method=method, tol=tol, n_probes=n_probes, steps=steps)
    return pd.DataFrame(rows, columns=_columns(False, n_probes))


def _matrix_free_rows(chains: list[list[LinearOperator]], counted: Sequence[_Op],
                      variant: str, *, k: int, seeds: list[int], depths: list[int], tau: float,
                      method: str, tol: float, n_probes: int, steps: int,
                      ablated: Optional[list[int]] = None) -> list[dict]:
    """One row per chain (P = its factors' product, the first applied first): the top-k
    singular values of every chain by one ``svds`` run in lockstep (start block from
    ``seeds[0]``), then their SLQ estimates in lockstep (chain j's probes from ``seeds[j]``),
    each step one sweep through the shared factors (``linalg.chains``). ``n_matvecs``: the
    applications of the operators among ``counted`` spent on the rows so far."""
    family = ChainProducts(chains, counted=[o for o in counted if isinstance(o, LinearOperator)])
    d = family.n
    spectra = list(svds(family.members, k, method=method, tol=tol, seed=seeds[0],
                        return_vectors=False).S)
    estimates: list[dict] = [{} for _ in chains]
    if n_probes:
        estimates = rank_estimates_of(family.members, n_probes=n_probes, steps=steps,
                                      seeds=seeds, tau=tau)
    spent = itertools.accumulate(family.spent)
    return [{**_rank_row(variant, depth, S, tau, k < d, n,
                         ablated_layer=ALL_LAYERS if ablated is None else ablated[j]), **est}
            for j, (depth, S, n, est) in enumerate(zip(depths, spectra, spent, estimates))]


def selected_depths(depths: Optional[Sequence[int]], n_layers: int, what: str) -> set[int]:
    """The depths to rank: every one of 1..n_layers (None), or those of ``depths``.

    >>> sorted(selected_depths([4, 1], 6, "example"))
    [1, 4]
    """
    if depths is None:
        return set(range(1, n_layers + 1))
    want = f"a non-empty list of depths in 1..{n_layers}"
    if isinstance(depths, (str, bytes)) or not isinstance(depths, Sequence) or not depths:
        raise OptionTypeError("depths", depths, want, hint=what)
    for depth in depths:
        check_int("depths", depth, minimum=1, maximum=n_layers, accepted=want, hint=what)
    return {int(depth) for depth in depths}


def _check_schur(operators: Sequence[_Op], d: int, what: str) -> None:
    if not all(isinstance(o, Tensor) for o in operators):
        raise ValueError(f"{what}: the schur ablation needs dense [d, d] tensors (dense "
                         f"mode, d <= SCHUR_MAX_D = {SCHUR_MAX_D}); got LinearOperators "
                         f"- pass op.to_dense() for small d")
    if d > SCHUR_MAX_D:
        raise ValueError(f"{what}: the schur ablation is dense-mode only and d = {d} "
                         f"exceeds the size limit SCHUR_MAX_D = {SCHUR_MAX_D}")


def _ablated(o: _Op, variant: str, dense: bool) -> _Op:
    if variant == "schur":
        return schur_diagonal(cast(Tensor, o).to(torch.float64))  # dense (_check_schur)
    if dense:
        M = _as_dense(o)
        return 0.5 * (M + M.T)
    return symmetric_part(_as_op(o))


def single_layer_ablation_table(operators: Sequence[_Op], *, variant: str,
                                layers: Optional[Sequence[int]] = None, k: int = 32,
                                dense: bool = False, seed: int = 0, tau: float = 1e-2,
                                method: str = "lanczos", tol: float = 1e-8, n_probes: int = 16,
                                steps: int = 48) -> pd.DataFrame:
    """The end-to-end effect of ablating one layer at a time: for each m, the ranks of
    P_L^(m) = J_L ... A(J_m) ... J_1 (A: ``variant``, "symmetric" or "schur" as in
    :func:`bottleneck_table`), one row per m at depth L, ``ablated_layer`` = ``layers[m]``
    (default: m). Exact for causal models, where the product of per-position blocks is P_L.

    >>> A = torch.diag(torch.tensor([1.0, 0.5, 0.0])).double(); A[0, 1] = 3.0
    >>> t = single_layer_ablation_table([A, torch.eye(3).double()], variant="schur",
    ...                                 dense=True)
    >>> t["ablated_layer"].tolist(), t["surviving"].tolist()
    ([0, 1], [2, 2])

    Dense: prefix and suffix products are formed once (3L matrix products in all).
    Matrix-free (symmetric only): one composed operator and one ``svds`` per layer, and the
    SLQ estimates of :func:`bottleneck_table` (``n_probes``, ``steps``; seed ``seed + m``).
    """
    what = "single_layer_ablation_table"
    d = _dims(operators, what)
    _check_probes(n_probes, steps, what)
    check_choice("variant", variant, ("symmetric", "schur"), hint=what)
    layers = list(range(len(operators))) if layers is None else list(layers)
    if len(layers) != len(operators):
        raise ValueError(f"{what}: {len(layers)} layer labels for {len(operators)} operators")
    if variant == "schur":
        _check_schur(operators, d, what)
        dense = True
    if dense:
        return _single_layer_dense(operators, variant, layers, tau)
    check_int("k", k, minimum=1, maximum=d, accepted=f"an int with 1 <= k <= d = {d}", hint=what)
    ops = [_as_op(o) for o in operators]
    chains = [ops[:m] + [cast(LinearOperator, _ablated(ops[m], variant, dense=False))] + ops[m + 1:]
              for m in range(len(ops))]
    rows = _matrix_free_rows(chains, operators, variant, k=k,
                             seeds=[seed + m for m in range(len(ops))],
                             depths=[len(ops)] * len(ops), tau=tau, method=method, tol=tol,
                             n_probes=n_probes, steps=steps, ablated=layers)
    return pd.DataFrame(rows, columns=_columns(False, n_probes))


def _single_layer_dense(operators: Sequence[_Op], variant: str, layers: list[int],
                        tau: float) -> pd.DataFrame:
    mats = [_as_dense(o) for o in operators]
    eye = torch.eye(mats[0].shape[0], dtype=torch.float64, device=mats[0].device)
    before = [eye]  # before[m] = J_{m-1} ... J_1 (applied first)
    for M in mats[:-1]:
        before.append(M @ before[-1])
    after = [eye]  # after[j] = J_L ... J_{L-j+1}
    for M in reversed(mats[1:]):
        after.append(after[-1] @ M)
    rows = []
    for m, layer in enumerate(layers):
        P = after[len(mats) - 1 - m] @ cast(Tensor, _ablated(mats[m], variant, dense=True)) @ before[m]
        rows.append(_rank_row(variant, len(mats), torch.linalg.svdvals(P), tau, False, 0,
                              ablated_layer=layer))
    return pd.DataFrame(rows, columns=list(BOTTLENECK_COLUMNS))


def end_to_end_table(products: Sequence[_Op], *, k: int = 32, variant: str = "trained",
                     dense: bool = False, seed: int = 0, tau: float = 1e-2,
                     method: str = "lanczos", tol: float = 1e-8, n_probes: int = 16,
                     steps: int = 48, depths: Optional[Sequence[int]] = None) -> pd.DataFrame:
    """The ranks of :func:`bottleneck_table` (at ``depths``, all by default) from the end-to-end
    Jacobians P_1, ..., P_L
    themselves (``linearize.end_to_end``: exact for bidirectional models, where the product of
    per-position blocks is not P_l); matrix-free, with the SLQ estimates of
    :func:`bottleneck_table` (``n_probes``, ``steps``; seed ``seed + depth``), every depth in
    lockstep (one ``svds`` and one quadrature; products from one ``linalg.ChainProducts``,
    as ``linearize.end_to_end`` makes them, share each sweep through their common factors).

    >>> P = [torch.diag(torch.tensor([1.0, 0.5, 0.0])).double()] * 2
    >>> end_to_end_table(P, dense=True)["surviving"].tolist()
    [2, 2]
    """
    what = "end_to_end_table"
    d = _dims(products, what)
    _check_probes(n_probes, steps, what)
    check_choice("variant", variant, ("trained", "init"), hint=what)
    wanted = selected_depths(depths, len(products), what)
    if not dense:
        check_int("k", k, minimum=1, maximum=d, accepted=f"an int with 1 <= k <= d = {d}",
                  hint=what)
        chains, counted = _chains_of(products)
        picked = sorted(wanted)
        rows = _matrix_free_rows([chains[depth - 1] for depth in picked], counted, variant, k=k,
                                 seeds=[seed + depth for depth in picked], depths=picked,
                                 tau=tau, method=method, tol=tol, n_probes=n_probes,
                                 steps=steps)
        return pd.DataFrame(rows, columns=_columns(False, n_probes))
    rows = []
    for depth, P in enumerate(products, start=1):
        if depth in wanted:
            s = torch.linalg.svdvals(_as_dense(P))
            rows.append(_rank_row(variant, depth, s, tau, False, _count(products)))
    return pd.DataFrame(rows, columns=_columns(True, n_probes))


def _chains_of(products: Sequence[_Op]) -> tuple[list[list[LinearOperator]], Sequence[_Op]]:
    """The factor chains of ``products`` and the operators that count their work: those of
    their ``linalg.ChainProducts`` where all are its members (``linearize.end_to_end``: the
    depths then share each sweep through the stack), else each product its own chain."""
    groups = {id(getattr(P, "batch_group", None)) for P in products}
    group = getattr(products[0], "batch_group", None)
    if len(groups) == 1 and isinstance(group, ChainProducts):
        return [group.chains[getattr(P, "batch_index")] for P in products], group.counted
    return [[_as_op(P)] for P in products], products


def propagation_table(operators: Sequence[_Op], *, start_layer: int = 0,
                      vector: Optional[Tensor] = None, seed: int = 0, k: int = 8,
                      tol: float = 1e-8) -> pd.DataFrame:
    """Push a perturbation x through the chained JVPs x <- J_l x from ``start_layer`` on.

    >>> D = torch.diag(torch.tensor([2.0, 1.0, 1.0, 1.0], dtype=torch.float64))
    >>> t = propagation_table([D, D], vector=torch.tensor([1.0, 0, 0, 0]), k=1)
    >>> t["norm"].tolist(), t["growth"].tolist(), [round(a, 12) for a in t["alignment_top"]]
    ([2.0, 4.0], [2.0, 2.0], [1.0, 1.0])

    One row per layer l >= start_layer (x_l enters layer l, x_{l+1} = J_l x_l leaves it):
    ``norm`` = ||x_{l+1}||, ``growth`` = ||x_{l+1}|| / ||x_l||, ``alignment_top`` =
    ||U_k^T x_{l+1}|| / ||x_{l+1}|| with U_k the top-k left singular vectors of J_l
    (``linalg.svds``), ``alignment_in`` = ||V_k^T x_l|| / ||x_l|| with the right ones, and
    ``alignment_null`` = E ||U_k^T u|| for u uniform on the sphere (``nulls.gamma_null``).
    ``vector`` defaults to a random unit vector (``seed``); a given one is used as is.
    """
    what = "propagation_table"
    d = _dims(operators, what)
    L = len(operators)
    check_int("start_layer", start_layer, minimum=0, maximum=L - 1, hint=what)
    check_int("k", k, minimum=1, maximum=d, accepted=f"an int with 1 <= k <= d = {d}", hint=what)
    if vector is None:
        g = torch.Generator().manual_seed(int(seed))
        x = torch.randn(d, generator=g, dtype=torch.float64)
        x = (x / torch.linalg.vector_norm(x)).to(operators[0].device)
    else:
        check_type("vector", vector, Tensor, f"a tensor [{d}]", hint=what)
        if tuple(vector.shape) != (d,):
            raise OptionError("vector", vector, f"a tensor [{d}]", hint=what)
        x = vector.to(torch.float64)
    if float(torch.linalg.vector_norm(x)) == 0 or not bool(torch.isfinite(x).all()):
        raise OptionError("vector", "a zero or non-finite perturbation",
                          "a finite, non-zero vector", hint=what)
    null = gamma_null(d, k)
    rows = []
    for layer in range(start_layer, L):
        op = _as_op(operators[layer])
        res = svds(op, k, tol=tol, seed=seed + 1 + layer)
        y = op.matvec(x.to(op.dtype)).to(torch.float64)
        nx, ny = float(torch.linalg.vector_norm(x)), float(torch.linalg.vector_norm(y))
        assert res.U is not None and res.Vh is not None  # svds returns vectors by default
        U, V = res.U.to(torch.float64), res.Vh.mH.to(torch.float64)
        rows.append(dict(
            layer=layer, norm=ny, growth=ny / nx if nx > 0 else float("nan"),
            alignment_top=float(torch.linalg.vector_norm(U.T @ y)) / ny if ny > 0
            else float("nan"),
            alignment_in=float(torch.linalg.vector_norm(V.T @ x)) / nx if nx > 0
            else float("nan"),
            alignment_null=null, k=k))
        x = y
    return pd.DataFrame(rows, columns=list(PROPAGATION_COLUMNS))
