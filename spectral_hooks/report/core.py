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

Each section may have a `SectionSchema` (``Report(..., schemas=...)``; the library's own are in
``spectral_hooks.analysis.columns``): its table is then validated when first resolved, and
``report.columns_doc(name)`` says what every column means.

Layout: this module holds `Report` (sections, lazy resolution, schemas, display); saving and
loading live in `spectral_hooks.report.storage` (value encodings in
`spectral_hooks.report.encoding`), and `Report.compare` in `spectral_hooks.report.compare`.
Those two work on plain tables and metadata and never import this module.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Union

import pandas as pd

from ..checks import check_type
from ..errors import OptionError, OptionTypeError, UnknownNameError
from .compare import compare_sections
from .metadata import ReportMetadata
from .schema import SectionSchema
from .storage import check_section_name, load_tables, save_tables

__all__ = ["Report", "SECTION_NAMES"]

logger: logging.Logger = logging.getLogger(__name__)

#: Known sections, in the order they are shown.
SECTION_NAMES: tuple[str, ...] = (
    "power",
    "cross_power",
    "spectra",
    "shared_weights",
    "idealised",
    "jacobian",
    "jacobian_summary",
    "trends",
    "bottleneck",
    "propagation",
    "topology",
    "units",
    "communities",
    "reinit_test",
)

SectionSource = Union[pd.DataFrame, Callable[[], pd.DataFrame]]


class _Missing:
    pass


_NOT_YET = _Missing()


class Report:
    """Tidy tables (one per analysis section) plus metadata.

    Parameters
    ----------
    sections:
        Mapping from section name to a DataFrame, or to a zero-argument callable returning a
        DataFrame (or None when the analysis turns out to be unavailable). Callables are
        resolved lazily, once, on first access, under a per-section lock.
    metadata:
        A `ReportMetadata` or a mapping of JSON-able values describing the run (model name,
        config hash, inputs summary, options, library versions, timings, ...): declared keys
        become its fields, any other goes to its ``extra``. ``report.metadata`` is that frozen
        `ReportMetadata` (read it as a mapping: ``report.metadata["options"]``; derive a
        changed one with ``report.metadata.replace(...)``); `save` sets
        ``spectral_hooks_version`` where it is unset.
    schemas:
        Optional mapping from section name to its `SectionSchema`. A section with a schema is
        validated when first resolved (a mismatch raises `SchemaError`); `schema` and
        `columns_doc` describe its columns. Sections without one are not checked.

    Access a section as an attribute (``report.power``) or by name (``report["power"]``).
    Known sections that were not computed read as None through their attribute; ``report[name]``
    raises KeyError for them. ``report.sections`` lists the names present.

        >>> import torch
        >>> from transformers import GPT2Config, GPT2Model
        >>> import spectral_hooks as sh
        >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
        >>> with sh.instrument(model) as probe:
        ...     _ = model(torch.tensor([[1, 2, 3]]))
        >>> report = probe.analyze()
        >>> report.sections, len(report.power), report.jacobian is None
        (['power', 'spectra'], 2, True)
    """

    def __init__(
        self,
        sections: Mapping[str, SectionSource] | None = None,
        metadata: Mapping[str, Any] | ReportMetadata | None = None,
        *,
        schemas: Mapping[str, SectionSchema] | None = None,
    ) -> None:
        sections = {} if sections is None else sections
        check_type("sections", sections, Mapping, "a mapping of name -> DataFrame")
        check_type("metadata", metadata, (Mapping, type(None)), "a mapping of name -> value")
        self._sources: dict[str, SectionSource] = {}
        for name, source in sections.items():
            check_section_name(name)
            if source is None:
                continue
            if not (isinstance(source, pd.DataFrame) or callable(source)):
                raise OptionTypeError(f"sections[{name!r}]", source,
                                      "a pandas DataFrame or a callable returning one")
            self._sources[name] = source
        self._cache: dict[str, Any] = {}
        self._locks: dict[str, threading.Lock] = {name: threading.Lock() for name in self._sources}
        self.metadata: ReportMetadata = ReportMetadata.from_mapping(metadata or {})
        self._schemas = _checked_schemas(schemas)
        self._validated: set[str] = set()

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
            return self._checked(name, source)
        if name in self._cache:
            result = self._cache[name]
            return default if result is None else self._checked(name, result)
        with self._locks[name]:
            if name not in self._cache:  # another thread may have resolved it meanwhile
                value = source()
                if value is not None and not isinstance(value, pd.DataFrame):
                    raise OptionTypeError(f"sections[{name!r}]()", value,
                                          "a callable returning a pandas DataFrame or None")
                self._cache[name] = value
        result = self._cache[name]
        return default if result is None else self._checked(name, result)

    def _checked(self, name: str, df: pd.DataFrame) -> pd.DataFrame:
        """``df`` after validating it once against the section's schema, if it has one."""
        if name not in self._validated and name in self._schemas:
            self._schemas[name].validate(df)
            self._validated.add(name)
        return df

    # ------------------------------------------------------------------ schemas
    @property
    def schemas(self) -> dict[str, SectionSchema]:
        """The section schemas this report was given, by section name (a copy)."""
        return dict(self._schemas)

    def schema(self, name: str) -> SectionSchema:
        """The `SectionSchema` of section ``name``; KeyError when it has none."""
        if name not in self._schemas:
            raise UnknownNameError("name", name, f"a section with a schema, one of "
                                   f"{sorted(self._schemas)}", hint="no schema for it")
        return self._schemas[name]

    def columns_doc(self, name: str) -> pd.DataFrame:
        """What each column of section ``name`` means: name, dtype, meaning, anchor, ...

        >>> from spectral_hooks.report.schema import Column, SectionSchema
        >>> schema = SectionSchema("power", (Column("layer", "int", "block index", "power"),),
        ...                        ("layer",))
        >>> report = Report({"power": pd.DataFrame({"layer": [0]})}, schemas={"power": schema})
        >>> report.columns_doc("power").loc[0, ["name", "meaning"]].tolist()
        ['layer', 'block index']
        """
        return self.schema(name).doc()

    def __getitem__(self, name: str) -> pd.DataFrame:
        value = self.get(name, _NOT_YET)
        if value is _NOT_YET:
            raise UnknownNameError("name", name, f"a section of this report; present: "
                                   f"{self.sections}")
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

    @property
    def power(self) -> pd.DataFrame | None:
        """Power-method view, one row per layer."""
        return self.get("power")

    @property
    def spectra(self) -> pd.DataFrame | None:
        """Eigenvalues in long format."""
        return self.get("spectra")

    @property
    def jacobian(self) -> pd.DataFrame | None:
        """Jacobian view, layer x position."""
        return self.get("jacobian")

    @property
    def jacobian_summary(self) -> pd.DataFrame | None:
        """Jacobian metrics averaged over samples and positions."""
        return self.get("jacobian_summary")

    @property
    def bottleneck(self) -> pd.DataFrame | None:
        """Cumulative ranks, variant x depth."""
        return self.get("bottleneck")

    @property
    def trends(self) -> pd.DataFrame | None:
        """Spearman depth trends per metric."""
        return self.get("trends")

    @property
    def topology(self) -> pd.DataFrame | None:
        """Unit-graph topology, one row per layer."""
        return self.get("topology")

    @property
    def units(self) -> pd.DataFrame | None:
        """Per-unit topology, layer x unit."""
        return self.get("units")

    @property
    def communities(self) -> pd.DataFrame | None:
        """Per-community gain and coupling, layer x community."""
        return self.get("communities")

    @property
    def reinit_test(self) -> pd.DataFrame | None:
        """Trained vs n re-initialisations, metric x layer."""
        return self.get("reinit_test")

    @property
    def propagation(self) -> pd.DataFrame | None:
        """Perturbation propagation."""
        return self.get("propagation")

    @property
    def shared_weights(self) -> pd.DataFrame | None:
        """Shared-weight analysis."""
        return self.get("shared_weights")

    @property
    def idealised(self) -> pd.DataFrame | None:
        """Idealised dynamics vs observed."""
        return self.get("idealised")

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
        return save_tables(self.items(), self.metadata, directory, format=format)

    @classmethod
    def load(cls, directory: str | os.PathLike[str], *, verify: bool = True) -> Report:
        """Read a report written by `save` (no pickle involved).

        >>> import tempfile
        >>> saved = Report({"power": pd.DataFrame({"layer": [0, 1]})}, {"model": "demo"})
        >>> back = Report.load(saved.save(tempfile.mkdtemp(), format="csv"))
        >>> back.sections, back.metadata["model"], back.power.equals(saved.power)
        (['power'], 'demo', True)

        Each file's size and SHA-256 and the manifest's own checksum are verified: a truncated,
        corrupted or edited report raises `ReportIntegrityError` (a ValueError) naming the file.
        ``verify=False`` skips the checksums (a report edited on purpose); row counts and column
        dtypes are still checked against the manifest.
        """
        sections, metadata = load_tables(directory, verify=verify)
        return cls(sections, metadata)

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
            raise OptionTypeError("other", other, "a Report (e.g. Report.load(path))")
        mine = {name: self.get(name) for name in self.sections}
        theirs = {name: other.get(name) for name in other.sections}
        out, info = compare_sections(mine, theirs, mine_metadata=self.metadata,
                                     other_metadata=other.metadata)
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

    def plot(self, name: str) -> Any:
        """One figure by name (see `spectral_hooks.report.plots.FIGURES`)."""
        from .lazy_plots import load_plots

        return load_plots().figure(self, name)

    def figures(self) -> dict[str, Any]:
        """Every figure the present sections allow, by name."""
        from .lazy_plots import load_plots

        return load_plots().figures(self)


def _checked_schemas(schemas: Mapping[str, SectionSchema] | None) -> dict[str, SectionSchema]:
    if schemas is None:
        return {}
    check_type("schemas", schemas, Mapping, "a mapping of section name -> SectionSchema")
    for name, schema in schemas.items():
        check_type(f"schemas[{name!r}]", schema, SectionSchema, "a SectionSchema")
        if schema.name != name:
            raise OptionError(f"schemas[{name!r}]", f"the schema of section {schema.name!r}",
                              f"the schema of section {name!r}")
    return dict(schemas)
