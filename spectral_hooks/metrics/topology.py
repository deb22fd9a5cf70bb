"""Topology of residual units (METRICS.md section 3): correlation graph, communities, bridges.

Example::

    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> f = torch.randn(500, 2, generator=g, dtype=torch.float64)        # two latent factors
    >>> load = torch.zeros(2, 24, dtype=torch.float64)
    >>> load[0, :10] = 1.0; load[1, 10:20] = 1.0; load[:, 20:] = 1.0       # 4 bridge units
    >>> X = f @ load + 0.5 * torch.randn(500, 24, generator=g, dtype=torch.float64)
    >>> G = unit_graph(X, top_k=5)
    >>> C = communities(G, seed=0)
    >>> bool((C.labels[:10] == C.labels[0]).all()), bool(C.labels[0] != C.labels[10])
    (True, True)
    >>> P = participation(G, C.labels)
    >>> sorted(P.argsort(descending=True)[:4].tolist())                  # the bridge units
    [20, 21, 22, 23]
    >>> amp = torch.ones(24, dtype=torch.float64); amp[20:] = 3.0
    >>> rho, p = spearman(P, amp)
    >>> rho > 0.5 and p < 1e-3
    True

Definitions (all float64):

- :func:`unit_graph`: nodes are the d units (columns of ``X[N, d]``), the weight of (i, j) is
  the Pearson correlation of units i and j over the N tokens. A constant unit (centred norm
  <= 1e-12 times the largest centred norm) has correlation 0 with every unit, so no edges.
  Each node keeps its ``top_k`` edges by |weight| (self excluded, ties broken by
  ``torch.topk``), the kept sets are symmetrised (an edge exists if either endpoint keeps it),
  and edges of weight exactly 0 are dropped.
- :func:`communities`: signed Leiden (``leidenalg.find_partition_multiplex`` with
  ``ModularityVertexPartition`` on the positive-weight graph and on the |negative|-weight graph,
  layer weights [1, -1], fixed seed, leidenalg's default 2 iterations); fallback when
  leidenalg or igraph is missing, or forced with ``method="louvain"``: Louvain on |weight| with
  ``networkx.community.louvain_communities(seed=seed)`` (logged at WARNING when it is a
  fallback). ``modularity`` is always that of the returned partition on the |weight| graph,
  Q = sum_c [W_c / m - (D_c / 2m)^2] (W_c: weight inside c, D_c: total degree of c,
  m: total weight; resolution 1), which equals ``networkx.community.modularity``; NaN for a
  graph with no edges.
- :func:`participation`: bridge score P_i = 1 - sum_c (k_{i,c} / k_i)^2 with k over |weights|
  (P_i = 0 when k_i = 0).
- :func:`amplification`: g_i = ||Delta J e_i||, exact in dense mode, else
  sqrt(max(0, Hutchinson estimate of diag(Delta J^T Delta J))) via
  :func:`spectral_hooks.linalg.column_norms_sq`; :func:`community_amplification` gives
  ||Delta J Pi_C||_F^2 / |C| = mean over C of g_i^2.
- :func:`spearman`: rank correlation with averaged ties and its two-sided p-value (exact
  permutation test for n <= 8, else the t-approximation with n - 2 degrees of freedom, as
  ``scipy.stats.spearmanr``), computed by :func:`spectral_hooks.metrics.trends.depth_trend`.
- :func:`topology_tables`: everything per layer, with the coupling (Spearman of bridge score vs
  amplification) and its two controls (amplification at initialisation; community labels
  shuffled among units).

The graph, community and bridge-score functions (:func:`unit_graph` to :func:`participation`)
live in `spectral_hooks.metrics.correlation_graph` and are re-exported here.

networkx, igraph and leidenalg are optional (``pip install spectral_hooks[topology]``) and
imported only inside the functions that use them.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping, NamedTuple, Optional, Union, cast

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from spectral_hooks.linalg import LinearOperator, column_norms_sq

from ..checks import check_choice, check_int, check_type
from ..errors import OptionError, OptionTypeError
from .correlation_graph import (
    COMMUNITY_METHODS,
    CONSTANT_RTOL,
    Communities,
    UnitGraph,
    checked_labels,
    checked_matrix,
    checked_vector,
    communities,
    modularity,
    participation,
    unit_graph,
)
from .stats import with_adjusted
from .trends import depth_trend

__all__ = ["UnitGraph", "Communities", "unit_graph", "communities", "modularity",
           "participation", "amplification", "community_amplification", "spearman",
           "log_gain", "topology_tables", "signed_bridge_gain", "TOPOLOGY_COLUMNS", "UNITS_COLUMNS",
           "TOPOLOGY_PVALUES", "CONSTANT_RTOL", "UnitNorms"]

TOPOLOGY_COLUMNS = ["layer", "n_communities", "modularity", "method", "coupling_rho",
                    "coupling_pvalue", "coupling_pvalue_adj", "coupling_rho_init",
                    "coupling_pvalue_init", "coupling_pvalue_init_adj", "coupling_rho_shuffled",
                    "coupling_pvalue_shuffled", "coupling_pvalue_shuffled_adj",
                    "bridge_gain_rho", "bridge_gain_pvalue", "bridge_gain_pvalue_adj",
                    "bridge_gain_rho_init", "bridge_gain_pvalue_init",
                    "bridge_gain_pvalue_init_adj", "bridge_gain_rho_vs_init",
                    "bridge_gain_pvalue_vs_init", "bridge_gain_pvalue_vs_init_adj",
                    "bridge_log_gain", "bridge_log_gain_init", "n_units", "n_tokens"]
#: share of units with the highest bridge score that ``bridge_log_gain`` averages over
BRIDGE_QUANTILE = 0.9
UNITS_COLUMNS = ["layer", "unit", "community", "bridge_score", "amplification", "log_gain",
                 "log_gain_init"]
#: p-value columns of the topology table, each adjusted over the layers (one family per column)
TOPOLOGY_PVALUES = ("coupling_pvalue", "coupling_pvalue_init", "coupling_pvalue_shuffled",
                    "bridge_gain_pvalue", "bridge_gain_pvalue_init", "bridge_gain_pvalue_vs_init")


# -- amplification -----------------------------------------------------------------------------

class UnitNorms(NamedTuple):
    """Per-unit values [d] (float64, CPU), whether they are estimates, and their standard
    errors (zeros where exact; NaN where the value is)."""

    value: Tensor
    estimated: bool
    std_error: Tensor


def amplification(delta_J: Union[Tensor, LinearOperator], *, dense: bool = False,
                  n_samples: int = 64, seed: int = 0) -> UnitNorms:
    """Per-unit amplification g_i = ||Delta J e_i||, whether it is an estimate, and its
    standard error.

    >>> import torch
    >>> D = torch.tensor([[3., 0.], [4., 1.]], dtype=torch.float64)
    >>> amplification(D, dense=True).value
    tensor([5., 1.], dtype=torch.float64)
    >>> from spectral_hooks.linalg import DenseOperator
    >>> g, is_est, se = amplification(DenseOperator(D), n_samples=256, seed=0)
    >>> is_est, g.shape, bool((se > 0).all())
    (True, torch.Size([2]), True)

    ``dense=True``: ``delta_J`` must be a tensor [m, d]; exact column norms (standard error 0).
    Otherwise (``delta_J`` a LinearOperator with an adjoint, or a tensor): the Hutchinson
    diagonal c_i of Delta J^T Delta J with ``n_samples`` Rademacher probes (2 n_samples
    products), square-rooted after clipping negative estimates at 0; the standard error of
    g_i = sqrt(c_i) by the delta method, se(c_i) / (2 g_i), and sqrt(se(c_i)) where g_i is 0
    (clipped: the scale of the error there).
    """
    what = "amplification"
    if dense:
        if not isinstance(delta_J, Tensor) or delta_J.ndim != 2:
            raise OptionTypeError("delta_J", delta_J, "a tensor [m, d] (dense=True)", hint=what)
        D = delta_J.detach().to("cpu")
        D = D if D.is_complex() else D.to(torch.float64)
        if not bool(torch.isfinite(D).all()):
            raise OptionError("delta_J", "a tensor holding NaN or Inf", "finite values",
                              hint=what)
        g = torch.linalg.vector_norm(D, dim=0).to(torch.float64)
        return UnitNorms(g, False, torch.zeros_like(g))
    n_samples = check_int("n_samples", n_samples, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    check_type("delta_J", delta_J, (Tensor, LinearOperator),
               "a tensor [m, d] or a LinearOperator", hint=what)
    if isinstance(delta_J, Tensor) and delta_J.ndim != 2:
        raise OptionError("delta_J", delta_J, "a tensor [m, d] or a LinearOperator", hint=what)
    est = column_norms_sq(delta_J, n_samples=n_samples, seed=seed)
    c = torch.as_tensor(est.value).detach().to("cpu", torch.float64)
    se_c = torch.as_tensor(est.std_error).detach().to("cpu", torch.float64)
    g = c.clamp(min=0.0).sqrt()
    se = torch.where(g > 0, se_c / (2 * g).clamp(min=1e-300), se_c.sqrt())
    return UnitNorms(g, True, se)


def log_gain(J: Union[Tensor, LinearOperator], *, dense: bool = False, n_samples: int = 64,
             seed: int = 0) -> UnitNorms:
    """Signed per-unit gain log ||J e_i|| of the whole block Jacobian J (identity included),
    whether it is an estimate, and its standard error: > 0 the block amplifies unit i, < 0 it
    suppresses it.

    >>> import torch
    >>> J = torch.tensor([[2., 0.], [0., 0.5]], dtype=torch.float64)
    >>> log_gain(J, dense=True).value.exp()
    tensor([2.0000, 0.5000], dtype=torch.float64)

    The column norms of :func:`amplification` applied to J instead of Delta J (matrix-free:
    the Hutchinson diagonal of J^T J); a non-positive estimate gives NaN, not -inf. Standard
    error by the delta method: se(g_i) / g_i.
    """
    g, estimated, se = amplification(J, dense=dense, n_samples=n_samples, seed=seed)
    nan = torch.full_like(g, float("nan"))
    positive = g > 0
    return UnitNorms(torch.where(positive, g.clamp(min=1e-300).log(), nan), estimated,
                     torch.where(positive, se / g.clamp(min=1e-300), nan))


def community_amplification(delta_J_dense_or_g: Tensor, labels: Any) -> Tensor:
    """Per community C: ||Delta J Pi_C||_F^2 / |C| = mean of g_i^2 over C (float64 [K]).

    >>> import torch
    >>> community_amplification(torch.tensor([1., 3., 2.]), torch.tensor([0, 0, 1]))
    tensor([5., 4.], dtype=torch.float64)

    The first argument is either dense Delta J [m, d] or the amplification vector g [d]
    (e.g. from :func:`amplification`). ``labels``: one community label per unit (ints >= 0:
    a tensor, an array or a sequence) or :class:`Communities`. Entry c is for label c; labels
    with no units give NaN.
    """
    what = "community_amplification"
    x = delta_J_dense_or_g
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    want = "dense Delta J [m, d] or the amplification g [d]"
    check_type("delta_J_dense_or_g", x, Tensor, want, hint=what)
    if x.ndim not in (1, 2):
        raise OptionError("delta_J_dense_or_g", x, want, hint=what)
    x = x.detach().to("cpu")
    x = x if x.is_complex() else x.to(torch.float64)
    if not bool(torch.isfinite(x).all()):
        raise OptionError("delta_J_dense_or_g", "a tensor holding NaN or Inf", "finite values",
                          hint=what)
    g2 = (x.abs() ** 2 if x.ndim == 1 else (x.abs() ** 2).sum(0)).to(torch.float64)
    lab = checked_labels(labels, g2.shape[0], what)
    n_c = int(lab.max()) + 1 if len(lab) else 0
    tot = torch.zeros(n_c, dtype=torch.float64).index_add_(0, lab, g2)
    cnt = torch.zeros(n_c, dtype=torch.float64).index_add_(0, lab, torch.ones_like(g2))
    return torch.where(cnt > 0, tot / cnt.clamp(min=1), torch.full_like(tot, float("nan")))


# -- coupling ----------------------------------------------------------------------------------

def spearman(a: Any, b: Any) -> tuple[float, float]:
    """Spearman rho of ``a`` and ``b`` (tensors, arrays or sequences of numbers) and its
    two-sided p-value (no scipy).

    >>> rho, p = spearman([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [2, 1, 4, 3, 6, 5, 8, 7, 10, 9])
    >>> round(rho, 6), round(p, 9)
    (0.939394, 5.4841e-05)

    Pairs with a non-finite value are dropped; fewer than 3 pairs left or a constant side gives
    (nan, nan). Ties get their average rank. p: exact permutation test for n <= 8, else the
    t-approximation with n - 2 degrees of freedom (as ``scipy.stats.spearmanr``).
    """
    x = np.asarray(a.detach().cpu().numpy() if isinstance(a, Tensor) else a,
                   dtype=np.float64)
    y = np.asarray(b.detach().cpu().numpy() if isinstance(b, Tensor) else b,
                   dtype=np.float64)
    if x.ndim != 1 or y.ndim != 1 or x.shape != y.shape:
        raise OptionError("b", f"an array of shape {y.shape} against a of shape {x.shape}",
                          "a and b 1-dimensional of equal length", hint="spearman")
    keep = np.isfinite(x) & np.isfinite(y)
    return depth_trend(y[keep], x[keep])


def _coupling_input(g, layer, d: int, what: str, name: str) -> Tensor:
    g = checked_vector(g, what, f"{name}[{layer}]")
    if g.shape[0] != d:
        raise OptionError(f"{name}[{layer}]", g, f"{d} entries, one per unit of X_by_layer"
                          f"[{layer}]", hint=what)
    return g.to(torch.float64)


def _optional_vector(values: Optional[Mapping[int, Tensor]], layer, d: int, what: str,
                     name: str) -> Optional[Tensor]:
    if values is None or layer not in values:
        return None
    return _coupling_input(values[layer], layer, d, what, name)


def signed_bridge_gain(P: Tensor, gain: Optional[Tensor], gain_init: Optional[Tensor] = None,
                       *, quantile: float = BRIDGE_QUANTILE) -> Dict[str, float]:
    """The signed test of "bridges are suppressed / amplified": Spearman of bridge score P_i vs
    the signed gain log ||J e_i|| (> 0: the more a unit bridges communities, the more the block
    amplifies it; < 0: suppresses it), at init, and vs the paired change log_gain - log_gain_init
    (what training did to bridges relative to other units); and the mean signed gain of the
    bridges, the units with P_i at or above the ``quantile`` of P (absolute: < 0 suppressed).
    Units with a non-finite gain are left out. NaN where a gain is not given.

    >>> import torch
    >>> P = torch.linspace(0, 1, 10, dtype=torch.float64)
    >>> out = signed_bridge_gain(P, -P, P)
    >>> out["bridge_gain_rho"], out["bridge_gain_rho_vs_init"], round(out["bridge_log_gain"], 3)
    (-1.0, -1.0, -1.0)
    """
    nan = float("nan")

    def rho(g):
        if g is None:
            return nan, nan
        ok = torch.isfinite(g)
        return spearman(P[ok], g[ok]) if int(ok.sum()) >= 3 else (nan, nan)

    def bridges(g):
        if g is None:
            return nan
        top = (P >= torch.quantile(P, quantile)) & torch.isfinite(g)
        return float(g[top].mean()) if bool(top.any()) else nan

    r, p = rho(gain)
    r0, p0 = rho(gain_init)
    rd, pd_ = rho(gain - gain_init if gain is not None and gain_init is not None else None)
    return {"bridge_gain_rho": r, "bridge_gain_pvalue": p, "bridge_gain_rho_init": r0,
            "bridge_gain_pvalue_init": p0, "bridge_gain_rho_vs_init": rd,
            "bridge_gain_pvalue_vs_init": pd_, "bridge_log_gain": bridges(gain),
            "bridge_log_gain_init": bridges(gain_init)}


def _nan_vector(x: Optional[Tensor], d: int) -> np.ndarray:
    return np.full(d, np.nan) if x is None else x.numpy()


def topology_tables(X_by_layer: Mapping[int, Tensor], g_by_layer: Mapping[int, Tensor], *,
                    g_init_by_layer: Optional[Mapping[int, Tensor]] = None, top_k: int = 10,
                    seed: int = 0, n_shuffles: int = 20, method: str = "auto",
                    gain_by_layer: Optional[Mapping[int, Tensor]] = None,
                    gain_init_by_layer: Optional[Mapping[int, Tensor]] = None
                    ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-layer topology table and per-unit table.

    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> X = {0: torch.randn(200, 12, generator=g, dtype=torch.float64)}
    >>> amp = {0: torch.rand(12, generator=g, dtype=torch.float64)}
    >>> topo, units = topology_tables(X, amp, top_k=3, n_shuffles=5)
    >>> list(topo.columns) == TOPOLOGY_COLUMNS, list(units.columns) == UNITS_COLUMNS
    (True, True)
    >>> len(units)
    12

    ``X_by_layer[l]``: residual activations [N tokens, d units] of layer l; ``g_by_layer[l]``:
    amplification [d] (same layers); ``g_init_by_layer``: the amplification at initialisation
    (optional; a layer missing from it gives NaN); ``gain_by_layer`` / ``gain_init_by_layer``:
    the signed gains log ||J e_i|| (:func:`log_gain`) of the trained and the initialised block,
    copied to the units table (NaN where not given). Per layer: :func:`unit_graph`,
    :func:`communities` (``seed``, ``method``), :func:`participation` as bridge score, and

    - ``coupling_rho``, ``coupling_pvalue``: :func:`spearman` of bridge score vs amplification;
    - ``coupling_rho_init``, ``coupling_pvalue_init``: the same bridge scores vs the
      amplification at initialisation;
    - ``coupling_rho_shuffled``: mean over ``n_shuffles`` random permutations of the community
      labels among units (bridge scores recomputed on the same graph) of the coupling
      (NaN when n_shuffles = 0); ``coupling_pvalue_shuffled``: the two-sided empirical p-value
      of the observed coupling against those permutations, (1 + #{|rho_perm| >= |rho|}) /
      (n + 1). Permutations come from ``torch.Generator`` seeded with (seed, layer);
    - ``bridge_gain_*``, ``bridge_log_gain*``: the signed test of :func:`signed_bridge_gain`
      (the coupling above uses the unsigned ||Delta J e_i||), from ``gain_by_layer`` and
      ``gain_init_by_layer``;
    - ``*_adj``: each p-value column Benjamini-Hochberg adjusted over the layers of the table.
    """
    what = "topology_tables"
    check_type("X_by_layer", X_by_layer, Mapping, "a mapping layer -> tensor", hint=what)
    check_type("g_by_layer", g_by_layer, Mapping, "a mapping layer -> tensor", hint=what)
    for name, value in (("g_init_by_layer", g_init_by_layer), ("gain_by_layer", gain_by_layer),
                        ("gain_init_by_layer", gain_init_by_layer)):
        check_type(name, value, (Mapping, type(None)), "a mapping layer -> tensor or None",
                   hint=what)
    if set(X_by_layer) != set(g_by_layer):
        raise OptionError("g_by_layer", f"layers {sorted(g_by_layer)}", "the same layers as "
                          f"X_by_layer, {sorted(X_by_layer)}", hint=what)
    check_choice("method", method, COMMUNITY_METHODS)
    seed = check_int("seed", seed, minimum=0)
    n_shuffles = check_int("n_shuffles", n_shuffles, minimum=0)
    top_k = check_int("top_k", top_k, minimum=1)
    rows, unit_frames = [], []
    for layer in sorted(X_by_layer):
        X = checked_matrix(X_by_layer[layer], what, f"X_by_layer[{layer}]")
        N, d = X.shape
        g = _coupling_input(g_by_layer[layer], layer, d, what, "g_by_layer")
        g0 = _optional_vector(g_init_by_layer, layer, d, what, "g_init_by_layer")
        gain = _optional_vector(gain_by_layer, layer, d, what, "gain_by_layer")
        gain0 = _optional_vector(gain_init_by_layer, layer, d, what, "gain_init_by_layer")
        graph = unit_graph(X, top_k=top_k)
        del X
        comm = communities(graph, seed=seed, method=method)
        P = participation(graph, comm.labels)
        rho, p = spearman(P, g)
        rho_init, p_init = spearman(P, g0) if g0 is not None else (float("nan"),) * 2
        gen = torch.Generator().manual_seed(seed * 1_000_003 + int(layer))
        shuffled = [spearman(participation(graph, comm.labels[torch.randperm(d, generator=gen)]),
                             g)[0] for _ in range(n_shuffles)]
        shuffled = np.array([r for r in shuffled if math.isfinite(r)])
        p_shuffled = (float("nan") if not len(shuffled) or not math.isfinite(rho) else
                      (1 + int((np.abs(shuffled) >= abs(rho) - 1e-12).sum())) / (len(shuffled) + 1))
        rows.append(dict(layer=layer, n_communities=comm.n_communities,
                         modularity=comm.modularity, method=comm.method, coupling_rho=rho,
                         coupling_pvalue=p, coupling_rho_init=rho_init,
                         coupling_pvalue_init=p_init,
                         coupling_rho_shuffled=float(shuffled.mean()) if len(shuffled)
                         else float("nan"), coupling_pvalue_shuffled=p_shuffled,
                         **signed_bridge_gain(P, gain, gain0), n_units=d, n_tokens=N))
        unit_frames.append(pd.DataFrame(dict(
            layer=np.full(d, layer), unit=np.arange(d), community=comm.labels.numpy(),
            bridge_score=P.numpy(), amplification=g.numpy(), log_gain=_nan_vector(gain, d),
            log_gain_init=_nan_vector(gain0, d))))
    topo = with_adjusted(pd.DataFrame(rows, columns=[c for c in TOPOLOGY_COLUMNS
                                                     if not c.endswith("_adj")]),
                         TOPOLOGY_PVALUES)
    units = (pd.concat(unit_frames, ignore_index=True) if unit_frames
             else pd.DataFrame(columns=UNITS_COLUMNS))
    return cast(pd.DataFrame, topo[TOPOLOGY_COLUMNS]), cast(pd.DataFrame, units[UNITS_COLUMNS])
