"""Reports: tidy tables + metadata, saved as Parquet/CSV + JSON, plotted, rendered as HTML.

    from spectral_hooks.report import Report
    report.power                      # a DataFrame, one row per layer
    report.save("out/"); Report.load("out/")
    after.compare(before)             # after minus before, section by section
    report.to_html("out/report.html") # one self-contained file
    report.columns_doc("power")       # what each column means (when built with schemas=)
"""

from typing import Any

from .compare import KEY_COLUMNS
from .core import SECTION_NAMES, Report
from .integrity import ReportIntegrityError
from .metadata import ReportMetadata
from .schema import Column, SchemaError, SectionSchema
from .storage import SCHEMA_VERSION

__all__ = [
    "Report", "ReportMetadata", "SECTION_NAMES", "KEY_COLUMNS", "SCHEMA_VERSION", "Column",
    "SectionSchema",
    "SchemaError", "ReportIntegrityError", "figures", "render_html", "write_html",
]


def __getattr__(name: str) -> Any:  # matplotlib is imported only when figures are asked for
    if name in ("figures", "figure", "FIGURES"):
        from .lazy_plots import load_plots

        return getattr(load_plots(), name)
    if name in ("render_html", "write_html"):
        from . import html

        return getattr(html, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
