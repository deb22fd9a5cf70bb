"""HTML report: self-contained, escaped, Jinja2-rendered; summaries, folded full tables, glossary."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spectral_hooks.analysis.columns import SCHEMAS
from spectral_hooks.report import Report
from spectral_hooks.report.html import SECTION_INFO, render_html, write_html
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
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&amp;" in page  # Jinja2 autoescape


def test_sections_explained_with_summary_and_glossary(page):
    for name in ("power", "spectra", "jacobian", "trends", "bottleneck", "topology", "units"):
        assert f'id="section-{name}"' in page
        assert f"<small>({name})</small></h3>" in page  # its glossary part
    # no link to a source checkout: the page defines its own columns
    assert "metrics.md" not in page and 'href="#glossary"' in page
    assert SCHEMAS["power"].column("gap_ratio").meaning in page  # schemas registered by analysis
    assert page.count("<details class=\"full\">") >= 4  # full tables folded under summaries
    assert "Showing the first" in page  # the long spectra table is cut
    # every column heading links to its glossary entry, and every entry exists
    links = set(re.findall(r'<th [^>]*><a href="#(g-[^"]+)"', page))
    targets = set(re.findall(r'<dt id="(g-[^"]+)"', page))
    assert links and links <= targets
    # p-values in scientific notation
    assert re.search(r'<td class="p"[^>]*>\d\.\de-\d\d</td>', page)


def test_docs_cover_every_section():
    text = DOCS.read_text(encoding="utf-8")
    for name in SECTION_INFO:
        assert f'<a name="{name}"></a>' in text, name


def test_write_html_and_missing_sections(tmp_path, make_sections):
    rep = Report({"bottleneck": make_sections()["bottleneck"]}, {"model": "m"})
    text = write_html(rep, tmp_path)  # a directory gets report.html
    out = tmp_path / "report.html"
    assert out.read_text(encoding="utf-8") == text
    assert text.count("<img") == 1 and 'id="section-power"' not in text
    assert "metrics.md" not in text
    assert 'href="https://example.org/m"' in render_html(rep, docs_href="https://example.org/m")
    no_figs = rep.to_html(figures=False)
    assert "<img" not in no_figs and "participation_<wbr>ratio" in no_figs
    assert "<img" not in render_html(Report({}, {}))
    with pytest.raises(OSError, match="cannot write"):
        blocker = tmp_path / "file"
        blocker.write_text("x")
        write_html(rep, blocker / "report.html")


def test_compare_report_renders(make_report):
    diff = make_report().compare(make_report(seed=4))
    text = diff.to_html(figures=False)
    assert "differences" in text and "self - other" in text
