"""Per community of residual units: its mean signed gain, against a label-shuffle null and the
init control, and its own coupling (METRICS.md section 3, docs/metrics.md ``communities``).

Example::

    >>> import numpy as np, pandas as pd
    >>> units = pd.DataFrame({"layer": 0, "unit": range(8), "community": [0] * 4 + [1] * 4,
    ...                       "bridge_score": np.linspace(0, 0.7, 8),
    ...                       "amplification": 1.0, "log_gain": [1.0] * 4 + [-1.0] * 4,
    ...                       "log_gain_init": 0.0})
    >>> table = community_table(units, n_shuffles=200, seed=0)
    >>> table["mean_log_gain"].tolist(), table["gain_pvalue"].round(2).tolist()
    ([1.0, -1.0], [0.01, 0.01])

Definitions (float64; one row per layer x community of the ``units`` table):

- ``mean_log_gain``: the mean over the community's units of log ||J e_i|| (> 0: the block
  amplifies the community on average, < 0: it suppresses it); ``mean_log_gain_init``: the same
  units' mean gain in the freshly initialised model (NaN without it).
- Label-shuffle null: the community labels permuted among the layer's units ``n_shuffles``
  times (``numpy.random.default_rng((seed, layer))``): a random set of the same size.
  ``mean_log_gain_null`` and ``mean_log_gain_null_sd`` are the mean and standard deviation of
  the shuffled communities' mean gain; ``gain_pvalue`` is the two-sided empirical p-value
  min(1, 2 min(p_greater, p_less)), p_greater = (1 + #{null >= observed}) / (n + 1)
  (``metrics.stats.empirical_pvalues``); ``gain_init_pvalue`` the same test of the init gains
  under the same permutations. A community of every unit of the layer has no null (NaN).
- ``amplification``: ||Delta J Pi_C||_F^2 / |C| = mean over C of ||Delta J e_i||^2
  (:func:`spectral_hooks.metrics.topology.community_amplification`).
- ``*_se_bound`` (``mean_log_gain``, ``mean_log_gain_init``, ``amplification``): an upper
  bound of the standard error of a mean over the community's units where those are
  matrix-free estimates, from the units table's ``<column>_se``: the mean of the units'
  standard errors (the standard deviation of a sum is at most the sum of theirs, whatever
  their correlation: the units' estimates share probes). For ``amplification`` the units'
  errors of ||Delta J e_i||^2, 2 g_i se(g_i) (se(g_i)^2 where g_i is 0). 0 where the units
  are exact; NaN where the units table has no standard errors.
- ``gain_coupling_rho``, ``gain_coupling_pvalue``: Spearman correlation of bridge score and
  log_gain over the community's units (NaN below 3 units or for a constant side).
- ``*_adj``: Benjamini-Hochberg over every (layer, community) row of the table, one family per
  p-value column.
- ``layer_type``: "block": the gain of the whole block Jacobian (``log_gain``); "attention" /
  "ffn": the gain through the attention sublayer x -> resid_mid (``log_gain_attn``) or the
  feed-forward one resid_mid -> output (``log_gain_ffn``), rows present where the units table
  has those columns with values (``analyze(topology={"sublayers": True})``). Every layer type
  uses the same label permutations (the same null sets); ``amplification`` is the block's and
  is NaN on sublayer rows; the coupling is that of the row's own gain.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import pandas as pd

from ..checks import check_int, check_type
from .stats import empirical_pvalues, with_adjusted
from .trends import depth_trend

__all__ = ["community_table", "COMMUNITY_COLUMNS", "COMMUNITY_PVALUES"]

COMMUNITY_PVALUES = ("gain_pvalue", "gain_init_pvalue", "gain_coupling_pvalue")
COMMUNITY_COLUMNS = ["layer", "community", "layer_type", "n_units", "mean_log_gain",
                     "mean_log_gain_null", "mean_log_gain_null_sd", "gain_pvalue",
                     "gain_pvalue_adj", "mean_log_gain_init", "gain_init_pvalue",
                     "gain_init_pvalue_adj", "amplification", "gain_coupling_rho",
                     "gain_coupling_pvalue", "gain_coupling_pvalue_adj", "mean_log_gain_se_bound",
                     "mean_log_gain_init_se_bound", "amplification_se_bound"]
_NEEDED = ("layer", "unit", "community", "bridge_score", "amplification", "log_gain",
           "log_gain_init")


#: layer type -> (gain column, init gain column) of the units table
LAYER_TYPES = {"block": ("log_gain", "log_gain_init"),
               "attention": ("log_gain_attn", "log_gain_attn_init"),
               "ffn": ("log_gain_ffn", "log_gain_ffn_init")}


def _shuffled_means(values: np.ndarray, perms: np.ndarray, members: np.ndarray) -> np.ndarray:
    """Mean of ``values`` over the units a permutation gives the community's labels to."""
    return values[perms[:, members]].mean(axis=1)


def _rows(layer: int, layer_type: str, labels, gain, gain0, amp, bridge, perms,
          n_shuffles: int, errors: tuple) -> list[dict]:
    rows, d = [], len(labels)
    gain_se, gain0_se, amp_se = errors
    amp_sq_se = np.where(amp > 0, 2 * amp * amp_se, amp_se ** 2)  # of ||Delta J e_i||^2
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        observed = float(gain[members].mean())
        observed0 = float(gain0[members].mean())
        whole = len(members) == d or not n_shuffles
        null = np.array([]) if whole else _shuffled_means(gain, perms, members)
        null0 = np.array([]) if whole else _shuffled_means(gain0, perms, members)
        rho, p = (depth_trend(gain[members], bridge[members]) if len(members) >= 3
                  else (float("nan"), float("nan")))
        rows.append(dict(
            layer=layer, community=int(c), layer_type=layer_type, n_units=len(members),
            mean_log_gain=observed,
            mean_log_gain_null=float(null.mean()) if len(null) else float("nan"),
            mean_log_gain_null_sd=float(null.std(ddof=1)) if len(null) > 1 else float("nan"),
            gain_pvalue=empirical_pvalues(observed, null)[2],
            mean_log_gain_init=observed0,
            gain_init_pvalue=empirical_pvalues(observed0, null0)[2],
            amplification=float((amp[members] ** 2).mean()),
            gain_coupling_rho=rho, gain_coupling_pvalue=p,
            mean_log_gain_se_bound=float(gain_se[members].mean()),
            mean_log_gain_init_se_bound=float(gain0_se[members].mean()),
            amplification_se_bound=float(amp_sq_se[members].mean())))
    return rows


def _errors(df: pd.DataFrame, column: str) -> np.ndarray:
    """The units' standard errors of ``column`` (NaN where the table has none)."""
    name = f"{column}_se"
    if name not in df.columns:
        return np.full(len(df), np.nan)
    return df[name].to_numpy(dtype=np.float64)


def community_table(units: pd.DataFrame, *, n_shuffles: int = 1000, seed: int = 0
                    ) -> pd.DataFrame:
    """One row per (layer, community) of ``units`` (the ``units`` section's columns)."""
    what = "community_table"
    check_type("units", units, pd.DataFrame, "a pandas DataFrame (the units section)",
               hint=what)
    missing = [c for c in _NEEDED if c not in units.columns]
    if missing:
        raise ValueError(f"{what}: units lacks columns {missing}")
    check_int("n_shuffles", n_shuffles, minimum=0, hint=what)
    rows = []
    for layer, df in units.groupby("layer", sort=True):
        df = df.sort_values("unit")
        labels = df["community"].to_numpy()
        amp = df["amplification"].to_numpy(dtype=np.float64)
        bridge = df["bridge_score"].to_numpy(dtype=np.float64)
        rng = np.random.default_rng((seed, int(cast(int, layer))))
        d = len(labels)
        perms = np.stack([rng.permutation(d) for _ in range(n_shuffles)]) if n_shuffles \
            else np.zeros((0, d), dtype=np.intp)
        for layer_type, (column, column0) in LAYER_TYPES.items():
            if column not in df.columns or (layer_type != "block"
                                            and not df[column].notna().any()):
                continue
            gain = df[column].to_numpy(dtype=np.float64)
            gain0 = (df[column0].to_numpy(dtype=np.float64) if column0 in df.columns
                     else np.full(d, np.nan))
            block = layer_type == "block"
            errors = (_errors(df, column), _errors(df, column0),
                      _errors(df, "amplification") if block else np.full(d, np.nan))
            rows.extend(_rows(int(cast(int, layer)), layer_type, labels, gain, gain0,
                              amp if block else np.full(d, np.nan), bridge, perms, n_shuffles,
                              errors))
    table = pd.DataFrame(rows, columns=[c for c in COMMUNITY_COLUMNS if not c.endswith("_adj")])
    return cast(pd.DataFrame, with_adjusted(table, COMMUNITY_PVALUES)[COMMUNITY_COLUMNS])
