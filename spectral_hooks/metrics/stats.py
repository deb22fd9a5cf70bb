"""Statistics shared by every section: multiple testing, empirical and t-test p-values.

Example::

    >>> bh_adjust([0.01, 0.04, 0.03, float("nan")]).round(4).tolist()   # NaN kept, not counted
    [0.03, 0.04, 0.04, nan]
    >>> empirical_pvalues(1.0, [0.2, 0.5, 1.2])                          # (greater, less, two)
    (0.5, 0.75, 1.0)
    >>> t, p, df = welch_t([1.0, 2.0, 3.0], [4.0, 6.0, 8.0])
    >>> round(t, 4), round(p, 4), round(df, 3)
    (-3.0984, 0.0548, 2.941)

Definitions (all float64, no scipy at run time; the tests check them against scipy):

- :func:`bh_adjust`: Benjamini-Hochberg adjusted p-values (the step-up procedure, as
  ``scipy.stats.false_discovery_control(p, method="bh")``): with the m finite p-values sorted,
  p_(i) -> min_{j >= i} min(1, m p_(j) / j). NaN entries stay NaN and do not count in m; ties
  get the same adjusted value; one p-value is its own adjustment.
- :func:`with_adjusted`: a table with ``<name>_adj`` inserted right after each p-value column
  ``<name>``, the family being the whole column (or each group of ``by``).
- :func:`empirical_pvalues`: an observed value against n draws of a null (e.g. re-initialised
  models): p_greater = (1 + #{null >= obs}) / (n + 1), p_less = (1 + #{null <= obs}) / (n + 1)
  and the two-sided p = min(1, 2 min(p_greater, p_less)). The +1 counts the observation as one
  of the draws, so p >= 1 / (n + 1) (a p-value is never 0 from n draws).
- :func:`welch_t`: Welch's unequal-variance t-test of two samples (t, two-sided p, the
  Welch-Satterthwaite degrees of freedom), as ``scipy.stats.ttest_ind(a, b, equal_var=False)``.
- :func:`single_case_t`: one observed value against a sample of n (Crawford & Howell 1998):
  t = (obs - mean) / (s sqrt((n + 1) / n)), n - 1 degrees of freedom, two-sided p. It is the
  limit of the two-sample t-test when one group is a single value (Welch's needs a variance in
  each group, which one trained model does not have).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, cast

import numpy as np
import pandas as pd

from ..errors import OptionTypeError
from .trends import student_t_two_sided

__all__ = ["bh_adjust", "with_adjusted", "empirical_pvalues", "welch_t", "single_case_t",
           "sample_summary", "SAMPLE_SUMMARY_COLUMNS"]

#: the groups :func:`sample_summary` summarises over by default (its ``by``)
SAMPLE_SUMMARY_BY = ("variant", "layer")
#: columns of :func:`sample_summary` with the default ``by``: the ``by`` columns, then these
SAMPLE_SUMMARY_COLUMNS = (*SAMPLE_SUMMARY_BY, "metric", "mean", "sd_samples", "se_samples",
                          "n_samples", "n_rows")


def _as_pvalues(p, what: str) -> np.ndarray:
    x = np.asarray(p, dtype=np.float64)
    if x.ndim != 1:
        x = x.reshape(-1)
    finite = x[np.isfinite(x)]
    if np.isinf(x).any() or ((finite < 0) | (finite > 1)).any():
        raise ValueError(f"{what}: p-values must lie in [0, 1] (or be NaN), got "
                         f"{x[~np.isnan(x) & ((x < 0) | (x > 1))][:5].tolist()}")
    return x


def bh_adjust(p: Sequence[float] | np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values of one family (NaN in, NaN out).

    >>> bh_adjust([0.5]).tolist(), bh_adjust([]).tolist()
    ([0.5], [])
    """
    x = _as_pvalues(p, "bh_adjust")
    out = np.full(x.shape, np.nan)
    keep = np.flatnonzero(~np.isnan(x))
    m = len(keep)
    if m == 0:
        return out
    order = np.argsort(x[keep], kind="mergesort")
    ranked = x[keep][order] * m / np.arange(1, m + 1)
    ranked = np.minimum.accumulate(ranked[::-1])[::-1]
    out[keep[order]] = np.clip(ranked, 0.0, 1.0)
    return out


def with_adjusted(df: pd.DataFrame, columns: Sequence[str], *,
                  by: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """``df`` with ``<c>_adj`` (Benjamini-Hochberg over the column, or within each group of
    ``by``) inserted right after each p-value column ``c``.

    >>> df = pd.DataFrame({"layer": [0, 1], "pvalue": [0.01, 0.04], "n": [3, 3]})
    >>> list(with_adjusted(df, ["pvalue"]).columns)
    ['layer', 'pvalue', 'pvalue_adj', 'n']
    """
    if isinstance(columns, str):
        raise OptionTypeError("columns", columns, "a sequence of column names, not one str",
                              hint="with_adjusted")
    out = df.copy()
    for name in columns:
        if name not in out.columns:
            raise ValueError(f"with_adjusted: no column {name!r} (has {list(out.columns)})")
        values = cast(pd.Series, pd.to_numeric(out[name], errors="coerce")).to_numpy(dtype=np.float64)
        if by:
            adj = np.full(len(out), np.nan)
            for _, index in out.groupby(list(by), sort=False, dropna=False).indices.items():
                adj[index] = bh_adjust(values[index])
        else:
            adj = bh_adjust(values)
        if f"{name}_adj" in out.columns:
            out = out.drop(columns=f"{name}_adj")
        out.insert(out.columns.get_loc(name) + 1, f"{name}_adj", adj)
    return out


def empirical_pvalues(observed: float, null: Sequence[float] | np.ndarray
                      ) -> tuple[float, float, float]:
    """(p_greater, p_less, p_two_sided) of ``observed`` against the draws ``null``.

    Non-finite draws are dropped; an observation that is not finite, or no draws left, give
    NaN. See the module docstring for the definitions.
    """
    z = np.asarray(null, dtype=np.float64).reshape(-1)
    z = z[np.isfinite(z)]
    if not math.isfinite(observed) or len(z) == 0:
        return float("nan"), float("nan"), float("nan")
    n = len(z)
    greater = (1 + int((z >= observed).sum())) / (n + 1)
    less = (1 + int((z <= observed).sum())) / (n + 1)
    return greater, less, min(1.0, 2.0 * min(greater, less))


def welch_t(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """Welch's t statistic of mean(a) - mean(b), its two-sided p-value and degrees of freedom.

    NaNs are dropped; fewer than 2 values in a group, or no variance in either, give NaN.
    """
    x = np.asarray(a, dtype=np.float64).reshape(-1)
    y = np.asarray(b, dtype=np.float64).reshape(-1)
    x, y = x[np.isfinite(x)], y[np.isfinite(y)]
    nan = (float("nan"), float("nan"), float("nan"))
    if len(x) < 2 or len(y) < 2:
        return nan
    vx, vy = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    se2 = vx + vy
    if not se2 > 0:
        return nan
    t = float((x.mean() - y.mean()) / math.sqrt(se2))
    df = float(se2 ** 2 / ((vx ** 2 / (len(x) - 1) if vx else 0.0)
                           + (vy ** 2 / (len(y) - 1) if vy else 0.0)))
    return t, student_t_two_sided(t, df), df


def single_case_t(observed: float, sample: Sequence[float] | np.ndarray
                  ) -> tuple[float, float, float]:
    """Crawford-Howell t of one value against a sample, its two-sided p-value and df = n - 1.

    >>> t, p, df = single_case_t(3.0, [0.0, 1.0, 2.0, 1.0])
    >>> round(t, 4), round(p, 4), df
    (2.1909, 0.1162, 3.0)
    """
    y = np.asarray(sample, dtype=np.float64).reshape(-1)
    y = y[np.isfinite(y)]
    n = len(y)
    if not math.isfinite(observed) or n < 2:
        return (float("nan"), float("nan"), float("nan"))
    s = float(y.std(ddof=1))
    if not s > 0:
        return (float("nan"), float("nan"), float("nan"))
    t = float((observed - y.mean()) / (s * math.sqrt((n + 1) / n)))
    return t, student_t_two_sided(t, n - 1), float(n - 1)


def sample_summary(table: pd.DataFrame, metrics: Sequence[str], *,
                   by: Sequence[str] = SAMPLE_SUMMARY_BY, sample: str = "sample") -> pd.DataFrame:
    """Per group of ``by`` and metric: the mean over every row (samples x positions), and the
    spread across samples: each sample's mean over its rows, their standard deviation
    (``sd_samples``, ddof=1; NaN for one sample) and ``se_samples`` = sd / sqrt(n_samples), the
    standard error of the mean over samples. NaN values are left out (``n_rows`` counts the rest).

    >>> t = pd.DataFrame({"variant": "trained", "layer": 0, "sample": [0, 0, 1, 1],
    ...                   "x": [1.0, 3.0, 5.0, 7.0]})
    >>> sample_summary(t, ["x"])[["mean", "sd_samples", "n_samples", "n_rows"]].values.tolist()
    [[4.0, 2.8284271247461903, 2.0, 4.0]]
    """
    rows = []
    for key, group in table.groupby(list(by), sort=True, observed=True):
        key = key if isinstance(key, tuple) else (key,)
        for metric in metrics:
            x = group[[sample, metric]].dropna()
            per_sample = x.groupby(sample)[metric].mean().to_numpy(dtype=np.float64)
            n = len(per_sample)
            sd = float(np.std(per_sample, ddof=1)) if n > 1 else float("nan")
            rows.append({**dict(zip(by, key)), "metric": metric,
                         "mean": float(x[metric].mean()) if len(x) else float("nan"),
                         "sd_samples": sd, "se_samples": sd / math.sqrt(n) if n > 1
                         else float("nan"), "n_samples": n, "n_rows": len(x)})
    stats = SAMPLE_SUMMARY_COLUMNS[len(SAMPLE_SUMMARY_BY):]
    return pd.DataFrame(rows, columns=[*by, *stats])
