"""Trained vs many re-initialisations: one trained value per (metric, layer) against the same
value in n freshly initialised models of the same config (docs/metrics.md ``reinit_test``).

Example::

    >>> import pandas as pd
    >>> trained = pd.DataFrame({"metric": "sym_energy", "layer": [0, 1], "value": [0.9, 0.5]})
    >>> init = pd.DataFrame({"seed": [1, 1, 2, 2, 3, 3], "metric": "sym_energy",
    ...                      "layer": [0, 1] * 3, "value": [0.5, 0.4, 0.6, 0.6, 0.55, 0.5]})
    >>> t = seed_test_table(trained, init)
    >>> t["init_mean"].round(4).tolist(), t["greater_pvalue"].tolist(), t["n_init"].tolist()
    ([0.55, 0.5], [0.25, 0.75], [3, 3])

Per row (float64): ``trained``; ``init_mean``, ``init_std`` (ddof 1) and ``n_init`` over the
finite init values; ``difference`` = trained - init_mean; the empirical p-values of
:func:`spectral_hooks.metrics.stats.empirical_pvalues`: ``greater_pvalue`` = (1 + #{init >=
trained}) / (n + 1) (one-sided: is the trained value larger than a re-initialisation would
give?), ``less_pvalue`` (the other side) and ``two_sided_pvalue`` = min(1, 2 min of the two);
``t_stat`` / ``t_pvalue``: the single-case t-test of the trained value against the init sample
(:func:`spectral_hooks.metrics.stats.single_case_t`, n - 1 degrees of freedom; it assumes the
init values are normal, the empirical p-values assume nothing). Each p-value column gets its
Benjamini-Hochberg ``*_adj`` over every (metric, layer) row of the table: one family per
column.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import pandas as pd

from ..checks import check_type
from .stats import empirical_pvalues, single_case_t, with_adjusted

__all__ = ["seed_test_table", "SEED_TEST_COLUMNS", "SEED_TEST_PVALUES"]

SEED_TEST_PVALUES = ("greater_pvalue", "less_pvalue", "two_sided_pvalue", "t_pvalue")
SEED_TEST_COLUMNS = ["metric", "layer", "trained", "init_mean", "init_std", "n_init",
                     "difference", "greater_pvalue", "greater_pvalue_adj", "less_pvalue",
                     "less_pvalue_adj", "two_sided_pvalue", "two_sided_pvalue_adj", "t_stat",
                     "t_pvalue", "t_pvalue_adj"]


def _check(df: pd.DataFrame, needed: tuple[str, ...], name: str) -> None:
    check_type(name, df, pd.DataFrame, "a pandas DataFrame", hint="seed_test_table")
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise ValueError(f"seed_test_table: {name} lacks columns {missing} "
                         f"(has {list(df.columns)})")


def seed_test_table(trained: pd.DataFrame, init: pd.DataFrame) -> pd.DataFrame:
    """``trained``: columns metric, layer, value (one row each); ``init``: seed, metric, layer,
    value (one row per seed). Rows in the order of ``trained``."""
    _check(trained, ("metric", "layer", "value"), "trained")
    _check(init, ("seed", "metric", "layer", "value"), "init")
    if trained.duplicated(["metric", "layer"]).any():
        raise ValueError("seed_test_table: trained has several rows for one (metric, layer)")
    groups = {key: g["value"].to_numpy(dtype=np.float64)
              for key, g in init.groupby(["metric", "layer"], sort=False)}
    rows = []
    for metric, layer, value in trained[["metric", "layer", "value"]].itertuples(index=False):
        z = groups.get((metric, layer), np.array([]))
        z = z[np.isfinite(z)]
        value = float(value)
        greater, less, two = empirical_pvalues(value, z)
        t, p_t, _ = single_case_t(value, z)
        mean = float(z.mean()) if len(z) else float("nan")
        rows.append(dict(metric=metric, layer=int(layer), trained=value, init_mean=mean,
                         init_std=float(z.std(ddof=1)) if len(z) > 1 else float("nan"),
                         n_init=len(z), difference=value - mean, greater_pvalue=greater,
                         less_pvalue=less, two_sided_pvalue=two, t_stat=t, t_pvalue=p_t))
    table = pd.DataFrame(rows, columns=[c for c in SEED_TEST_COLUMNS if not c.endswith("_adj")])
    return cast(pd.DataFrame, with_adjusted(table, SEED_TEST_PVALUES)[SEED_TEST_COLUMNS])
