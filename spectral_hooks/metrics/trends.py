"""Depth trends of per-layer metrics: Spearman correlation with the layer index and its p-value.

Example::

    >>> rho, p = depth_trend([0.1, 0.3, 0.2, 0.5, 0.7, 0.9])      # exact permutation test
    >>> round(rho, 4), round(p, 4)
    (0.9429, 0.0167)
    >>> import pandas as pd
    >>> df = pd.DataFrame({"layer": range(10), "sym_energy": [i / 10 for i in range(10)]})
    >>> trends_table(df, ["sym_energy"]).to_dict("records")[0]
    {'metric': 'sym_energy', 'spearman_rho': 1.0, 'pvalue': 0.0, 'n_layers': 10}

No scipy at run time: ranks with ties averaged, Pearson correlation of the ranks, and a
two-sided p-value that is exact (all n! pairings) for n <= 8 and otherwise from the
t-approximation t = rho sqrt((n - 2) / (1 - rho^2)) with n - 2 degrees of freedom (what
``scipy.stats.spearmanr`` reports), the Student-t tail through the regularised incomplete
beta function (continued fraction, Numerical Recipes 6.4).
"""

from __future__ import annotations

import itertools
import math
from typing import Optional, Sequence, cast

import numpy as np
import pandas as pd

from ..checks import check_type
from ..errors import OptionTypeError

__all__ = ["depth_trend", "trends_table", "student_t_two_sided", "betainc_regularized",
           "EXACT_MAX_N"]

EXACT_MAX_N = 8


def betainc_regularized(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularised incomplete beta function (a, b > 0, 0 <= x <= 1).

    >>> round(betainc_regularized(2.0, 3.0, 0.4), 10)  # 1 - (1-x)^4 - 4x(1-x)^3 - ... = 0.5248
    0.5248
    """
    if not (a > 0 and b > 0) or not (0.0 <= x <= 1.0):
        raise ValueError(f"betainc_regularized: need a, b > 0 and 0 <= x <= 1, got "
                         f"a={a}, b={b}, x={x}")
    if x == 0.0 or x == 1.0:
        return x
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction for I_x(a, b) (modified Lentz)."""
    tiny, eps = 1e-300, 1e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                   -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            return h
    raise ArithmeticError(f"betainc_regularized: no convergence for a={a}, b={b}, x={x}")


def student_t_two_sided(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom: I_{df/(df+t^2)}(df/2, 1/2).

    >>> round(student_t_two_sided(2.0, 10), 6)
    0.073388
    """
    if not df > 0:
        raise ValueError(f"student_t_two_sided: df must be > 0, got {df}")
    if math.isinf(t):
        return 0.0
    return betainc_regularized(df / 2.0, 0.5, df / (df + t * t))


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties given their average rank."""
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    r = np.empty(len(x), dtype=np.float64)
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and xs[j + 1] == xs[i]:
            j += 1
        r[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return r


def _pearson(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson correlation of a [n] with each row of b [..., n]."""
    a = a - a.mean()
    b = b - b.mean(axis=-1, keepdims=True)
    return (b @ a) / np.sqrt(float(a @ a) * (b ** 2).sum(-1))


def depth_trend(values: Sequence[float] | np.ndarray,
                layers: Optional[Sequence[float] | np.ndarray] = None
                ) -> tuple[float, float]:
    """Spearman rho of ``values`` against ``layers`` (default 0..n-1) and its two-sided p-value.

    >>> depth_trend([3.0, 2.0, 1.0])
    (-1.0, 0.3333333333333333)

    Non-finite values are dropped with their layers. Fewer than 3 points left, or a constant
    series, give (nan, nan). n <= EXACT_MAX_N (8): exact permutation p-value, the share of
    the n! pairings with |rho| >= |rho_observed|; larger n: the t-approximation.
    """
    y = np.asarray(values, dtype=np.float64).reshape(-1)
    x = np.arange(len(y), dtype=np.float64) if layers is None else \
        np.asarray(layers, dtype=np.float64).reshape(-1)
    if x.shape != y.shape:
        raise ValueError(f"depth_trend: {len(y)} values but {len(x)} layers")
    if not np.isfinite(x).all():
        raise ValueError("depth_trend: layers must be finite")
    keep = np.isfinite(y)
    x, y = x[keep], y[keep]
    n = len(y)
    if n < 3 or np.ptp(y) == 0 or np.ptp(x) == 0:
        return float("nan"), float("nan")
    rx, ry = _ranks(x), _ranks(y)
    rho = float(np.clip(_pearson(rx, ry[None])[0], -1.0, 1.0))
    if n <= EXACT_MAX_N:
        perms = np.array(list(itertools.permutations(range(n))), dtype=np.intp)
        rhos = _pearson(rx, ry[perms])
        p = float(np.mean(np.abs(rhos) >= abs(rho) - 1e-12))
    elif abs(rho) == 1.0:
        p = 0.0
    else:
        p = student_t_two_sided(rho * math.sqrt((n - 2) / (1.0 - rho * rho)), n - 2)
    return rho, min(p, 1.0)


def trends_table(df: pd.DataFrame, metrics: Sequence[str], *, layer_col: str = "layer"
                 ) -> pd.DataFrame:
    """One row per metric: ``metric, spearman_rho, pvalue, n_layers``.

    >>> df = pd.DataFrame({"layer": [0, 0, 1, 1, 2, 2], "x": [1, 3, 2, 4, 5, 7]})
    >>> trends_table(df, ["x"])["n_layers"].tolist()     # positions averaged per layer
    [3]

    Rows sharing a layer (several positions) are averaged per layer first (NaNs skipped);
    the trend is then taken over layers with :func:`depth_trend`.
    """
    check_type("df", df, pd.DataFrame, "a pandas DataFrame", hint="trends_table")
    if isinstance(metrics, str):
        raise OptionTypeError("metrics", metrics, "a sequence of column names, not one str",
                              hint="trends_table")
    missing = [c for c in [layer_col, *metrics] if c not in df.columns]
    if missing:
        raise ValueError(f"trends_table: columns {missing} not in the table "
                         f"(has {list(df.columns)})")
    rows = []
    for name in metrics:
        numeric = cast(pd.Series, pd.to_numeric(df[name], errors="coerce"))
        per_layer = cast(pd.Series, numeric.groupby(df[layer_col]).mean())
        per_layer = cast(pd.Series, per_layer[np.isfinite(per_layer.to_numpy(dtype=np.float64))])
        rho, p = depth_trend(per_layer.to_numpy(dtype=np.float64),
                             per_layer.index.to_numpy(dtype=np.float64))
        rows.append(dict(metric=name, spearman_rho=rho, pvalue=p, n_layers=len(per_layer)))
    return pd.DataFrame(rows, columns=["metric", "spearman_rho", "pvalue", "n_layers"])
