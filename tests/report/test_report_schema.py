"""Column schemas: validation of tables, Report(schemas=), and the report package's structure."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spectral_hooks.errors import SpectralHooksError
from spectral_hooks.report import Column, Report, SchemaError, SectionSchema

REPORT_DIR = Path(__file__).resolve().parents[2] / "spectral_hooks" / "report"

SCHEMA = SectionSchema("demo", (
    Column("layer", "int", "layer index", "demo"),
    Column("variant", "category", "which model", "demo", categories=("trained", "init")),
    Column("gap_ratio", "float", "a ratio", "demo"),
    Column("flag", "bool", "a flag", "demo", nullable=True),
    Column("note", "str", "free text", "demo", optional=True),
    Column("*_pvalue", "float", "p-values", "demo"),
), key_columns=("variant", "layer"))


def good() -> pd.DataFrame:
    return pd.DataFrame({"layer": [0, 1], "variant": ["trained", "init"], "gap_ratio": [0.5, np.nan],
                         "flag": [True, False], "rho_pvalue": [0.01, 0.2]})


def test_a_matching_table_validates_with_or_without_optional_columns():
    SCHEMA.validate(good())
    SCHEMA.validate(good().assign(note=["a", "b"]))
    SCHEMA.validate(good().drop(columns="rho_pvalue"))  # families are optional


def test_accepted_dtype_variants():
    df = good()
    df["layer"] = pd.array([0, 1], dtype="Int64")
    df["gap_ratio"] = [1, 2]  # integers are valid floats
    df["flag"] = pd.Series([True, None], dtype=object)  # nullable bool, object dtype
    df["variant"] = pd.Categorical(["init", "init"])
    SCHEMA.validate(df)
    SCHEMA.validate(good().iloc[:0])


@pytest.mark.parametrize("change, column, words", [
    (lambda df: df.assign(extra=1), "extra", "not declared"),
    (lambda df: df.drop(columns="gap_ratio"), "gap_ratio", "missing"),
    (lambda df: df.assign(layer=[0.5, 1.0]), "layer", "float64 is not int"),
    (lambda df: df.assign(layer=[True, False]), "layer", "is not int"),
    (lambda df: df.assign(variant=["trained", "schur"]), "variant", "'schur'"),
    (lambda df: df.assign(gap_ratio=["a", "b"]), "gap_ratio", "is not float"),
    (lambda df: df.assign(flag=pd.Series([1, 2], dtype=object)), "flag", "int value 1"),
    (lambda df: df.assign(layer=pd.array([0, None], dtype="Int64")), "layer", "missing value"),
    (lambda df: df.assign(x_pvalue=["no", "no"]), "x_pvalue", "is not float"),
])
def test_a_mismatch_names_the_section_the_column_and_the_problem(change, column, words):
    with pytest.raises(SchemaError) as info:
        SCHEMA.validate(change(good()))
    err = info.value
    assert isinstance(err, SpectralHooksError) and isinstance(err, ValueError)
    assert err.section == "demo" and err.column == column
    assert "section 'demo'" in str(err) and f"column {column!r}" in str(err) and words in str(err)


def test_every_problem_is_listed():
    with pytest.raises(SchemaError) as info:
        SCHEMA.validate(good().drop(columns="gap_ratio").assign(extra=1))
    assert [c for c, _ in info.value.problems] == ["extra", "gap_ratio"]


@pytest.mark.parametrize("kwargs, words", [
    (dict(name="x", dtype="double", meaning="m", anchor="a"), "dtype='double'"),
    (dict(name="x", dtype="str", meaning="m", anchor="a", categories=("a",)), "categories="),
    (dict(name="x", dtype="int", meaning="", anchor="a"), "meaning"),
])
def test_bad_column_declarations(kwargs, words):
    with pytest.raises(ValueError, match=words):
        Column(**kwargs)


def test_bad_section_declarations():
    col = Column("layer", "int", "m", "a")
    with pytest.raises(ValueError, match="twice"):
        SectionSchema("s", (col, col))
    with pytest.raises(ValueError, match="not declared"):
        SectionSchema("s", (col,), key_columns=("depth",))


def test_exact_names_win_over_families():
    s = SectionSchema("s", (Column("*_x", "float", "m", "a"), Column("a_x", "int", "n", "a")))
    assert s.column("a_x").dtype == "int" and s.column("b_x").dtype == "float"


def test_report_validates_a_lazy_section_on_first_access_only():
    calls = []

    def compute():
        calls.append(1)
        return good().assign(layer=[0.5, 1.5])

    report = Report({"demo": compute}, {}, schemas={"demo": SCHEMA})
    assert calls == []  # giving a schema computes nothing
    with pytest.raises(SchemaError, match="column 'layer'"):
        report["demo"]
    with pytest.raises(SchemaError):  # still invalid, not recomputed
        report.get("demo")
    assert calls == [1]


def test_report_validates_dataframe_sections_and_documents_columns():
    report = Report({"demo": good()}, {"model": "m"}, schemas={"demo": SCHEMA})
    assert report["demo"] is not None
    doc = report.columns_doc("demo")
    assert list(doc.columns[:4]) == ["name", "dtype", "meaning", "anchor"]
    assert doc.set_index("name").loc["gap_ratio", "meaning"] == "a ratio"
    assert report.schema("demo") is SCHEMA
    with pytest.raises(KeyError, match="no schema"):
        report.schema("power")
    bad = Report({"demo": good().assign(extra=1)}, schemas={"demo": SCHEMA})
    with pytest.raises(SchemaError, match="extra"):
        bad.to_html(figures=False)


def test_report_without_schemas_is_unchanged(tmp_path):
    report = Report({"demo": good().assign(extra=1)}, {"model": "m"})
    report.save(tmp_path / "r")
    back = Report.load(tmp_path / "r")
    pd.testing.assert_frame_equal(back["demo"], report["demo"])
    assert back.schemas == {}


def test_schemas_argument_is_checked():
    with pytest.raises(TypeError, match="SectionSchema"):
        Report({}, {}, schemas={"demo": "nope"})
    with pytest.raises(ValueError, match="schema of section 'demo'"):
        Report({}, {}, schemas={"power": SCHEMA})


def test_html_uses_the_schema_meanings():
    report = Report({"demo": good()}, {}, schemas={"demo": SCHEMA})
    assert "a ratio" in report.to_html(figures=False)


# ---------------------------------------------------------------------- structure
def _imports(path: Path) -> list[str]:
    """Every module a file imports, with relative imports spelled with their dots."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            names.append(base)
            names += [f"{base}.{a.name}" if node.module else base + a.name for a in node.names]
    return names


@pytest.mark.parametrize("module", ["storage.py", "compare.py", "encoding.py", "schema.py"])
def test_storage_and_compare_never_import_core(module):
    imported = _imports(REPORT_DIR / module)
    assert not [n for n in imported if n in (".core", "spectral_hooks.report.core") or n.startswith(".core.")]
    leaves = (".._version", "..errors", "..checks")  # leaf modules of the package
    assert not [n for n in imported if n.startswith("..") and not n.startswith(leaves)]


@pytest.mark.parametrize("module", sorted(p.name for p in REPORT_DIR.glob("*.py")))
def test_report_never_imports_the_package_face(module):
    imported = _imports(REPORT_DIR / module)
    assert "spectral_hooks" not in imported and ".." not in imported
    assert not [n for n in imported if n.startswith(("spectral_hooks.", "..")) and not
                n.startswith(("..errors", "..checks", ".._version", "spectral_hooks.report"))]


def test_report_files_are_small():
    sizes = {p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in REPORT_DIR.glob("*.py")}
    assert max(sizes.values()) <= 400, sizes


def test_html_without_figures_never_imports_matplotlib():
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "import pandas as pd\n"
        "from spectral_hooks.report import Report\n"
        "r = Report({'power': pd.DataFrame({'layer': [0], 'gap_ratio': [0.5]})}, {'model': 'm'})\n"
        "html = r.to_html(figures=False)\n"
        "assert 'gap_ratio' in html\n"
        "assert r.compare(r).power['gap_ratio'].tolist() == [0.0]\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
