"""Correlation graph of residual units, its communities and bridge scores (METRICS.md section 3).

Holds :func:`unit_graph`, :func:`communities`, :func:`modularity` and :func:`participation`
with their result types and input validation; the definitions are in
`spectral_hooks.metrics.topology`, which re-exports every public name here and is where they
are meant to be imported from.

networkx, igraph and leidenalg are optional (``pip install spectral_hooks[topology]``) and
imported only inside the functions that use them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from ..checks import check_choice, check_int, check_type
from ..errors import MissingExtraError, OptionError, OptionTypeError

__all__ = ["UnitGraph", "Communities", "unit_graph", "communities", "modularity",
           "participation", "CONSTANT_RTOL"]

logger: logging.Logger = logging.getLogger(__name__)

CONSTANT_RTOL = 1e-12  # a unit is constant when its centred norm <= CONSTANT_RTOL * the largest

COMMUNITY_METHODS = ("auto", "leiden", "louvain")


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
        """d, the number of units (nodes)."""
        return int(self.weights.shape[0])

    @property
    def n_edges(self) -> int:
        """The number of edges (pairs i < j with a non-zero weight)."""
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


# -- validation: argument checks shared with spectral_hooks.metrics.topology -------------------

def checked_matrix(X: Any, what: str, name: str = "X") -> Tensor:
    """``X`` as a finite real float64 CPU tensor [N tokens, d units] (a tensor or an array).

    >>> checked_matrix(torch.ones(3, 2), "unit_graph").dtype
    torch.float64
    """
    if isinstance(X, np.ndarray):
        X = torch.from_numpy(X)
    check_type(name, X, Tensor, "a real tensor [N tokens, d units]", hint=what)
    if X.ndim != 2 or X.is_complex():
        raise OptionError(name, X, "a real 2-dimensional tensor [N tokens, d units]", hint=what)
    X = X.detach().to(device="cpu", dtype=torch.float64)
    if not bool(torch.isfinite(X).all()):
        raise OptionError(name, "a tensor holding NaN or Inf", "finite values", hint=what)
    return X


def checked_vector(v: Any, what: str, name: str, n: Optional[int] = None) -> Tensor:
    """``v`` (a tensor, array or sequence) as a 1-dimensional CPU tensor of ``n`` entries.

    >>> checked_vector([1.0, 2.0], "participation", "labels", 2).tolist()
    [1.0, 2.0]
    """
    if isinstance(v, np.ndarray):
        v = torch.from_numpy(v)
    if not isinstance(v, Tensor):
        try:
            v = torch.as_tensor(np.asarray(v, dtype=np.float64))
        except (TypeError, ValueError):
            raise OptionTypeError(name, v, "a vector (a tensor, array or list of numbers)",
                                  hint=what) from None
    if v.ndim != 1 or (n is not None and v.shape[0] != n):
        raise OptionError(name, v, "a 1-dimensional tensor" + (f" of {n} entries" if n is not None
                                                                else ""), hint=what)
    return v.detach().to("cpu")


def checked_labels(labels: Any, d: int, what: str) -> Tensor:
    """Community labels (ints >= 0, one per unit, or Communities) as an int64 tensor [d].

    >>> checked_labels(torch.tensor([0, 1, 1]), 3, "modularity").tolist()
    [0, 1, 1]
    """
    if isinstance(labels, Communities):
        labels = labels.labels
    lab = checked_vector(labels, what, "labels", d)
    if lab.is_floating_point() or lab.is_complex() or lab.dtype == torch.bool:
        raise OptionError("labels", lab, "integer community labels >= 0", hint=what)
    lab = lab.to(torch.int64)
    if d and int(lab.min()) < 0:
        raise OptionError("labels", "labels holding a negative value",
                          "integer community labels >= 0", hint=what)
    return lab


def _graph_edges(graph: Any, what: str) -> tuple[int, Tensor, Tensor, Tensor]:
    """(d, i, j, w) with i < j for a UnitGraph or a symmetric dense weight tensor [d, d]."""
    if isinstance(graph, UnitGraph):
        return graph.n_units, graph.edges[:, 0], graph.edges[:, 1], graph.edge_weights
    want = "a UnitGraph or a finite symmetric weight tensor [d, d]"
    if not isinstance(graph, Tensor) or graph.ndim != 2 or graph.shape[0] != graph.shape[1]:
        raise OptionTypeError("graph", graph, want, hint=what)
    W = graph.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(W).all()):
        raise OptionError("graph", "a weight matrix holding NaN or Inf", want, hint=what)
    if not torch.equal(W, W.T):
        raise OptionError("graph", "a weight matrix that is not symmetric", want, hint=what)
    i, j = torch.triu_indices(W.shape[0], W.shape[0], offset=1)
    w = W[i, j]
    keep = w != 0
    return int(W.shape[0]), i[keep], j[keep], w[keep]


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
    X = checked_matrix(X, what)
    N, d = X.shape
    if N < 3 or d < 2:
        raise OptionError("X", X, "at least 3 tokens (rows) to correlate units and at least "
                          "2 units (columns)", hint=what)
    top_k = check_int("top_k", top_k, minimum=1, maximum=d - 1,
                      accepted=f"an int in [1, d - 1 = {d - 1}] (d = {d} units)")
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

def modularity(graph: UnitGraph | Tensor, labels: Tensor | Sequence[int]) -> float:
    """Modularity of ``labels`` on the |weight| graph (resolution 1), as networkx computes it.

    >>> import torch
    >>> W = torch.zeros(4, 4, dtype=torch.float64)
    >>> W[0, 1] = W[1, 0] = W[2, 3] = W[3, 2] = 1.0
    >>> modularity(W, torch.tensor([0, 0, 1, 1]))
    0.5

    ``graph`` is a UnitGraph or a symmetric weight tensor [d, d]; NaN when it has no edges.
    """
    d, i, j, w = _graph_edges(graph, "modularity")
    lab = checked_labels(labels, d, "modularity")
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


def communities(graph: UnitGraph | Tensor, *, seed: int = 0, method: str = "auto") -> Communities:
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
    check_choice("method", method, COMMUNITY_METHODS)
    seed = check_int("seed", seed, minimum=0)
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
            raise MissingExtraError(exc.name or "leidenalg", "communities(method='leiden')",
                                    "topology") from exc
    else:
        try:
            membership = _louvain(d, i, j, w, seed)
        except ImportError as exc:
            raise MissingExtraError("networkx", "communities(method='louvain')",
                                    "topology") from exc
    labels = _relabel(membership)
    n_c = int(labels.max()) + 1 if d else 0
    return Communities(labels=labels, n_communities=n_c,
                       modularity=modularity(graph, labels), method=ran)


# -- bridge score ------------------------------------------------------------------------------

def participation(graph: UnitGraph | Tensor, labels: Tensor | Sequence[int]) -> Tensor:
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
    lab = checked_labels(labels, d, "participation")
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
