"""Column schemas: what each column of a report section is, and a check that a table matches.

    >>> import pandas as pd
    >>> schema = SectionSchema("demo", (
    ...     Column("layer", "int", "layer index t", "demo"),
    ...     Column("gap_ratio", "float", "|lambda_2| / |lambda_1|", "demo"),
    ... ), key_columns=("layer",))
    >>> schema.validate(pd.DataFrame({"layer": [0, 1], "gap_ratio": [0.5, 0.25]}))
    >>> try:
    ...     schema.validate(pd.DataFrame({"layer": [0.5]}))
    ... except SchemaError as err:
    ...     print(err.problems)
    [('layer', 'dtype float64 is not int'), ('gap_ratio', 'missing')]

A `Column` has a name, a dtype from a small vocabulary (`DTYPES`), a one-line meaning and the
anchor of the heading in ``docs/metrics.md`` where it is defined. A name holding ``*`` declares
a family of columns (``"eig_*"``, ``"*_pvalue"``); such a column is always optional.
The declarations of the library's own sections live in ``spectral_hooks.analysis.columns``;
this module knows none of them (``report/`` sits below ``analysis/``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import numpy as np
import pandas as pd
from pandas.api import types as pdt

from ..errors import SpectralHooksError

__all__ = ["Column", "SectionSchema", "SchemaError", "DTYPES", "register_schemas", "known_schema"]

#: The dtype vocabulary of a `Column`, with what each accepts.
DTYPES: dict[str, str] = {
    "int": "integer (numpy or nullable), not bool",
    "float": "floating or integer (NaN allowed)",
    "complex": "complex, floating or integer",
    "bool": "bool (numpy or nullable)",
    "str": "text (str, object holding str, or categorical of str)",
    "category": "text from a fixed set of values (`Column.categories`, when given)",
}

_MISSING_OK = ("float", "complex")  # NaN is a value of these; other dtypes need nullable=True


class SchemaError(SpectralHooksError, ValueError):
    """A table does not match its section's schema.

    ``section`` names the section; ``problems`` lists ``(column, problem)`` pairs (``column`` is
    None for a problem of the whole table); ``column`` is the first problem's column.
    """

    section: str
    problems: list[tuple[str | None, str]]
    column: str | None

    def __init__(self, section: str, problems: list[tuple[str | None, str]]) -> None:
        self.section = section
        self.problems = list(problems)
        self.column = self.problems[0][0] if self.problems else None
        text = "; ".join(f"column {c!r}: {p}" if c is not None else p for c, p in self.problems)
        super().__init__(f"section {section!r}: {text}")


@dataclass(frozen=True)
class Column:
    """One declared column of a report section.

    >>> Column("gap_ratio", "float", "|lambda_2| / |lambda_1|", "power").matches("gap_ratio")
    True
    >>> Column("*_pvalue", "float", "p-values", "trends").matches("rho_pvalue")
    True

    ``optional``: the column may be absent from a table. ``nullable``: an int, bool, str or
    category column may hold missing values (float and complex columns may always hold NaN).
    ``categories``: for dtype ``"category"``, the values allowed (None: any text).
    """

    name: str
    dtype: str
    meaning: str
    anchor: str
    optional: bool = False
    nullable: bool = False
    categories: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Column name must be a non-empty str, got {self.name!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"column {self.name!r}: dtype={self.dtype!r} is not one of {sorted(DTYPES)}")
        if not self.meaning.strip() or not self.anchor.strip():
            raise ValueError(f"column {self.name!r}: meaning and anchor must be non-empty")
        if self.categories is not None:
            if self.dtype != "category":
                raise ValueError(f"column {self.name!r}: categories= needs dtype='category', "
                                 f"got {self.dtype!r}")
            object.__setattr__(self, "categories", tuple(self.categories))

    @property
    def is_pattern(self) -> bool:
        """Whether the name declares a family of columns (it holds ``*``)."""
        return "*" in self.name

    def matches(self, column: str) -> bool:
        """Whether ``column`` is this column (or one of its family)."""
        return fnmatch.fnmatchcase(column, self.name) if self.is_pattern else column == self.name

    def problem(self, values: pd.Series) -> str | None:
        """What is wrong with ``values`` as this column (None: nothing)."""
        missing = values.isna()
        if self.dtype not in _MISSING_OK and not self.nullable and bool(missing.any()):
            return f"{int(missing.sum())} missing value(s) in a non-nullable {self.dtype} column"
        present = cast(pd.Series, values[~missing])
        problem = _dtype_problem(values, self.dtype, present)
        if problem is None and self.categories is not None:
            extra = sorted({str(v) for v in present.unique()} - set(self.categories))
            if extra:
                problem = f"unexpected value(s) {extra} (allowed: {list(self.categories)})"
        return problem


@dataclass(frozen=True)
class SectionSchema:
    """The declared columns of one report section and the columns that identify a row.

    >>> s = SectionSchema("demo", (Column("layer", "int", "layer index", "demo"),), ("layer",))
    >>> s.column("layer").dtype, s.column("nope")
    ('int', None)
    """

    name: str
    columns: tuple[Column, ...]
    key_columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", tuple(self.columns))
        object.__setattr__(self, "key_columns", tuple(self.key_columns))
        names = [c.name for c in self.columns]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"section {self.name!r}: columns declared twice: {repeated}")
        undeclared = [k for k in self.key_columns if k not in names]
        if undeclared:
            raise ValueError(f"section {self.name!r}: key columns {undeclared} are not declared")

    def column(self, name: str) -> Column | None:
        """The declaration of column ``name`` (an exact name first, then a family), or None."""
        exact = [c for c in self.columns if not c.is_pattern and c.name == name]
        found = exact or [c for c in self.columns if c.is_pattern and c.matches(name)]
        return found[0] if found else None

    @property
    def required(self) -> tuple[str, ...]:
        """Names of the columns every table of this section has."""
        return tuple(c.name for c in self.columns if not (c.optional or c.is_pattern))

    def problems(self, df: pd.DataFrame) -> list[tuple[str | None, str]]:
        """Every ``(column, problem)`` of ``df`` against this schema (empty: it validates)."""
        if not isinstance(df, pd.DataFrame):
            return [(None, f"expected a pandas DataFrame, got {type(df).__name__}")]
        found: list[tuple[str | None, str]] = []
        for name in df.columns:
            declared = self.column(str(name)) if isinstance(name, str) else None
            if declared is None:
                found.append((str(name), "not declared in the schema"))
                continue
            problem = declared.problem(df[name])
            if problem is not None:
                found.append((name, problem))
        found += [(name, "missing") for name in self.required if name not in df.columns]
        return found

    def validate(self, df: pd.DataFrame) -> None:
        """Raise `SchemaError` naming the section, each bad column and its problem."""
        problems = self.problems(df)
        if problems:
            raise SchemaError(self.name, problems)

    def doc(self) -> pd.DataFrame:
        """One row per declared column: name, dtype, meaning, anchor, optional, nullable."""
        return pd.DataFrame(
            [(c.name, c.dtype, c.meaning, c.anchor, c.optional or c.is_pattern, c.nullable)
             for c in self.columns],
            columns=["name", "dtype", "meaning", "anchor", "optional", "nullable"],
        )


# ---------------------------------------------------------------------- dtype checks
def _is_int_value(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_real_value(v: object) -> bool:
    return _is_int_value(v) or isinstance(v, (float, np.floating))


def _is_complex_value(v: object) -> bool:
    return _is_real_value(v) or isinstance(v, (complex, np.complexfloating))


_VALUE_CHECKS = {
    "int": _is_int_value,
    "float": _is_real_value,
    "complex": _is_complex_value,
    "bool": lambda v: isinstance(v, (bool, np.bool_)),
    "str": lambda v: isinstance(v, str),
    "category": lambda v: isinstance(v, str),
}


def _dtype_accepts(dtype: object, declared: str) -> bool:
    is_int = pdt.is_integer_dtype(dtype) and not pdt.is_bool_dtype(dtype)
    if declared == "int":
        return is_int
    if declared == "float":
        return is_int or pdt.is_float_dtype(dtype)
    if declared == "complex":
        return is_int or pdt.is_float_dtype(dtype) or pdt.is_complex_dtype(dtype)
    if declared == "bool":
        return pdt.is_bool_dtype(dtype)
    return isinstance(dtype, pd.StringDtype)  # str, category


def _dtype_problem(values: pd.Series, declared: str, present: pd.Series) -> str | None:
    dtype = values.dtype
    if _dtype_accepts(dtype, declared):
        return None
    check = _VALUE_CHECKS[declared]
    if isinstance(dtype, pd.CategoricalDtype):
        if declared in ("str", "category") and all(check(v) for v in dtype.categories):
            return None
        return f"categorical dtype with non-text categories is not {declared}"
    if pd.api.types.is_object_dtype(dtype):
        bad = [v for v in present.tolist() if not check(v)]
        if not bad:
            return None
        return f"object column holds {type(bad[0]).__name__} value {bad[0]!r}, not {declared}"
    return f"dtype {dtype} is not {declared}"


# ---------------------------------------------------------------------- registry
_KNOWN: dict[str, SectionSchema] = {}


def register_schemas(schemas: Iterable[SectionSchema]) -> None:
    """Make ``schemas`` the default description of their sections (``analysis.columns`` calls
    this), so that a report without its own schemas -- one read back by `Report.load` -- still
    explains its columns in HTML."""
    for schema in schemas:
        if not isinstance(schema, SectionSchema):
            raise TypeError(f"expected SectionSchema, got {type(schema).__name__}")
        _KNOWN[schema.name] = schema


def known_schema(name: str) -> SectionSchema | None:
    """The registered schema of section ``name``, or None."""
    return _KNOWN.get(name)
