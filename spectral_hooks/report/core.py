"""The `Report`: a set of tidy pandas tables plus JSON metadata.

A report holds one DataFrame per *section* (``power``, ``spectra``, ``jacobian``, ``bottleneck``,
``trends``, ``topology``, ``units``, ``propagation``, ``shared_weights``, or any other name).
Sections may be given as DataFrames or as zero-argument callables returning one; a callable is
called on first access only and its result cached, so an analysis that is never looked at is
never computed.

Saving writes one file per section (Parquet when pyarrow is importable, CSV otherwise) plus
``metadata.json`` holding the metadata, a schema version and the exact dtype of every column, so
that `Report.load` restores every table exactly -- bool, integer, float (NaN included), complex,
string, categorical and nullable columns -- without pickle.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Union

import numpy as np
import pandas as pd

__all__ = ["Report", "SECTION_NAMES", "KEY_COLUMNS", "SCHEMA_VERSION"]

logger = logging.getLogger(__name__)

#: Known sections, in the order they are shown.
SECTION_NAMES: tuple[str, ...] = (
    "power",
    "spectra",
    "shared_weights",
    "jacobian",
    "trends",
    "bottleneck",
    "propagation",
    "topology",
    "units",
)

#: Columns that identify a row; `Report.compare` matches rows on those present in both tables.
KEY_COLUMNS: tuple[str, ...] = (
    "source",
    "variant",
    "metric",
    "layer",
    "position",
    "depth",
    "unit",
    "index",
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

SectionSource = Union[pd.DataFrame, Callable[[], pd.DataFrame]]


class _Missing:
    pass


_NOT_YET = _Missing()


def _check_section_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(
            f"invalid section name {name!r}: use letters, digits, '_', '-' or '.' "
            "(it becomes a file name when the report is saved)"
        )
    return name


class Report:
    """Tidy tables (one per analysis section) plus metadata.

    Parameters
    ----------
    sections:
        Mapping from section name to a DataFrame, or to a zero-argument callable returning a
        DataFrame (or None when the analysis turns out to be unavailable). Callables are
        resolved lazily, once, on first access, under a per-section lock.
    metadata:
        JSON-able values describing the run (model name, config hash, inputs summary, options,
        library versions, timings, ...). Kept as given; `save` adds ``spectral_hooks_version``.

    Access a section as an attribute (``report.power``) or by name (``report["power"]``).
    Known sections that were not computed read as None through their attribute; ``report[name]``
    raises KeyError for them. ``report.sections`` lists the names present.
    """

    def __init__(
        self,
        sections: Mapping[str, SectionSource] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        sections = {} if sections is None else sections
        if not isinstance(sections, Mapping):
            raise TypeError(f"sections must be a mapping of name -> DataFrame, got {type(sections).__name__}")
        if metadata is not None and not isinstance(metadata, Mapping):
            raise TypeError(f"metadata must be a mapping, got {type(metadata).__name__}")
        self._sources: dict[str, SectionSource] = {}
        for name, source in sections.items():
            _check_section_name(name)
            if source is None:
                continue
            if not (isinstance(source, pd.DataFrame) or callable(source)):
                raise TypeError(
                    f"section {name!r} must be a pandas DataFrame or a callable returning one, "
                    f"got {type(source).__name__}"
                )
            self._sources[name] = source
        self._cache: dict[str, Any] = {}
        self._locks: dict[str, threading.Lock] = {name: threading.Lock() for name in self._sources}
        self.metadata: dict[str, Any] = dict(metadata or {})

    # ------------------------------------------------------------------ sections
    @property
    def sections(self) -> list[str]:
        """Names of the sections present (known ones in canonical order, then the others)."""
        known = [n for n in SECTION_NAMES if n in self._sources]
        return known + [n for n in self._sources if n not in SECTION_NAMES]

    def is_computed(self, name: str) -> bool:
        """Whether section ``name`` is available without calling anything."""
        return name in self._cache or isinstance(self._sources.get(name), pd.DataFrame)

    def get(self, name: str, default: Any = None) -> pd.DataFrame | None:
        """The section's DataFrame (computing it if lazy), or ``default`` if absent."""
        if name not in self._sources:
            return default
        source = self._sources[name]
        if isinstance(source, pd.DataFrame):
            return source
        if name in self._cache:
            return self._cache[name]
        with self._locks[name]:
            if name not in self._cache:  # another thread may have resolved it meanwhile
                value = source()
                if value is not None and not isinstance(value, pd.DataFrame):
                    raise TypeError(
                        f"section {name!r}: the callable returned {type(value).__name__}, "
                        "expected a pandas DataFrame or None"
                    )
                self._cache[name] = value
        result = self._cache[name]
        return default if result is None else result

    def __getitem__(self, name: str) -> pd.DataFrame:
        value = self.get(name, _NOT_YET)
        if value is _NOT_YET:
            raise KeyError(f"no section {name!r} in this report; present: {self.sections}")
        return value  # type: ignore[return-value]

    def __contains__(self, name: object) -> bool:
        return name in self._sources

    def __iter__(self) -> Iterator[str]:
        return iter(self.sections)

    def __len__(self) -> int:
        return len(self._sources)

    def items(self) -> Iterator[tuple[str, pd.DataFrame]]:
        """(name, DataFrame) for every section present, computing lazy ones."""
        for name in self.sections:
            df = self.get(name)
            if df is not None:
                yield name, df

    power = property(lambda self: self.get("power"), doc="Power-method view, one row per layer.")
    spectra = property(lambda self: self.get("spectra"), doc="Eigenvalues in long format.")
    jacobian = property(lambda self: self.get("jacobian"), doc="Jacobian view, layer x position.")
    bottleneck = property(lambda self: self.get("bottleneck"), doc="Cumulative ranks, variant x depth.")
    trends = property(lambda self: self.get("trends"), doc="Spearman depth trends per metric.")
    topology = property(lambda self: self.get("topology"), doc="Unit-graph topology, one row per layer.")
    units = property(lambda self: self.get("units"), doc="Per-unit topology, layer x unit.")
    propagation = property(lambda self: self.get("propagation"), doc="Perturbation propagation.")
    shared_weights = property(lambda self: self.get("shared_weights"), doc="Shared-weight analysis.")

    def __repr__(self) -> str:
        model = self.metadata.get("model")
        parts = [f"sections={self.sections!r}"]
        if model is not None:
            parts.append(f"model={model!r}")
        return f"Report({', '.join(parts)})"

    # ------------------------------------------------------------------ save / load
    def save(self, directory: str | os.PathLike[str], *, format: str | None = None) -> Path:
        """Write every section and ``metadata.json`` into ``directory`` (created if needed).

        ``format`` is ``"parquet"`` (default when pyarrow is importable) or ``"csv"``. Lazy
        sections are computed. Returns the directory as a Path. Raises OSError with a clear
        message when the directory cannot be created or written, ValueError/TypeError when a
        table or the metadata cannot be stored faithfully.
        """
        if format is None:
            format = "parquet" if _HAVE_PYARROW else "csv"
        if format not in ("parquet", "csv"):
            raise ValueError(f"format must be 'parquet' or 'csv', got {format!r}")
        if format == "parquet" and not _HAVE_PYARROW:
            raise ImportError("format='parquet' needs pyarrow; install it or use format='csv'")
        out = Path(directory)
        _prepare_dir(out)

        import spectral_hooks  # late: the package imports this module

        metadata = dict(self.metadata)
        metadata.setdefault("spectral_hooks_version", getattr(spectral_hooks, "__version__", "unknown"))
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
        for name, df in self.items():
            filename = f"{name}.{format}"
            info = _write_table(df, out / filename, format, name)
            info["file"] = filename
            manifest["sections"][name] = info
        text = json.dumps(manifest, indent=2, allow_nan=True, ensure_ascii=False)
        _write_text(out / METADATA_FILE, text)
        return out

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> Report:
        """Read a report written by `save` (no pickle involved)."""
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
        return cls(sections, manifest.get("metadata", {}))

    # ------------------------------------------------------------------ compare
    def compare(self, other: Report) -> Report:
        """Per-section differences ``self - other``.

        Read ``after.compare(before)`` as "after minus before" (and ``trained.compare(init)`` as
        trained minus init). Rows are matched on the key columns (`KEY_COLUMNS`: source, variant,
        metric, layer, position, depth, unit, index) present in both tables; repeated keys are
        matched in order of appearance. Numeric columns present on both sides become
        ``self - other`` (bool columns as int: +1 means False -> True); key columns are kept;
        other non-numeric columns are dropped. Rows present on one side only, sections present
        on one side only and dropped columns are listed in ``metadata["compare"]``. A report
        compared with itself is all zeros.
        """
        if not isinstance(other, Report):
            raise TypeError(f"compare expects a Report, got {type(other).__name__}")
        info: dict[str, Any] = {
            "sign": "self - other",
            "self": _short_meta(self.metadata),
            "other": _short_meta(other.metadata),
            "skipped_sections": {},
            "notes": {},
        }
        out: dict[str, pd.DataFrame] = {}
        for name in self.sections + [n for n in other.sections if n not in self._sources]:
            a = self.get(name)
            b = other.get(name)
            if a is None or b is None:
                side = "other" if a is not None else "self"
                info["skipped_sections"][name] = f"not present in {side}"
                continue
            diff, notes = _diff_tables(a, b)
            out[name] = diff
            if notes:
                info["notes"][name] = notes
        return Report(out, {"compare": info})

    # ------------------------------------------------------------------ display
    def _repr_html_(self) -> str:
        from .html import notebook_html

        return notebook_html(self)

    def to_html(self, path: str | os.PathLike[str] | None = None, *, figures: bool = True) -> str:
        """The self-contained HTML report as a string; also written to ``path`` when given."""
        from .html import render_html, write_html

        if path is None:
            return render_html(self, figures=figures)
        return write_html(self, path, figures=figures)

    def plot(self, name: str):
        """One figure by name (see `spectral_hooks.report.plots.FIGURES`)."""
        from .plots import figure

        return figure(self, name)

    def figures(self) -> dict:
        """Every figure the present sections allow, by name."""
        from .plots import figures

        return figures(self)


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
        raise OSError(exc.errno, f"cannot save report: directory {str(out)!r} is not writable ({exc.strerror})") from None


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot save report: cannot write {str(path)!r} ({exc.strerror})") from None


def _to_jsonable(value: Any, where: str) -> Any:
    """Strictly JSON-able copy (numpy scalars/arrays converted); TypeError naming the key."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return _to_jsonable(value.tolist(), where)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where}: key {k!r} is not a string")
            out[k] = _to_jsonable(v, f"{where}[{k!r}]")
        return out
    if isinstance(value, (list, tuple)):
        return [_to_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise TypeError(f"{where} holds a {type(value).__name__}, which is not JSON-able")


# ---------------------------------------------------------------------- helpers: tables
def _column_kind(s: pd.Series) -> str:
    dt = s.dtype
    if isinstance(dt, pd.CategoricalDtype):
        return "category"
    if pd.api.types.is_bool_dtype(dt) and not isinstance(dt, pd.api.extensions.ExtensionDtype):
        return "bool"
    if isinstance(dt, pd.StringDtype) or dt == object:
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


def _json_cell(x: Any, where: str) -> str:
    if x is pd.NA:
        return '{"__na__": true}'
    if isinstance(x, np.generic):
        x = x.item()
    try:
        return json.dumps(x, allow_nan=True, ensure_ascii=False)
    except TypeError:
        raise TypeError(f"{where}: value {x!r} ({type(x).__name__}) cannot be stored") from None


def _unjson_cell(text: str) -> Any:
    value = json.loads(text)
    if isinstance(value, dict) and value == {"__na__": True}:
        return pd.NA
    return value


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


def _encode_csv_column(s: pd.Series, kind: str, where: str) -> pd.Series:
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
        out = [_json_cell(v, where) for v in values]
    return pd.Series(out, dtype=object)


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


def _decode_csv_column(cells: list[str], kind: str, dtype: str, entry: Mapping[str, Any]) -> pd.Series:
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
    values = [_unjson_cell(c) for c in cells]
    if kind == "nullable":
        return pd.Series(values, dtype=object).astype(dtype)
    return _finish_text(values, kind, dtype, entry)


def _finish_text(values: list[Any], kind: str, dtype: str, entry: Mapping[str, Any]) -> pd.Series:
    if kind == "category":
        cats = [_unjson_cell(c) for c in entry["categories"]]
        cat_index = pd.Index(cats, dtype=object)
        cdt = entry.get("categories_dtype")
        if cdt:
            cat_index = cat_index.astype(cdt)
        values = [None if (v is pd.NA or (isinstance(v, float) and math.isnan(v))) else v for v in values]
        return pd.Series(pd.Categorical(values, categories=cat_index, ordered=bool(entry.get("ordered"))))
    s = pd.Series(values, dtype=object)
    return s if dtype == "object" else s.astype(dtype)


# ---------------------------------------------------------------------- helpers: compare
def _short_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    keep = ("model", "config_hash", "label", "spectral_hooks_version")
    out = {}
    for k in keep:
        if k in meta:
            try:
                out[k] = _to_jsonable(meta[k], k)
            except TypeError:
                out[k] = str(meta[k])
    return out


def _is_diffable(s: pd.Series) -> bool:
    dt = s.dtype
    if isinstance(dt, pd.CategoricalDtype) or isinstance(dt, pd.StringDtype) or dt == object:
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
    dropped = [c for c in a.columns if c not in keys and c not in values]
    dropped += [c for c in b.columns if c not in a.columns and c not in keys]
    if dropped:
        notes["dropped_columns"] = dropped
    occ = "__occurrence__"
    if keys:
        left = a[keys + values].copy()
        right = b[keys + values].copy()
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
    for c in values:
        out[c] = _as_diff_values(merged[f"{c}__self"]) - _as_diff_values(merged[f"{c}__other"])
    out.index = pd.RangeIndex(len(out))
    return out, notes
