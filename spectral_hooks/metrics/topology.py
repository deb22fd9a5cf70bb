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

networkx, igraph and leidenalg are optional (``pip install spectral_hooks[topology]``) and
imported only inside the functions that use them.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Mapping, Optional, Union

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from spectral_hooks.linalg import LinearOperator, column_norms_sq

from .trends import depth_trend

__all__ = ["UnitGraph", "Communities", "unit_graph", "communities", "modularity",
           "participation", "amplification", "community_amplification", "spearman",
           "topology_tables", "TOPOLOGY_COLUMNS", "UNITS_COLUMNS", "CONSTANT_RTOL"]

logger = logging.getLogger(__name__)

CONSTANT_RTOL = 1e-12  # a unit is constant when its centred norm <= CONSTANT_RTOL * the largest

TOPOLOGY_COLUMNS = ["layer", "n_communities", "modularity", "method", "coupling_rho",
                    "coupling_pvalue", "coupling_rho_init", "coupling_rho_shuffled",
                    "n_units", "n_tokens"]
UNITS_COLUMNS = ["layer", "unit", "community", "bridge_score", "amplification"]

_METHODS = ("auto", "leiden", "louvain")


@dataclass(frozen=True)
class UnitGraph:
    """Top-k correlation graph of d units; see :func:`unit_graph`.

    weights:        float64 [d, d], symmetric, zero diagonal, zero where there is no edge.
    edges:          int64 [E, 2], each undirected edge once, i < j, sorted.
    edge_weights:   float64 [E], the signed correlation of each edge.
    constant_units: bool [d], units with (numerically) zero variance over the tokens.
    top_k:          edges kept per node before symmetrisation.
    n_tokens:       N, the tokens the correlations were computed over.
    """

    weights: Tensor
    edges: Tensor
    edge_weights: Tensor
    constant_units: Tensor
    top_k: int
    n_tokens: int

    @property
    def n_units(self) -> int:
        return int(self.weights.shape[0])

    @property
    def n_edges(self) -> int:
        return int(self.edges.shape[0])


@dataclass(frozen=True)
class Communities:
    """A partition of the units; see :func:`communities`.

    labels:        int64 [d] in 0..n_communities-1, numbered by decreasing size (ties: the
                   community holding the smaller unit index first).
    modularity:    of this partition on the |weight| graph (NaN without edges).
    method:        "leiden" (signed, leidenalg) or "louvain" (|weight|, networkx).
    """

    labels: Tensor
    n_communities: int
    modularity: float
    method: str


# -- validation helpers ------------------------------------------------------------------------

def _check_int(value, name: str, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{what}: {name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def _as_matrix(X, what: str) -> Tensor:
    if isinstance(X, np.ndarray):
        X = torch.from_numpy(X)
    if not isinstance(X, Tensor):
        raise TypeError(f"{what}: X must be a tensor [N, d], got {type(X).__name__}")
    if X.ndim != 2:
        raise ValueError(f"{what}: X must be 2-dimensional [N tokens, d units], got shape "
                         f"{tuple(X.shape)}")
    if X.is_complex():
        raise ValueError(f"{what}: X must be real, got {X.dtype}")
    X = X.detach().to(device="cpu", dtype=torch.float64)
    if not bool(torch.isfinite(X).all()):
        raise ValueError(f"{what}: X contains NaN or Inf")
    return X


def _as_vector(v, what: str, name: str, n: Optional[int] = None) -> Tensor:
    if isinstance(v, np.ndarray):
        v = torch.from_numpy(v)
    if not isinstance(v, Tensor):
        v = torch.as_tensor(np.asarray(v, dtype=np.float64))
    if v.ndim != 1:
        raise ValueError(f"{what}: {name} must be 1-dimensional, got shape {tuple(v.shape)}")
    if n is not None and v.shape[0] != n:
        raise ValueError(f"{what}: {name} has {v.shape[0]} entries, expected {n}")
    return v.detach().to("cpu")


def _as_labels(labels, d: int, what: str) -> Tensor:
    if isinstance(labels, Communities):
        labels = labels.labels
    lab = _as_vector(labels, what, "labels", d)
    if lab.is_floating_point() or lab.is_complex() or lab.dtype == torch.bool:
        raise ValueError(f"{what}: labels must be integers, got {lab.dtype}")
    lab = lab.to(torch.int64)
    if d and int(lab.min()) < 0:
        raise ValueError(f"{what}: labels must be >= 0")
    return lab


def _graph_edges(graph, what: str) -> tuple[int, Tensor, Tensor, Tensor]:
    """(d, i, j, w) with i < j for a UnitGraph or a symmetric dense weight tensor [d, d]."""
    if isinstance(graph, UnitGraph):
        return graph.n_units, graph.edges[:, 0], graph.edges[:, 1], graph.edge_weights
    if isinstance(graph, Tensor) and graph.ndim == 2 and graph.shape[0] == graph.shape[1]:
        W = graph.detach().to("cpu", torch.float64)
        if not bool(torch.isfinite(W).all()):
            raise ValueError(f"{what}: weight matrix contains NaN or Inf")
        if not torch.equal(W, W.T):
            raise ValueError(f"{what}: weight matrix must be symmetric")
        i, j = torch.triu_indices(W.shape[0], W.shape[0], offset=1)
        w = W[i, j]
        keep = w != 0
        return int(W.shape[0]), i[keep], j[keep], w[keep]
    raise TypeError(f"{what}: graph must be a UnitGraph or a symmetric tensor [d, d], got "
                    f"{type(graph).__name__}")


# -- graph -------------------------------------------------------------------------------------

def unit_graph(X: Tensor, *, top_k: int = 10) -> UnitGraph:
    """Top-k Pearson-correlation graph of the d units (columns) of ``X[N, d]``.

    >>> import torch
    >>> X = torch.tensor([[1., 2., 0., 5.], [2., 4., 1., 5.], [3., 7., 0., 5.]])
    >>> G = unit_graph(X, top_k=1)
    >>> G.edges.tolist(), G.constant_units.tolist()        # unit 3 is constant: no edges
    ([[0, 1], [1, 2]], [False, False, False, True])
    >>> round(float(G.weights[0, 1]), 4)
    0.9934

    Raises ValueError for fewer than 3 tokens, fewer than 2 units, ``top_k`` outside
    1..d-1, or non-finite entries. Memory: a centred float64 copy of X plus a few [d, d]
    float64 matrices (d = 4096: 128 MiB each).
    """
    what = "unit_graph"
    X = _as_matrix(X, what)
    N, d = X.shape
    if N < 3:
        raise ValueError(f"{what}: need at least 3 tokens to correlate units, got N={N}")
    if d < 2:
        raise ValueError(f"{what}: need at least 2 units, got d={d}")
    top_k = _check_int(top_k, "top_k", what, 1)
    if top_k >= d:
        raise ValueError(f"{what}: top_k must be < d (the number of other units), got "
                         f"top_k={top_k}, d={d}")
    Xc = X - X.mean(dim=0, keepdim=True)
    norms = torch.linalg.vector_norm(Xc, dim=0)
    constant = norms <= CONSTANT_RTOL * float(norms.max())
    scale = torch.where(constant, torch.zeros_like(norms),
                        1.0 / norms.clamp(min=torch.finfo(torch.float64).tiny))
    Xc.mul_(scale)
    C = Xc.T @ Xc
    del Xc
    C = (C + C.T) / 2                      # exact symmetry
    C.clamp_(-1.0, 1.0)
    C.fill_diagonal_(0.0)
    A = C.abs()
    A.fill_diagonal_(-1.0)                 # never select self
    idx = torch.topk(A, top_k, dim=1).indices
    del A
    keep = torch.zeros(d, d, dtype=torch.bool)
    keep.scatter_(1, idx, True)
    keep |= keep.T.clone()
    keep &= C != 0
    W = torch.where(keep, C, torch.zeros((), dtype=torch.float64))
    del C
    ij = torch.triu(keep, diagonal=1).nonzero()           # row-major: sorted by (i, j)
    return UnitGraph(weights=W, edges=ij, edge_weights=W[ij[:, 0], ij[:, 1]].clone(),
                     constant_units=constant, top_k=top_k, n_tokens=N)


# -- communities -------------------------------------------------------------------------------

def modularity(graph, labels) -> float:
    """Modularity of ``labels`` on the |weight| graph (resolution 1), as networkx computes it.

    >>> import torch
    >>> W = torch.zeros(4, 4, dtype=torch.float64)
    >>> W[0, 1] = W[1, 0] = W[2, 3] = W[3, 2] = 1.0
    >>> modularity(W, torch.tensor([0, 0, 1, 1]))
    0.5

    ``graph`` is a UnitGraph or a symmetric weight tensor [d, d]; NaN when it has no edges.
    """
    d, i, j, w = _graph_edges(graph, "modularity")
    lab = _as_labels(labels, d, "modularity")
    a = w.abs()
    m = float(a.sum())
    if m == 0.0:
        return float("nan")
    n_c = int(lab.max()) + 1 if d else 0
    inside = float(a[lab[i] == lab[j]].sum())
    deg = torch.zeros(d, dtype=torch.float64).index_add_(0, i, a).index_add_(0, j, a)
    D = torch.zeros(n_c, dtype=torch.float64).index_add_(0, lab, deg)
    return inside / m - float((D ** 2).sum()) / (4.0 * m * m)


def _relabel(membership) -> Tensor:
    """Canonical labels: by decreasing community size, ties by the smallest member."""
    mem = torch.as_tensor(np.asarray(membership, dtype=np.int64))
    uniq, inv, counts = torch.unique(mem, return_inverse=True, return_counts=True)
    first = torch.full((len(uniq),), len(mem), dtype=torch.int64)
    first.scatter_reduce_(0, inv, torch.arange(len(mem)), reduce="amin")
    order = sorted(range(len(uniq)), key=lambda c: (-int(counts[c]), int(first[c])))
    new = torch.empty(len(uniq), dtype=torch.int64)
    new[torch.tensor(order, dtype=torch.int64)] = torch.arange(len(uniq))
    return new[inv]


def _leiden(d: int, i: Tensor, j: Tensor, w: Tensor, seed: int) -> list:
    import igraph
    import leidenalg

    layers = []
    for sign in (1.0, -1.0):
        sel = (w * sign) > 0
        g = igraph.Graph(n=d, edges=torch.stack([i[sel], j[sel]], 1).tolist(), directed=False)
        g.es["weight"] = (w[sel] * sign).tolist()
        layers.append(g)
    membership, _ = leidenalg.find_partition_multiplex(
        layers, leidenalg.ModularityVertexPartition, layer_weights=[1.0, -1.0],
        n_iterations=2, seed=seed, weights="weight")
    return membership


def _louvain(d: int, i: Tensor, j: Tensor, w: Tensor, seed: int) -> list:
    import networkx as nx

    G = nx.Graph()
    G.add_nodes_from(range(d))
    G.add_weighted_edges_from(zip(i.tolist(), j.tolist(), w.abs().tolist()))
    comms = nx.community.louvain_communities(G, weight="weight", seed=seed)
    membership = [0] * d
    for c, members in enumerate(comms):
        for u in members:
            membership[u] = c
    return membership


def communities(graph, *, seed: int = 0, method: str = "auto") -> Communities:
    """Communities of the unit graph: signed Leiden, or Louvain on |weight| as the fallback.

    >>> import torch
    >>> W = torch.zeros(6, 6, dtype=torch.float64)
    >>> for a, b in [(0, 1), (1, 2), (0, 2), (3, 4), (4, 5), (3, 5)]:
    ...     W[a, b] = W[b, a] = 1.0
    >>> W[2, 3] = W[3, 2] = -0.5                           # anti-correlated bridge
    >>> C = communities(W, seed=0)
    >>> C.labels.tolist(), C.method
    ([0, 0, 0, 1, 1, 1], 'leiden')
    >>> communities(W, method="louvain").method
    'louvain'

    ``method``: "auto" (Leiden if leidenalg and igraph import, else Louvain with a logged
    warning), "leiden" (ImportError if missing) or "louvain" (needs networkx). ``seed`` fixes
    the result for a given graph.
    """
    what = "communities"
    if method not in _METHODS:
        raise ValueError(f"{what}: method must be one of {_METHODS}, got {method!r}")
    seed = _check_int(seed, "seed", what, 0)
    d, i, j, w = _graph_edges(graph, what)
    ran = method
    if method == "auto":
        try:
            import igraph  # noqa: F401
            import leidenalg  # noqa: F401
            ran = "leiden"
        except ImportError as exc:
            logger.warning("communities: signed Leiden unavailable (%s); falling back to "
                           "Louvain on |weight| (networkx)", exc)
            ran = "louvain"
    if ran == "leiden":
        try:
            membership = _leiden(d, i, j, w, seed)
        except ImportError as exc:
            raise ImportError("communities(method='leiden') needs leidenalg and igraph "
                              "(pip install spectral_hooks[topology])") from exc
    else:
        try:
            membership = _louvain(d, i, j, w, seed)
        except ImportError as exc:
            raise ImportError("communities(method='louvain') needs networkx "
                              "(pip install spectral_hooks[topology])") from exc
    labels = _relabel(membership)
    n_c = int(labels.max()) + 1 if d else 0
    return Communities(labels=labels, n_communities=n_c,
                       modularity=modularity(graph, labels), method=ran)


# -- bridge score ------------------------------------------------------------------------------

def participation(graph, labels) -> Tensor:
    """Participation coefficient P_i = 1 - sum_c (k_{i,c} / k_i)^2 over |weights| (float64 [d]).

    >>> import torch
    >>> W = torch.zeros(3, 3, dtype=torch.float64)
    >>> W[0, 1] = W[1, 0] = 1.0; W[0, 2] = W[2, 0] = -1.0
    >>> participation(W, torch.tensor([0, 0, 1])).tolist()  # unit 0: half its weight outside
    [0.5, 0.0, 0.0]

    ``graph``: a UnitGraph or a symmetric weight tensor; ``labels``: int [d] or Communities.
    k_{i,c} is the |weight| from unit i to units of community c (i's own included); isolated
    units (k_i = 0) get 0.
    """
    d, i, j, w = _graph_edges(graph, "participation")
    lab = _as_labels(labels, d, "participation")
    a = w.abs()
    k = torch.zeros(d, dtype=torch.float64).index_add_(0, i, a).index_add_(0, j, a)
    n_c = int(lab.max()) + 1 if d else 1
    node = torch.cat([i, j])
    key = node * n_c + torch.cat([lab[j], lab[i]])          # (unit, community of neighbour)
    uniq, inv = torch.unique(key, return_inverse=True)
    kic = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inv, torch.cat([a, a]))
    s = torch.zeros(d, dtype=torch.float64).index_add_(0, uniq // n_c, kic ** 2)
    safe = torch.where(k > 0, k, torch.ones_like(k))
    return torch.where(k > 0, 1.0 - s / safe ** 2, torch.zeros_like(k)).clamp_(min=0.0)


# -- amplification -----------------------------------------------------------------------------

def amplification(delta_J: Union[Tensor, LinearOperator], *, dense: bool = False,
                  n_samples: int = 64, seed: int = 0) -> tuple[Tensor, bool]:
    """Per-unit amplification g_i = ||Delta J e_i|| and whether it is an estimate.

    >>> import torch
    >>> D = torch.tensor([[3., 0.], [4., 1.]], dtype=torch.float64)
    >>> amplification(D, dense=True)
    (tensor([5., 1.], dtype=torch.float64), False)
    >>> from spectral_hooks.linalg import DenseOperator
    >>> g, is_est = amplification(DenseOperator(D), n_samples=256, seed=0)
    >>> is_est, g.shape
    (True, torch.Size([2]))

    ``dense=True``: ``delta_J`` must be a tensor [m, d]; exact column norms. Otherwise
    (``delta_J`` a LinearOperator with an adjoint, or a tensor): the Hutchinson diagonal of
    Delta J^T Delta J with ``n_samples`` Rademacher probes (2 n_samples products),
    square-rooted after clipping negative estimates at 0.
    """
    what = "amplification"
    if dense:
        if not isinstance(delta_J, Tensor) or delta_J.ndim != 2:
            raise ValueError(f"{what}: dense=True needs delta_J as a tensor [m, d], got "
                             f"{type(delta_J).__name__}")
        D = delta_J.detach().to("cpu")
        D = D if D.is_complex() else D.to(torch.float64)
        if not bool(torch.isfinite(D).all()):
            raise ValueError(f"{what}: delta_J contains NaN or Inf")
        return torch.linalg.vector_norm(D, dim=0).to(torch.float64), False
    n_samples = _check_int(n_samples, "n_samples", what, 1)
    seed = _check_int(seed, "seed", what, 0)
    if isinstance(delta_J, Tensor):
        if delta_J.ndim != 2:
            raise ValueError(f"{what}: delta_J must be [m, d], got shape "
                             f"{tuple(delta_J.shape)}")
    elif not isinstance(delta_J, LinearOperator):
        raise TypeError(f"{what}: delta_J must be a tensor or a LinearOperator, got "
                        f"{type(delta_J).__name__}")
    est = column_norms_sq(delta_J, n_samples=n_samples, seed=seed)
    value = torch.as_tensor(est.value).detach().to("cpu", torch.float64)
    return value.clamp(min=0.0).sqrt(), True


def community_amplification(delta_J_dense_or_g: Tensor, labels) -> Tensor:
    """Per community C: ||Delta J Pi_C||_F^2 / |C| = mean of g_i^2 over C (float64 [K]).

    >>> import torch
    >>> community_amplification(torch.tensor([1., 3., 2.]), torch.tensor([0, 0, 1]))
    tensor([5., 4.], dtype=torch.float64)

    The first argument is either dense Delta J [m, d] or the amplification vector g [d]
    (e.g. from :func:`amplification`). Entry c is for label c; labels with no units give NaN.
    """
    what = "community_amplification"
    x = delta_J_dense_or_g
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    if not isinstance(x, Tensor) or x.ndim not in (1, 2):
        raise ValueError(f"{what}: expected dense Delta J [m, d] or g [d], got "
                         f"{type(x).__name__}" + (f" of shape {tuple(x.shape)}"
                                                  if isinstance(x, Tensor) else ""))
    x = x.detach().to("cpu")
    x = x if x.is_complex() else x.to(torch.float64)
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{what}: input contains NaN or Inf")
    g2 = (x.abs() ** 2 if x.ndim == 1 else (x.abs() ** 2).sum(0)).to(torch.float64)
    lab = _as_labels(labels, g2.shape[0], what)
    n_c = int(lab.max()) + 1 if len(lab) else 0
    tot = torch.zeros(n_c, dtype=torch.float64).index_add_(0, lab, g2)
    cnt = torch.zeros(n_c, dtype=torch.float64).index_add_(0, lab, torch.ones_like(g2))
    return torch.where(cnt > 0, tot / cnt.clamp(min=1), torch.full_like(tot, float("nan")))


# -- coupling ----------------------------------------------------------------------------------

def spearman(a, b) -> tuple[float, float]:
    """Spearman rho of ``a`` and ``b`` and its two-sided p-value (no scipy).

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
        raise ValueError(f"spearman: a and b must be 1-dimensional of equal length, got "
                         f"shapes {x.shape} and {y.shape}")
    keep = np.isfinite(x) & np.isfinite(y)
    return depth_trend(y[keep], x[keep])


def _coupling_input(g, layer, d: int, what: str, name: str) -> Tensor:
    g = _as_vector(g, what, f"{name}[{layer}]")
    if g.shape[0] != d:
        raise ValueError(f"{what}: {name}[{layer}] has {g.shape[0]} entries but X_by_layer"
                         f"[{layer}] has {d} units")
    return g.to(torch.float64)


def topology_tables(X_by_layer: Mapping[int, Tensor], g_by_layer: Mapping[int, Tensor], *,
                    g_init_by_layer: Optional[Mapping[int, Tensor]] = None, top_k: int = 10,
                    seed: int = 0, n_shuffles: int = 20, method: str = "auto"
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
    (optional; a layer missing from it gives NaN). Per layer: :func:`unit_graph`,
    :func:`communities` (``seed``, ``method``), :func:`participation` as bridge score, and

    - ``coupling_rho``, ``coupling_pvalue``: :func:`spearman` of bridge score vs amplification;
    - ``coupling_rho_init``: the same bridge scores vs the amplification at initialisation;
    - ``coupling_rho_shuffled``: mean over ``n_shuffles`` random permutations of the community
      labels among units (bridge scores recomputed on the same graph) of the coupling
      (NaN when n_shuffles = 0). Permutations come from ``torch.Generator`` seeded with
      (seed, layer).
    """
    what = "topology_tables"
    if not isinstance(X_by_layer, Mapping) or not isinstance(g_by_layer, Mapping):
        raise TypeError(f"{what}: X_by_layer and g_by_layer must be mappings layer -> tensor")
    if g_init_by_layer is not None and not isinstance(g_init_by_layer, Mapping):
        raise TypeError(f"{what}: g_init_by_layer must be a mapping layer -> tensor or None")
    if set(X_by_layer) != set(g_by_layer):
        raise ValueError(f"{what}: X_by_layer and g_by_layer must have the same layers, got "
                         f"{sorted(X_by_layer)} and {sorted(g_by_layer)}")
    if method not in _METHODS:
        raise ValueError(f"{what}: method must be one of {_METHODS}, got {method!r}")
    seed = _check_int(seed, "seed", what, 0)
    n_shuffles = _check_int(n_shuffles, "n_shuffles", what, 0)
    top_k = _check_int(top_k, "top_k", what, 1)
    rows, unit_frames = [], []
    for layer in sorted(X_by_layer):
        X = _as_matrix(X_by_layer[layer], f"{what}: layer {layer}")
        N, d = X.shape
        g = _coupling_input(g_by_layer[layer], layer, d, what, "g_by_layer")
        graph = unit_graph(X, top_k=top_k)
        del X
        comm = communities(graph, seed=seed, method=method)
        P = participation(graph, comm.labels)
        rho, p = spearman(P, g)
        rho_init = float("nan")
        if g_init_by_layer is not None and layer in g_init_by_layer:
            g0 = _coupling_input(g_init_by_layer[layer], layer, d, what, "g_init_by_layer")
            rho_init = spearman(P, g0)[0]
        gen = torch.Generator().manual_seed(seed * 1_000_003 + int(layer))
        shuffled = [spearman(participation(graph, comm.labels[torch.randperm(d, generator=gen)]),
                             g)[0] for _ in range(n_shuffles)]
        shuffled = [r for r in shuffled if math.isfinite(r)]
        rows.append(dict(layer=layer, n_communities=comm.n_communities,
                         modularity=comm.modularity, method=comm.method, coupling_rho=rho,
                         coupling_pvalue=p, coupling_rho_init=rho_init,
                         coupling_rho_shuffled=float(np.mean(shuffled)) if shuffled
                         else float("nan"),
                         n_units=d, n_tokens=N))
        unit_frames.append(pd.DataFrame(dict(
            layer=np.full(d, layer), unit=np.arange(d), community=comm.labels.numpy(),
            bridge_score=P.numpy(), amplification=g.numpy())))
    topo = pd.DataFrame(rows, columns=TOPOLOGY_COLUMNS)
    units = (pd.concat(unit_frames, ignore_index=True) if unit_frames
             else pd.DataFrame(columns=UNITS_COLUMNS))
    return topo, units[UNITS_COLUMNS]
