"""Comparing reports: per-section differences ``self - other`` matched on key columns."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import numpy as np
import pandas as pd

from .encoding import to_jsonable
from .sections_info import LABEL_COLUMNS

#: Columns that identify a row; `Report.compare` matches rows on those present in both tables.
KEY_COLUMNS: tuple[str, ...] = (
    "source",
    "variant",
    "ablated_layer",
    "metric",
    "layer",
    "position",
    "depth",
    "unit",
    "index",
)


def compare_sections(
    mine: Mapping[str, Optional[pd.DataFrame]],
    other: Mapping[str, Optional[pd.DataFrame]],
    *,
    mine_metadata: Mapping[str, Any],
    other_metadata: Mapping[str, Any],
) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    """(sections, ``metadata["compare"]``) of ``mine - other``; see `Report.compare`.

    >>> a = {"power": pd.DataFrame({"layer": [0, 1], "gap_ratio": [0.5, 0.25]})}
    >>> b = {"power": pd.DataFrame({"layer": [0, 1], "gap_ratio": [0.25, 0.25]})}
    >>> out, info = compare_sections(a, b, mine_metadata={}, other_metadata={})
    >>> out["power"]["gap_ratio"].tolist(), info["sign"]
    ([0.25, 0.0], 'self - other')

    Works on plain tables (a section mapped to None counts as absent) and metadata mappings.
    """
    info: dict[str, Any] = {
        "sign": "self - other",
        "self": _short_meta(mine_metadata),
        "other": _short_meta(other_metadata),
        "skipped_sections": {},
        "notes": {},
    }
    out: dict[str, pd.DataFrame] = {}
    for name in list(mine) + [n for n in other if n not in mine]:
        a = mine.get(name)
        b = other.get(name)
        if a is None or b is None:
            side = "other" if a is not None else "self"
            info["skipped_sections"][name] = f"not present in {side}"
            continue
        diff, notes = _diff_tables(a, b)
        out[name] = diff
        if notes:
            info["notes"][name] = notes
    return out, info


def _short_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    keep = ("model", "config_hash", "label", "spectral_hooks_version")
    out = {}
    for k in keep:
        if k in meta:
            try:
                out[k] = to_jsonable(meta[k], k)
            except TypeError:
                out[k] = str(meta[k])
    return out


def _is_diffable(s: pd.Series) -> bool:
    dt = s.dtype
    if isinstance(dt, pd.CategoricalDtype) or isinstance(dt, pd.StringDtype) or pd.api.types.is_object_dtype(dt):
        return False
    return pd.api.types.is_numeric_dtype(dt) or pd.api.types.is_bool_dtype(dt)


def _as_diff_values(s: pd.Series) -> pd.Series:
    dt = s.dtype
    if pd.api.types.is_bool_dtype(dt):
        if isinstance(dt, pd.api.extensions.ExtensionDtype):
            return s.astype("Int64")
        return s.astype(np.int64)
    if pd.api.types.is_unsigned_integer_dtype(dt) and not isinstance(dt, pd.api.extensions.ExtensionDtype):
        return s.astype(np.int64)
    return s


def _diff_tables(a: pd.DataFrame, b: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, Any]]:
    notes: dict[str, Any] = {}
    a = a.reset_index(drop=True)
    b = b.reset_index(drop=True)
    keys = [k for k in KEY_COLUMNS if k in a.columns and k in b.columns]
    values = [
        c for c in a.columns
        if c not in keys and c in b.columns and _is_diffable(a[c]) and _is_diffable(b[c])
    ]
    labels = [c for c in LABEL_COLUMNS if keys and c in a.columns and c in b.columns]
    occ = "__occurrence__"
    if keys:
        left = a[keys + labels + values].copy()
        right = b[keys + labels + values].copy()
        left[occ] = left.groupby(keys, dropna=False, sort=False).cumcount()
        right[occ] = right.groupby(keys, dropna=False, sort=False).cumcount()
        on = keys + [occ]
    else:
        notes["matched_by"] = "row order (no key columns)"
        left = a[values].copy()
        right = b[values].copy()
        left[occ] = np.arange(len(left))
        right[occ] = np.arange(len(right))
        on = [occ]
    merged = left.merge(right, on=on, how="inner", suffixes=("__self", "__other"), sort=False)
    only_self = len(left) - len(merged)
    only_other = len(right) - len(merged)
    if only_self:
        notes["rows_only_in_self"] = int(only_self)
    if only_other:
        notes["rows_only_in_other"] = int(only_other)
    out = pd.DataFrame({k: merged[k] for k in keys})
    kept = _same_labels(merged, labels)
    at = keys.index("layer") + 1 if "layer" in keys else len(keys)
    for offset, c in enumerate(kept):
        out.insert(at + offset, c, merged[f"{c}__self"])
    dropped = [c for c in a.columns if c not in keys and c not in values and c not in kept]
    dropped += [c for c in b.columns if c not in a.columns and c not in keys]
    if dropped:
        notes["dropped_columns"] = dropped
    for c in values:
        out[c] = _as_diff_values(merged[f"{c}__self"]) - _as_diff_values(merged[f"{c}__other"])
    out.index = pd.RangeIndex(len(out))
    return out, notes


def _same_labels(merged: pd.DataFrame, labels: list[str]) -> list[str]:
    """The label columns (a layer's kinds) equal on both sides of every matched row: the diff
    keeps them; the others are dropped (listed in ``dropped_columns``)."""
    return [c for c in labels
            if merged[f"{c}__self"].astype(str).equals(merged[f"{c}__other"].astype(str))]
