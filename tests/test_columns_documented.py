"""Every column of every section is declared, documented in docs/metrics.md, and matches the code.

The golden reports (``tests/golden/saved/``) were saved by the code before the rebuild: each of
their tables must validate against ``spectral_hooks.analysis.columns.SCHEMAS``, which proves the
schemas say what the code produces.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spectral_hooks.analysis.columns import SCHEMAS
from spectral_hooks.report import KEY_COLUMNS, SECTION_NAMES, Report
from spectral_hooks.report.schema import known_schema

ROOT = Path(__file__).resolve().parents[1]
METRICS_MD = ROOT / "docs" / "metrics.md"
GOLDEN = sorted(p for p in (ROOT / "tests" / "golden" / "saved").glob("*") if (p / "metadata.json").is_file())

_ANCHOR = re.compile(r'<a name="([^"]+)"></a>')


def doc_sections() -> dict[str, str]:
    """The text of docs/metrics.md under each anchor, up to the next anchor."""
    text = METRICS_MD.read_text(encoding="utf-8")
    marks = list(_ANCHOR.finditer(text))
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return {m.group(1): text[m.end():end] for m, end in zip(marks, ends)}


def test_every_known_section_has_a_schema():
    assert set(SCHEMAS) == set(SECTION_NAMES)
    assert all(schema.name == name for name, schema in SCHEMAS.items())


@pytest.mark.parametrize("section", sorted(SCHEMAS))
def test_every_column_is_documented_under_its_anchor(section):
    docs = doc_sections()
    undocumented = []
    for column in SCHEMAS[section].columns:
        assert column.anchor in docs, f"{section}.{column.name}: no anchor {column.anchor!r} in {METRICS_MD}"
        if f"`{column.name}`" not in docs[column.anchor]:
            undocumented.append(column.name)
    assert not undocumented, f"{section}: columns not documented under their anchor: {undocumented}"


@pytest.mark.parametrize("section", sorted(SCHEMAS))
def test_key_columns_are_the_ones_compare_matches_on(section):
    schema = SCHEMAS[section]
    declared = [c.name for c in schema.columns if not c.is_pattern]
    assert list(schema.key_columns) == [k for k in KEY_COLUMNS if k in declared]


def test_schemas_are_registered_for_the_html_glossary():
    # a report read back by Report.load has no schemas; its HTML glossary uses these
    assert all(known_schema(name) is schema for name, schema in SCHEMAS.items())


def test_golden_reports_are_present():
    assert len(GOLDEN) >= 2, "tests/golden/saved/ holds no saved reports"


@pytest.mark.parametrize("path", GOLDEN, ids=[p.name for p in GOLDEN])
def test_golden_report_validates(path):
    saved = Report.load(path)
    report = Report({name: saved[name] for name in saved.sections}, saved.metadata, schemas=SCHEMAS)
    for name in report.sections:
        assert name in SCHEMAS, f"{path.name}: section {name!r} has no schema"
        report[name]  # validates on first access; raises SchemaError naming the column
        assert not report.columns_doc(name).empty
