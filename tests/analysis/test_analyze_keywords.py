"""``Probe.analyze``'s keywords are typed (an editor shows them) and documented: one per field
of AnalyzeOptions, no more, no fewer (issue 56)."""

from __future__ import annotations

import dataclasses
import inspect

from spectral_hooks import Probe
from spectral_hooks.analysis.keywords import AnalyzeKeywords
from spectral_hooks.analysis.options import AnalyzeOptions

FIELDS = sorted(f.name for f in dataclasses.fields(AnalyzeOptions) if not f.name.startswith("_"))


def test_the_typed_keywords_are_the_fields_of_analyze_options():
    assert sorted(AnalyzeKeywords.__annotations__) == FIELDS
    keywords = inspect.signature(Probe.analyze).parameters["keywords"]
    assert keywords.kind is inspect.Parameter.VAR_KEYWORD
    assert "AnalyzeKeywords" in str(keywords.annotation)


def test_the_docstring_of_analyze_names_every_field():
    doc = inspect.getdoc(Probe.analyze) or ""
    assert [f for f in FIELDS if f"``{f}``" not in doc] == []
