"""HTML report: self-contained, escaped, linked to the metric reference."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spectral_hooks.report import Report
from spectral_hooks.report.html import COLUMN_DOCS, SECTION_INFO, render_html, write_html
from spectral_hooks.report.plots import FIGURES

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
EVIL = '<script>alert("x")</script>&'


@pytest.fixture(scope="module")
def page(rendered_page) -> str:
    return rendered_page


def test_self_contained(page):
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page.lower()
    assert "<link" not in page.lower()
    assert "@import" not in page and "url(" not in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    srcs = re.findall(r'<img[^>]*\ssrc="([^"]*)"', page)
    assert len(srcs) == len(FIGURES)
    assert all(s.startswith("data:image/png;base64,") for s in srcs)


def test_strings_escaped(page):
    assert EVIL not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;" in page


def test_sections_explained_and_linked(page):
    for name in ("power", "spectra", "jacobian", "trends", "bottleneck", "topology", "units"):
        assert f'id="section-{name}"' in page
        assert f'href="docs/metrics.md#{name}"' in page
    assert "Column definitions" in page and COLUMN_DOCS["gap_ratio"].split(" (")[0] in page
    assert "Showing the first" in page  # the long spectra table is cut


def test_docs_cover_every_section_and_column():
    text = DOCS.read_text(encoding="utf-8")
    for name in SECTION_INFO:
        assert f'<a name="{name}"></a>' in text, name
    for col in COLUMN_DOCS:
        assert f"`{col}`" in text, col


def test_write_html_and_missing_sections(tmp_path, make_sections):
    rep = Report({"bottleneck": make_sections()["bottleneck"]}, {"model": "m"})
    text = write_html(rep, tmp_path)  # a directory gets report.html
    out = tmp_path / "report.html"
    assert out.read_text(encoding="utf-8") == text
    assert text.count("<img") == 1 and 'id="section-power"' not in text
    # the link to the metric reference is relative to where the file was written
    href = re.search(r'href="([^"#]*metrics\.md)#bottleneck"', text).group(1)
    assert (out.parent / href).resolve() == DOCS.resolve()
    no_figs = rep.to_html(figures=False)
    assert "<img" not in no_figs and "participation_ratio" in no_figs
    assert "<img" not in render_html(Report({}, {}))
    with pytest.raises(OSError, match="cannot write"):
        blocker = tmp_path / "file"
        blocker.write_text("x")
        write_html(rep, blocker / "report.html")


def test_compare_report_renders(make_report):
    diff = make_report().compare(make_report(seed=4))
    text = diff.to_html(figures=False)
    assert "differences" in text and "self - other" in text
