"""Saving and loading reports: one file per section plus ``metadata.json``.

`save_tables` writes one file per section (Parquet when pyarrow is importable, CSV otherwise)
plus ``metadata.json`` holding the metadata, a schema version, the row count and exact dtype of
every column, and the size and SHA-256 of every file; `load_tables` verifies them and reads the
tables back exactly -- bool, integer, float (NaN included), complex, string, categorical and
nullable columns -- without pickle. Every file is written atomically (temp file, fsync, rename;
see `spectral_hooks.report.integrity`), and a damaged or edited report is refused with a
`ReportIntegrityError` unless loaded with ``verify=False``. `spectral_hooks.report.Report.save`
and `spectral_hooks.report.Report.load` are the public entry points.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd

from .._version import __version__
from ..checks import check_bool, check_choice
from ..errors import MissingExtraError, OptionError
from .encoding import (
    column_kind,
    decode_csv_column,
    encode_csv_column,
    finish_text,
    json_cell,
    to_jsonable,
    unjson_cell,
)
from .integrity import (
    MANIFEST_CHECKSUM_KEY,
    ReportIntegrityError,
    atomic_write_bytes,
    check_shape,
    check_structure,
    manifest_checksum,
    verify_file,
    verify_manifest,
)
from .metadata import ReportMetadata

#: Version of the on-disk layout written by `Report.save`.
SCHEMA_VERSION = 2  # 2: file sizes, SHA-256s and the manifest checksum (1 loads unverified)
FORMAT_NAME = "spectral_hooks.report"
METADATA_FILE = "metadata.json"

# Module-level so that tests can exercise the CSV path by monkeypatching it.
_HAVE_PYARROW = importlib.util.find_spec("pyarrow") is not None

_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")
_COMPLEX_RE_PREFIX = "__re__"
_COMPLEX_IM_PREFIX = "__im__"
_INDEX_PREFIX = "__index_level_"


def check_section_name(name: Any) -> str:
    """``name`` if it can be a section's file name (an OptionError otherwise).

    >>> check_section_name("power")
    'power'
    """
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise OptionError("section name", name, "letters, digits, '_', '-' or '.' (at most "
                          "100; it becomes a file name when the report is saved)")
    return name


def save_tables(
    tables: Iterable[tuple[str, pd.DataFrame]],
    metadata: Mapping[str, Any] | ReportMetadata,
    directory: str | os.PathLike[str],
    *,
    format: str | None = None,
) -> Path:
    """Write ``(name, table)`` pairs and ``metadata.json`` into ``directory``; see `Report.save`.

    >>> import tempfile
    >>> out = save_tables([("power", pd.DataFrame({"layer": [0, 1]}))], {"model": "demo"},
    ...                   tempfile.mkdtemp(), format="csv")
    >>> sorted(p.name for p in out.iterdir())
    ['metadata.json', 'power.csv']

    Plain tables and the metadata (a :class:`ReportMetadata` or a mapping): this module knows
    nothing of `Report`. ``spectral_hooks_version`` is set to this version where it is unset.
    """
    if format is None:
        format = "parquet" if _HAVE_PYARROW else "csv"
    check_choice("format", format, ("parquet", "csv"),
                 accepted="'parquet', 'csv' or None (parquet when pyarrow is installed)")
    if format == "parquet" and not _HAVE_PYARROW:
        raise MissingExtraError("pyarrow", "format='parquet'; or use format='csv'")
    out = Path(directory)
    _prepare_dir(out)

    record = ReportMetadata.from_mapping(metadata)
    if record.spectral_hooks_version is None:
        record = record.replace(spectral_hooks_version=__version__)
    try:
        metadata_json = to_jsonable(record.to_dict(), "metadata")
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
    manifest[MANIFEST_CHECKSUM_KEY] = manifest_checksum(manifest)
    text = json.dumps(manifest, indent=2, allow_nan=True, ensure_ascii=False)
    atomic_write_bytes(out / METADATA_FILE, text.encode("utf-8"))  # last: the commit point
    return out


def load_tables(directory: str | os.PathLike[str], *,
                verify: bool = True) -> tuple[dict[str, pd.DataFrame], ReportMetadata]:
    """(sections, metadata) of a report written by `save_tables` (no pickle involved).

    >>> import tempfile
    >>> out = save_tables([("power", pd.DataFrame({"layer": [0, 1]}))], {"model": "demo"},
    ...                   tempfile.mkdtemp(), format="csv")
    >>> sections, metadata = load_tables(out)
    >>> sections["power"]["layer"].tolist(), metadata["model"]
    ([0, 1], 'demo')

    ``verify=True`` checks the manifest's own checksum and each file's size and SHA-256 and
    raises `ReportIntegrityError` naming the damaged file; ``verify=False`` skips those checks
    (for a report edited on purpose) but still refuses a file whose row count or column dtypes
    do not match the manifest.
    """
    check_bool("verify", verify)
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
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReportIntegrityError(f"{meta_path}: not valid JSON ({exc}); the manifest is "
                                   "damaged, save the report again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise ValueError(f"{meta_path}: not a spectral_hooks report manifest")
    version = manifest.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise ValueError(
            f"{meta_path}: schema version {version!r} is newer than this spectral_hooks "
            f"understands ({SCHEMA_VERSION}); upgrade spectral_hooks"
        )
    check_structure(manifest, meta_path)
    for name, info in manifest["sections"].items():
        check_section_name(name)
        filename = info["file"]
        if Path(filename).name != filename or filename in ("", ".", ".."):
            raise ValueError(f"{meta_path}: section {name!r} names an invalid file {filename!r}")
    if verify and version >= 2:
        verify_manifest(manifest, meta_path)
    sections: dict[str, pd.DataFrame] = {}
    for name, info in manifest["sections"].items():
        path = root / info["file"]
        if not path.is_file():
            raise FileNotFoundError(f"report section {name!r}: file {str(path)!r} is missing")
        if verify and version >= 2:
            verify_file(path, info, name)
        sections[name] = _read_table(path, info, name)
    return sections, _metadata_of(manifest, meta_path)


def _metadata_of(manifest: Mapping[str, Any], meta_path: Path) -> ReportMetadata:
    """The manifest's metadata, from this layout or the one before (see ReportMetadata)."""
    stored = manifest.get("metadata", {})
    if not isinstance(stored, Mapping):
        raise ReportIntegrityError(f"{meta_path}: 'metadata' is a {type(stored).__name__}, "
                                   "not a JSON object; the manifest is damaged")
    return ReportMetadata.from_mapping(stored)


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
        json_names = to_jsonable(names, f"section {section!r} index names")
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
            kind = column_kind(s)
        except TypeError as exc:
            raise TypeError(
                f"section {section!r}, column {col!r}: {exc}; convert it to a number or string first"
            ) from None
        entry: dict[str, Any] = {"name": col, "dtype": str(s.dtype), "kind": kind}
        if kind == "category":
            cats = s.cat.categories
            entry["categories"] = [json_cell(c, f"section {section!r}, column {col!r}") for c in cats]
            entry["categories_dtype"] = str(cats.dtype)
            entry["ordered"] = bool(s.cat.ordered)
        columns.append(entry)
        where = f"section {section!r}, column {col!r}"
        if format == "csv":
            encoded[col] = encode_csv_column(s, kind, where)
        else:
            if kind == "complex":
                encoded[_COMPLEX_RE_PREFIX + col] = pd.Series(np.real(s.to_numpy()))
                encoded[_COMPLEX_IM_PREFIX + col] = pd.Series(np.imag(s.to_numpy()))
            elif kind == "text" or kind == "category":
                encoded[col] = pd.Series([json_cell(x, where) for x in s.astype(object)], dtype=object)
            else:
                encoded[col] = s.reset_index(drop=True)
    table = pd.DataFrame(encoded, index=pd.RangeIndex(len(flat)))
    if format == "csv":
        text = "" if len(table.columns) == 0 else table.to_csv(index=False, lineterminator="\n")
        data = text.encode("utf-8")
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
        sink = pa.BufferOutputStream()
        pq.write_table(pa.table(arrays) if arrays else pa.table({}), sink)
        data = sink.getvalue().to_pybytes()
    digest = atomic_write_bytes(path, data)
    return {"format": format, "n_rows": int(len(df)), "columns": columns, "index": index_info,
            "dtypes": {e["name"]: e["dtype"] for e in columns}, "size": len(data),
            "sha256": digest}


def _read_raw(path: Path, fmt: Any, n_rows: int, section: str) -> pd.DataFrame:
    where = f"report section {section!r} ({str(path)!r})"
    if fmt == "csv":
        if path.stat().st_size == 0:
            return pd.DataFrame(index=pd.RangeIndex(n_rows))
        try:
            return pd.read_csv(path, dtype=object, keep_default_na=False, na_filter=False)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise ReportIntegrityError(f"{where}: not a readable CSV file ({exc})") from None
    if fmt == "parquet":
        if not _HAVE_PYARROW:
            raise MissingExtraError("pyarrow", f"report section {section!r} is stored as Parquet")
        import pyarrow.parquet as pq

        try:  # plain columns only: pandas metadata not used
            return pq.read_table(path).to_pandas()
        except (OSError, ValueError) as exc:  # pyarrow.ArrowInvalid is a ValueError
            raise ReportIntegrityError(f"{where}: not a readable Parquet file ({exc})") from None
    raise ReportIntegrityError(f"report section {section!r}: unknown storage format {fmt!r}")


def _read_table(path: Path, info: Mapping[str, Any], section: str) -> pd.DataFrame:
    fmt = info["format"]
    columns = info["columns"]
    n_rows = info["n_rows"]
    raw = _read_raw(path, fmt, n_rows, section)
    check_shape(len(raw), n_rows, section, path)
    data: dict[str, pd.Series] = {}
    for entry in columns:
        try:
            data[entry["name"]] = _decode_column(raw, entry, fmt, n_rows)
        except (KeyError, ValueError, TypeError, OverflowError) as exc:
            raise ReportIntegrityError(
                f"report section {section!r} ({str(path)!r}), column {entry['name']!r}: cannot "
                f"be read as {entry['dtype']} ({type(exc).__name__}: {exc})") from None
        got = str(data[entry["name"]].dtype)
        if got != entry["dtype"]:
            raise ReportIntegrityError(
                f"report section {section!r} ({str(path)!r}), column {entry['name']!r}: "
                f"read as {got}, the manifest says {entry['dtype']}")
    df = pd.DataFrame({k: v.reset_index(drop=True) for k, v in data.items()}, index=pd.RangeIndex(n_rows))
    df = cast(pd.DataFrame, df[[e["name"] for e in columns]]) if columns else df
    index_info = info.get("index")
    if index_info:
        cols = index_info["columns"]
        df = df.set_index(cols)
        names = index_info["names"]
        df.index = df.index.set_names(names if len(names) > 1 else names[0])
    return df


_NUMERIC_KINDS = ("bool", "int", "float", "complex")


def _decode_column(raw: pd.DataFrame, entry: Mapping[str, Any], fmt: str, n_rows: int) -> pd.Series:
    name, kind, dtype = entry["name"], entry["kind"], entry["dtype"]
    declared = column_kind(pd.Series([], dtype=dtype))  # a cast would silently change values
    if declared != kind and (declared in _NUMERIC_KINDS or kind in _NUMERIC_KINDS):
        raise TypeError(f"the manifest stores it as {kind!r} values but declares dtype {dtype}")
    if fmt == "csv":
        cells = raw[name].tolist() if n_rows else []
        return decode_csv_column(cells, kind, dtype, entry)
    if kind == "complex":
        re_ = raw[_COMPLEX_RE_PREFIX + name].to_numpy()
        im_ = raw[_COMPLEX_IM_PREFIX + name].to_numpy()
        return pd.Series(re_ + 1j * im_, dtype=dtype)
    if kind in ("text", "category"):
        cells = [unjson_cell(x) for x in raw[name].tolist()]
        return finish_text(cells, kind, dtype, entry)
    s = raw[name]
    return s if str(s.dtype) == dtype else s.astype(dtype)
