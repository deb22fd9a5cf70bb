"""ReportMetadata: frozen, one version key, and reports saved before it still load.

The oracle for the old layout is the saved manifest itself (tests/golden/saved), read with json.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest

import spectral_hooks
from spectral_hooks.errors import OptionError
from spectral_hooks.report import Report, ReportMetadata
from spectral_hooks.report.metadata import FIELDS

SAVED = Path(__file__).resolve().parents[1] / "golden" / "saved"


@pytest.mark.parametrize("name", ["tiny_gpt2", "tiny_llama_mf", "minilm_dense"])
def test_a_report_saved_before_loads_with_its_metadata_mapped(name):
    stored = json.loads((SAVED / name / "metadata.json").read_text())["metadata"]
    assert stored["versions"]["spectral_hooks"] == stored["spectral_hooks_version"]  # old: two keys

    meta = Report.load(SAVED / name).metadata

    assert isinstance(meta, ReportMetadata)
    assert meta.spectral_hooks_version == stored["versions"]["spectral_hooks"]
    assert meta.versions == {k: v for k, v in stored["versions"].items() if k != "spectral_hooks"}
    for key in ("model", "family", "config_hash", "n_layers", "d_model", "n_heads",
                "n_kv_heads", "causal", "norm_placement", "inputs", "options", "timings_s",
                "fallbacks"):
        assert getattr(meta, key) == stored[key], key
        assert meta[key] == stored[key], key
    assert meta.name_or_path == stored["name_or_path"]
    assert ("name_or_path" in meta) == (stored["name_or_path"] is not None)  # null: unset
    assert meta.extra == {k: v for k, v in stored.items() if k not in FIELDS}


def test_the_version_is_saved_under_one_key(tmp_path):
    stored = json.loads((SAVED / "tiny_gpt2" / "metadata.json").read_text())["metadata"]
    Report.load(SAVED / "tiny_gpt2").save(tmp_path / "again", format="csv")
    resaved = json.loads((tmp_path / "again" / "metadata.json").read_text())["metadata"]
    assert resaved["spectral_hooks_version"] == stored["spectral_hooks_version"]
    assert "spectral_hooks" not in resaved["versions"]
    assert "spectral_hooks_version" not in json.dumps(resaved["versions"])


def test_an_analysis_writes_the_version_once(tiny_gpt2_report):
    meta = tiny_gpt2_report.metadata
    assert meta.spectral_hooks_version == spectral_hooks.__version__
    assert set(meta.versions) == {"torch", "transformers", "python"}
    assert meta.extra == {}  # every key the library writes is a declared field


def test_metadata_is_frozen_and_reads_as_a_mapping():
    report = Report({"t": pd.DataFrame({"x": [1]})}, {"model": "m", "label": "before"})
    meta = report.metadata
    with pytest.raises(dataclasses.FrozenInstanceError):
        meta.model = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        meta["model"] = "other"  # type: ignore[index]
    assert dict(meta) == {"model": "m", "label": "before"}
    assert meta == {"model": "m", "label": "before"} and meta.extra == {"label": "before"}
    changed = meta.replace(model="other", note=1)
    assert changed["model"] == "other" and changed.extra == {"label": "before", "note": 1}
    assert meta["model"] == "m"  # the original is unchanged
    with pytest.raises(KeyError):
        meta["fallbacks"]


def test_extra_cannot_shadow_a_declared_field():
    with pytest.raises(OptionError, match="extra="):
        ReportMetadata(extra={"model": "m"})


@pytest.fixture(scope="module")
def tiny_gpt2_report():
    import torch
    from transformers import GPT2Config, GPT2Model

    model = GPT2Model(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)).eval()
    with spectral_hooks.instrument(model) as probe, torch.no_grad():
        model(torch.tensor([[1, 2, 3, 4]]))
    return probe.analyze()
