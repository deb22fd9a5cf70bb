"""Saving and loading reports: one file per section plus ``metadata.json``.

`save_tables` writes one file per section (Parquet when pyarrow is importable, CSV otherwise)
plus ``metadata.json`` holding the metadata, a schema version and the exact dtype of every
column; `load_tables` reads them back exactly -- bool, integer, float (NaN included), complex,
string, categorical and nullable columns -- without pickle. `spectral_hooks.report.Report.save`
and `spectral_hooks.report.Report.load` are the public entry points.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from .._version import __version__
from .encoding import (
    _column_kind,
    _decode_csv_column,
    _encode_csv_column,
    _finish_text,
    _json_cell,
    _to_jsonable,
    _unjson_cell,
)

#: Version of the on-disk layout written by `Report.save`.
SCHEMA_VERSION = 1
FORMAT_NAME = "spectral_hooks.report"
METADATA_FILE = "metadata.json"

# Module-level so that tests can exercise the CSV path by monkeypatching it.
_HAVE_PYARROW = importlib.util.find_spec("pyarrow") is not None

_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")
_COMPLEX_RE_PREFIX = "__re__"
_COMPLEX_IM_PREFIX = "__im__"
_INDEX_PREFIX = "__index_level_"


def _check_section_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(
            f"invalid section name {name!r}: use letters, digits, '_', '-' or '.' "
            "(it becomes a file name when the report is saved)"
        )
    return name


def save_tables(
    tables: Iterable[tuple[str, pd.DataFrame]],
    metadata: Mapping[str, Any],
    directory: str | os.PathLike[str],
    *,
    format: str | None = None,
) -> Path:
    """Write ``(name, table)`` pairs and ``metadata.json`` into ``directory``; see `Report.save`.

    >>> import tempfile                                              # doctest: +SKIP
    >>> save_tables([("power", df)], {"model": "demo"}, tempfile.mkdtemp())  # doctest: +SKIP

    Plain tables and a metadata mapping: this module knows nothing of `Report`.
    """
    if format is None:
        format = "parquet" if _HAVE_PYARROW else "csv"
    if format not in ("parquet", "csv"):
        raise ValueError(f"format must be 'parquet' or 'csv', got {format!r}")
    if format == "parquet" and not _HAVE_PYARROW:
        raise ImportError("format='parquet' needs pyarrow; install it or use format='csv'")
    out = Path(directory)
    _prepare_dir(out)

    metadata = dict(metadata)
    metadata.setdefault("spectral_hooks_version", __version__)
    try:
        metadata_json = _to_jsonable(metadata, "metadata")
    except TypeError as exc:
        raise ValueError(f"report metadata is not JSON-serialisable: {exc}") from None

    manifest: dict[str, Any] = {
        "format": FORMAT_NAME,
        "schema_version": SCHEMA_VERSION,
        "metadata": metadata_json,
        "sections": {},
    }
    for name, df in tables:
        filename = f"{name}.{format}"
        info = _write_table(df, out / filename, format, name)
        info["file"] = filename
        manifest["sections"][name] = info
    text = json.dumps(manifest, indent=2, allow_nan=True, ensure_ascii=False)
    _write_text(out / METADATA_FILE, text)
    return out


def load_tables(directory: str | os.PathLike[str]) -> tuple[dict[str, pd.DataFrame], Any]:
    """(sections, metadata) of a report written by `save_tables` (no pickle involved)."""
    root = Path(directory)
    meta_path = root / METADATA_FILE
    if not root.is_dir():
        raise FileNotFoundError(f"report directory not found: {str(root)!r}")
    if not meta_path.is_file():
        raise FileNotFoundError(
            f"{str(root)!r} is not a saved report: it has no {METADATA_FILE} (write one with Report.save)"
        )
    try:
        manifest = json.loads(meta_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{meta_path}: not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise ValueError(f"{meta_path}: not a spectral_hooks report manifest")
    version = manifest.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise ValueError(
            f"{meta_path}: schema version {version!r} is newer than this spectral_hooks "
            f"understands ({SCHEMA_VERSION}); upgrade spectral_hooks"
        )
    sections: dict[str, pd.DataFrame] = {}
    for name, info in manifest.get("sections", {}).items():
        _check_section_name(name)
        filename = info.get("file", "")
        if not isinstance(filename, str) or Path(filename).name != filename or filename in ("", ".", ".."):
            raise ValueError(f"{meta_path}: section {name!r} names an invalid file {filename!r}")
        sections[name] = _read_table(root / filename, info, name)
    return sections, manifest.get("metadata", {})


# ---------------------------------------------------------------------- helpers: files
def _prepare_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"cannot save report: {str(out)!r} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot save report: cannot create directory {str(out)!r} ({exc.strerror})") from None
    probe = out / ".spectral_hooks_write_test"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise OSError(exc.errno, f"cannot save report: directory {str(out)!r} is not writable "
                                 f"({exc.strerror})") from None


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot save report: cannot write {str(path)!r} ({exc.strerror})") from None



# ---------------------------------------------------------------------- helpers: tables
def _flatten_index(df: pd.DataFrame, section: str) -> tuple[pd.DataFrame, dict[str, Any] | None]:
    idx = df.index
    if (
        isinstance(idx, pd.RangeIndex)
        and idx.start == 0
        and idx.step == 1
        and idx.name is None
    ):
        return df, None
    names = list(idx.names)
    cols = [f"{_INDEX_PREFIX}{i}__" for i in range(len(names))]
    flat = df.copy()
    flat.index = idx.set_names(cols)
    flat = flat.reset_index()
    try:
        json_names = _to_jsonable(names, f"section {section!r} index names")
    except TypeError as exc:
        raise TypeError(str(exc)) from None
    return flat, {"columns": cols, "names": json_names}


def _write_table(df: pd.DataFrame, path: Path, format: str, section: str) -> dict[str, Any]:
    if not isinstance(df.columns, pd.Index) or isinstance(df.columns, pd.MultiIndex):
        raise ValueError(f"section {section!r}: MultiIndex columns cannot be saved; flatten them first")
    for c in df.columns:
        if not isinstance(c, str):
            raise ValueError(f"section {section!r}: column name {c!r} is not a string")
        if c.startswith((_COMPLEX_RE_PREFIX, _COMPLEX_IM_PREFIX, _INDEX_PREFIX)):
            raise ValueError(f"section {section!r}: column name {c!r} uses a reserved prefix")
    if df.columns.duplicated().any():
        dup = list(df.columns[df.columns.duplicated()])
        raise ValueError(f"section {section!r}: duplicate column names {dup}")
    flat, index_info = _flatten_index(df, section)

    columns: list[dict[str, Any]] = []
    encoded: dict[str, pd.Series] = {}
    for col in flat.columns:
        s = flat[col]
        try:
            kind = _column_kind(s)
        except TypeError as exc:
            raise TypeError(
                f"section {section!r}, column {col!r}: {exc}; convert it to a number or string first"
            ) from None
        entry: dict[str, Any] = {"name": col, "dtype": str(s.dtype), "kind": kind}
        if kind == "category":
            cats = s.cat.categories
            entry["categories"] = [_json_cell(c, f"section {section!r}, column {col!r}") for c in cats]
            entry["categories_dtype"] = str(cats.dtype)
            entry["ordered"] = bool(s.cat.ordered)
        columns.append(entry)
        where = f"section {section!r}, column {col!r}"
        if format == "csv":
            encoded[col] = _encode_csv_column(s, kind, where)
        else:
            if kind == "complex":
                encoded[_COMPLEX_RE_PREFIX + col] = pd.Series(s.to_numpy().real)
                encoded[_COMPLEX_IM_PREFIX + col] = pd.Series(s.to_numpy().imag)
            elif kind == "text" or kind == "category":
                encoded[col] = pd.Series([_json_cell(x, where) for x in s.astype(object)], dtype=object)
            else:
                encoded[col] = s.reset_index(drop=True)
    table = pd.DataFrame(encoded, index=pd.RangeIndex(len(flat)))
    if format == "csv":
        try:
            if len(table.columns) == 0:
                path.write_text("", encoding="utf-8")
            else:
                table.to_csv(path, index=False, lineterminator="\n")
        except OSError as exc:
            raise OSError(exc.errno, f"cannot save report: cannot write {str(path)!r} ({exc.strerror})") from None
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        arrays = {}
        for col in table.columns:
            s = table[col]
            if s.dtype == object:
                arrays[col] = pa.array(s.tolist(), type=pa.string())
            elif isinstance(s.dtype, pd.api.extensions.ExtensionDtype):
                arrays[col] = pa.array(s.array)
            else:
                arrays[col] = pa.array(s.to_numpy(), from_pandas=False)
        try:
            pq.write_table(pa.table(arrays) if arrays else pa.table({}), path)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot save report: cannot write {str(path)!r} ({exc})") from None
    return {"format": format, "n_rows": int(len(df)), "columns": columns, "index": index_info,
            "dtypes": {e["name"]: e["dtype"] for e in columns}}


def _read_table(path: Path, info: Mapping[str, Any], section: str) -> pd.DataFrame:
    fmt = info.get("format")
    if not path.is_file():
        raise FileNotFoundError(f"report section {section!r}: file {str(path)!r} is missing")
    columns = info.get("columns", [])
    n_rows = int(info.get("n_rows", 0))
    if fmt == "csv":
        if path.stat().st_size == 0:
            raw = pd.DataFrame(index=pd.RangeIndex(n_rows))
        else:
            raw = pd.read_csv(path, dtype=object, keep_default_na=False, na_filter=False)
    elif fmt == "parquet":
        if not _HAVE_PYARROW:
            raise ImportError(f"report section {section!r} is stored as Parquet; reading it needs pyarrow")
        import pyarrow.parquet as pq

        raw = pq.read_table(path).to_pandas()  # plain columns only: pandas metadata not used
    else:
        raise ValueError(f"report section {section!r}: unknown storage format {fmt!r}")

    data: dict[str, pd.Series] = {}
    for entry in columns:
        name, kind, dtype = entry["name"], entry["kind"], entry["dtype"]
        if fmt == "csv":
            cells = raw[name].tolist() if n_rows else []
            data[name] = _decode_csv_column(cells, kind, dtype, entry)
        else:
            if kind == "complex":
                re_ = raw[_COMPLEX_RE_PREFIX + name].to_numpy()
                im_ = raw[_COMPLEX_IM_PREFIX + name].to_numpy()
                data[name] = pd.Series(re_ + 1j * im_, dtype=dtype)
            elif kind in ("text", "category"):
                cells = [_unjson_cell(x) for x in raw[name].tolist()]
                data[name] = _finish_text(cells, kind, dtype, entry)
            else:
                s = raw[name]
                data[name] = s if str(s.dtype) == dtype else s.astype(dtype)
    df = pd.DataFrame({k: v.reset_index(drop=True) for k, v in data.items()}, index=pd.RangeIndex(n_rows))
    df = df[[e["name"] for e in columns]] if columns else df
    index_info = info.get("index")
    if index_info:
        cols = index_info["columns"]
        df = df.set_index(cols)
        names = index_info["names"]
        df.index = df.index.set_names(names if len(names) > 1 else names[0])
    return df

