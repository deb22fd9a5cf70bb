"""Compare a freshly computed report with one saved before the analysis-layer rebuild."""

from __future__ import annotations

import numpy as np
import pandas as pd

from spectral_hooks import Report

from .cases import HERE

RTOL, ATOL = 1e-10, 1e-12
#: columns read off an iterative solver's vectors: the same to the solver's tolerance, not to
#: rounding. ``propagation`` takes U_k, V_k from ``svds(tol=1e-8)``, whose subspaces are good to
#: ~tol / (relative gap); another BLAS kernel moved alignment_top by 2.4e-9 (tests/README.md).
#: ``jacobian``'s self_alignment_top{k} likewise reads U_k, V_k of ``svds`` (block Golub-Kahan since
#: issue 37: the same subspaces to 1e-9, not the same bits).
SOLVER_RTOL = {("propagation", "alignment_top"): 1e-6, ("propagation", "alignment_in"): 1e-6}
SOLVER_PREFIXES = {("jacobian", "self_alignment_top"): 1e-6}
#: what a solver paid, not what it found: it changes whenever a solver does (benchmarks/ hold it)
COST_COLUMNS = frozenset({"n_matvecs"})


def rtol_of(section: str, column: str) -> float:
    """The tolerance a saved column is held to (RTOL unless a solver's vectors made it)."""
    for (sec, prefix), rtol in SOLVER_PREFIXES.items():
        if section == sec and column.startswith(prefix):
            return rtol
    return SOLVER_RTOL.get((section, column), RTOL)
#: columns that exist only when asked for since issue 36 (``gamma_u``: with power.direction);
#: the saved reports hold them all NaN, and a fresh default report has no such column
ASKED_FOR_ONLY = frozenset({"gamma_u"})
#: columns added after the reports were saved (issue 54: the kind of each row's block): a fresh
#: report has them, a saved one does not, so they are checked against the fresh report's
#: metadata (the anatomy's kind of every layer) instead; where a saved report has them, they
#: compare exactly, as every text column does
ADDED_SINCE = {"mixer": "layer_mixers", "mlp": "layer_mlps"}


def _check_added(where: str, new: pd.DataFrame, old: pd.DataFrame, report: Report) -> pd.DataFrame:
    added = [c for c in new.columns if c in ADDED_SINCE and c not in old.columns]
    for column in added:
        kinds = report.metadata[ADDED_SINCE[column]]
        expected = [kinds[layer] for layer in new["layer"].tolist()]
        assert new[column].astype(object).tolist() == expected, f"{where}.{column}"
    return new.drop(columns=added)


def assert_same_as_saved(name: str, report: Report) -> None:
    saved = Report.load(HERE / "saved" / name)
    assert set(report.sections) == set(saved.sections), name
    for section in saved.sections:
        old, new = saved[section], report[section]
        where = f"{name}/{section}"
        dropped = [c for c in old.columns if c in ASKED_FOR_ONLY and c not in new.columns]
        assert all(old[c].isna().all() for c in dropped), where
        old = old.drop(columns=dropped)
        new = _check_added(where, new, old, report)
        assert sorted(new.columns) == sorted(old.columns), where
        assert len(new) == len(old), where
        for column in old.columns:
            if column in COST_COLUMNS:
                continue
            a, b = old[column].to_numpy(), new[column].to_numpy()
            if pd.api.types.is_numeric_dtype(old[column]) and not pd.api.types.is_bool_dtype(
                    old[column]):
                np.testing.assert_allclose(b.astype(complex if np.iscomplexobj(a) else float),
                                           a, rtol=rtol_of(section, column),
                                           atol=ATOL, equal_nan=True,
                                           err_msg=f"{where}.{column}")
            else:
                assert [str(v) for v in b] == [str(v) for v in a], f"{where}.{column}"
