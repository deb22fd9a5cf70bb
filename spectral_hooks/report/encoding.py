"""Value encodings for saved reports: JSON-able metadata, column kinds and cell codecs.

Every column of a saved table has a *kind* (``bool``, ``int``, ``float``, ``complex``, ``text``,
``category`` or ``nullable``) recorded next to its exact dtype in ``metadata.json``; the
functions here turn a column into the strings or plain arrays written to disk and back, so that
`spectral_hooks.report.Report.load` restores every value exactly (None, NaN and ``pd.NA`` kept
apart) without pickle.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd


# ---------------------------------------------------------------------- JSON
def to_jsonable(value: Any, where: str) -> Any:
    """Strictly JSON-able copy (numpy scalars/arrays converted); TypeError naming the key.

    >>> to_jsonable({"n": np.int64(3), "x": np.arange(2)}, "metadata")
    {'n': 3, 'x': [0, 1]}
    """
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist(), where)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where}: key {k!r} is not a string")
            out[k] = to_jsonable(v, f"{where}[{k!r}]")
        return out
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise TypeError(f"{where} holds a {type(value).__name__}, which is not JSON-able")


# ---------------------------------------------------------------------- columns and cells
def column_kind(s: pd.Series) -> str:
    """The storage kind of a column (TypeError for a dtype that cannot be stored exactly).

    >>> column_kind(pd.Series([1, 2])), column_kind(pd.Series(["a"])), column_kind(pd.Series([1j]))
    ('int', 'text', 'complex')
    """
    dt = s.dtype
    if isinstance(dt, pd.CategoricalDtype):
        return "category"
    if pd.api.types.is_bool_dtype(dt) and not isinstance(dt, pd.api.extensions.ExtensionDtype):
        return "bool"
    if isinstance(dt, pd.StringDtype) or pd.api.types.is_object_dtype(dt):
        return "text"
    if isinstance(dt, pd.api.extensions.ExtensionDtype):
        if pd.api.types.is_bool_dtype(dt) or pd.api.types.is_integer_dtype(dt) or pd.api.types.is_float_dtype(dt):
            return "nullable"
        raise TypeError(f"unsupported dtype {dt}")
    if pd.api.types.is_complex_dtype(dt):
        return "complex"
    if pd.api.types.is_integer_dtype(dt):
        return "int"
    if pd.api.types.is_float_dtype(dt):
        return "float"
    raise TypeError(f"unsupported dtype {dt}")


def json_cell(x: Any, where: str) -> str:
    """One cell as JSON text (``pd.NA`` as its own marker); TypeError naming ``where``.

    >>> json_cell(None, "c"), json_cell(pd.NA, "c"), unjson_cell(json_cell(pd.NA, "c")) is pd.NA
    ('null', '{"__na__": true}', True)
    """
    if x is pd.NA:
        return '{"__na__": true}'
    if isinstance(x, np.generic):
        x = x.item()
    try:
        return json.dumps(x, allow_nan=True, ensure_ascii=False)
    except TypeError:
        raise TypeError(f"{where}: value {x!r} ({type(x).__name__}) cannot be stored") from None


def unjson_cell(text: str) -> Any:
    """The cell :func:`json_cell` wrote.

    >>> unjson_cell('"a"'), unjson_cell("NaN")
    ('a', nan)
    """
    value = json.loads(text)
    if isinstance(value, dict) and value == {"__na__": True}:
        return pd.NA
    return value


def encode_csv_column(s: pd.Series, kind: str, where: str) -> pd.Series:
    """A column of ``kind`` as the exact strings written to a CSV file.

    >>> encode_csv_column(pd.Series([0.1, 1j]), "complex", "c").tolist()
    ['0.1 0.0', '0.0 1.0']
    """
    values = s.to_numpy(dtype=object) if kind in ("text", "category", "nullable") else s.to_numpy()
    if kind == "bool":
        out = ["1" if v else "0" for v in values]
    elif kind == "int":
        out = [str(int(v)) for v in values]
    elif kind == "float":
        out = [repr(float(v)) for v in values]
    elif kind == "complex":
        out = [f"{complex(v).real!r} {complex(v).imag!r}" for v in values]
    else:  # text, category, nullable: JSON per cell keeps None / NaN / NA apart
        out = [json_cell(v, where) for v in values]
    return pd.Series(out, dtype=object)


def decode_csv_column(cells: list[str], kind: str, dtype: str, entry: Mapping[str, Any]) -> pd.Series:
    """The column :func:`encode_csv_column` wrote, as ``dtype`` (``entry``: its manifest entry).

    >>> decode_csv_column(["1", "0"], "bool", "bool", {}).tolist()
    [True, False]
    """
    if kind == "bool":
        return pd.Series(np.array([c == "1" for c in cells], dtype=bool))
    if kind == "int":
        return pd.Series(np.array([int(c) for c in cells], dtype=object)).astype(dtype)
    if kind == "float":
        return pd.Series(np.array([float(c) for c in cells], dtype=np.float64)).astype(dtype)
    if kind == "complex":
        vals = []
        for c in cells:
            r, i = c.split(" ")
            vals.append(complex(float(r), float(i)))
        return pd.Series(np.array(vals, dtype=np.complex128)).astype(dtype)
    values = [unjson_cell(c) for c in cells]
    if kind == "nullable":
        return pd.Series(values, dtype=object).astype(dtype)
    return finish_text(values, kind, dtype, entry)


def finish_text(values: list[Any], kind: str, dtype: str, entry: Mapping[str, Any]) -> pd.Series:
    """Decoded text or category cells as a column of ``dtype`` (categories from ``entry``).

    >>> finish_text(["a", "b"], "category", "category", {"categories": ['"a"', '"b"']}).tolist()
    ['a', 'b']
    """
    if kind == "category":
        cats = [unjson_cell(c) for c in entry["categories"]]
        cat_index = pd.Index(cats, dtype=object)
        cdt = entry.get("categories_dtype")
        if cdt:
            cat_index = cat_index.astype(cdt)
        values = [None if (v is pd.NA or (isinstance(v, float) and math.isnan(v))) else v for v in values]
        return pd.Series(pd.Categorical(values, categories=cat_index, ordered=bool(entry.get("ordered"))))
    s = pd.Series(values, dtype=object)
    return s if dtype == "object" else s.astype(dtype)
