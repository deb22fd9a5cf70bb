"""store="stats" and all-padding inputs: a clear error or a documented NaN-with-reason, never
silent all-NaN columns (issue 16, "silently wrong" cases 4 and 5).

The other cases of the issue's list are tested beside the code they fix:
  truncated CSV -> NaN row, manifest claiming 999 rows, a column changing dtype, a manifest with a
  missing key (was a KeyError): tests/reliability/test_report_files.py;
  --max-length 0/1, a corrupt safetensors file, compare --out into an unwritable directory,
  --k 0 and an unsupported architecture exiting 1: tests/reliability/test_cli_failures.py;
  steer(gap=2), alpha=-5, nested steer removed out of order: tests/reliability/test_steering_stack.py.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.analysis import TOKEN_COLUMNS, TokenColumnsWarning
from spectral_hooks.errors import RecordingError
from spectral_hooks.hooks.taps import count_hook_points as count_hooks
from tests.tiny_models import make_model


def _ids(batch=2, n=6, seed=0):
    return torch.randint(0, 100, (batch, n), generator=torch.Generator().manual_seed(seed))


def test_stats_recording_power_columns_are_nan_with_a_reason():
    model = make_model("gpt2", dtype=torch.float32)
    with sh.instrument(model, store="stats") as probe, torch.no_grad():
        model(_ids())
    with pytest.warns(TokenColumnsWarning, match="store='stats'"):
        report = probe.analyze(power=True)
    power = report.power
    reason = report.metadata["nan_reasons"]["power"]
    assert reason["columns"] == list(TOKEN_COLUMNS) and "store='device'" in reason["reason"]
    for column in TOKEN_COLUMNS:
        assert power[column].isna().all(), column  # exactly the documented ones are NaN
    weight_columns = ["abs_lambda1", "gap_ratio", "lambda1_real"]
    assert power[weight_columns].notna().all().all()
    # a full recording has no reason and finite token columns
    with sh.instrument(model) as probe, torch.no_grad():
        model(_ids())
    with warnings.catch_warnings():
        warnings.simplefilter("error", TokenColumnsWarning)
        full = probe.analyze(power=True)
    assert "nan_reasons" not in full.metadata
    assert full.power[["gamma", "erank"]].notna().all().all()
    torch.testing.assert_close(torch.tensor(full.power["abs_lambda1"].to_numpy()),
                               torch.tensor(power["abs_lambda1"].to_numpy()))


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_all_padding_input_is_a_clear_error(family):
    model = make_model(family, dtype=torch.float32)
    ids = _ids()
    with sh.instrument(model) as probe, torch.no_grad():
        model(input_ids=ids, attention_mask=torch.zeros_like(ids))
    for options in ({"power": True}, {"jacobian": {"k": 2}}):
        with pytest.raises(RecordingError, match="every recorded position is padding"):
            probe.analyze(**options)


def test_one_all_padding_sample_refused_for_the_jacobian_view_only():
    model = make_model("bert", dtype=torch.float32)
    ids = _ids(batch=3)
    mask = torch.ones_like(ids)
    mask[1] = 0
    with sh.instrument(model) as probe, torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    with pytest.raises(RecordingError, match=r"sample\(s\) \[1\] are all padding"):
        probe.analyze(power=False, jacobian={"k": 2})
    assert probe.analyze(power=True).power["gamma"].notna().all()  # the other rows count


def test_analyze_before_recording_is_a_clear_error():
    model = make_model("gpt2", dtype=torch.float32)
    with sh.instrument(model) as probe:
        with pytest.raises(RecordingError, match="nothing recorded yet"):
            probe.analyze(power=True)


@pytest.mark.parametrize("kwargs,option", [
    ({"dtype": torch.int64}, "dtype=torch.int64"), ({"dtype": "float32"}, "dtype='float32'"),
    ({"store": "disk"}, "store='disk'"), ({"capture": ["bogus"]}, "capture="),
    ({"layers": []}, "layers=[]"),
])
def test_instrument_arguments_are_checked(kwargs, option):
    model = make_model("gpt2", dtype=torch.float32)
    with pytest.raises(ValueError) as info:
        sh.instrument(model, **kwargs)
    assert str(info.value).startswith(option) and "expected" in str(info.value)
    assert count_hooks(model) == 0
