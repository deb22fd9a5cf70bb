"""The power and Jacobian views of quantized models equal those of their float copies.

For each kind the acceptance names (torchao int8 and intx int4, bitsandbytes nf4 after its CPU
repack, bitsandbytes 8-bit, quanto qint4, HQQ 4-bit), on a tiny Llama: the quantized model's
tables equal those of the float copy whose Linear weights are the dequantized weights (power rows
within rel 1e-6, Jacobian rows within rel 1e-5, dense and matrix-free), both read at the
quantized model's recording (bitsandbytes computes in bfloat16 after its repack, so a float
model's own forward would record other activations); the probe leaves the forward bit-identical.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.analysis import AnalyzeOptions, analyze
from spectral_hooks.analysis.cache import AnalysisCache
from spectral_hooks.analysis.subject import Subject

from .models import IDS, KINDS, float_copy, quantized


def _numeric(table: pd.DataFrame) -> pd.DataFrame:
    return table.select_dtypes(include=[np.number, bool]).astype(float)


def assert_tables_close(got: pd.DataFrame, want: pd.DataFrame, rtol: float, what: str) -> None:
    got, want = _numeric(got), _numeric(want)
    assert list(got.columns) == list(want.columns), what
    assert len(got) == len(want) > 0, what
    a, b = got.to_numpy(), want.to_numpy()
    assert np.array_equal(np.isnan(a), np.isnan(b)), what
    ok = ~np.isnan(a)
    err = np.abs(a[ok] - b[ok]) / np.maximum(np.abs(b[ok]), 1e-12)
    worst = int(np.argmax(err)) if err.size else 0
    assert err.size == 0 or err.max() <= rtol, (
        f"{what}: rel error {err.max():.2e} in column "
        f"{np.array(got.columns)[np.nonzero(ok)[1][worst]]}")


def _float_report(kind_model, recording, **options):
    """The float copy's report on the quantized model's recording (no probe on the copy)."""
    fmodel = float_copy(kind_model)
    subject = Subject(anatomy=sh.anatomy_of(fmodel), recording=recording,
                      cache=AnalysisCache(fmodel, recording))
    return analyze(subject, AnalyzeOptions.resolve(None, **options))


@pytest.mark.parametrize("kind", KINDS)
def test_tables_equal_the_float_copy(kind):
    model = quantized(kind)
    with torch.no_grad():
        plain = model(input_ids=IDS).last_hidden_state
    with sh.instrument(model) as probe, torch.no_grad():
        recorded = model(input_ids=IDS).last_hidden_state
    assert torch.equal(plain, recorded)  # the probe never changes the forward
    for dense in (True, False):
        options = dict(power=True, jacobian={"dense": dense, "k": 8}, progress=False)
        report = probe.analyze(**options)
        oracle = _float_report(model, probe.recording, **options)
        assert_tables_close(report.power, oracle.power, 1e-6, f"{kind} power")
        assert_tables_close(report.jacobian, oracle.jacobian, 1e-5,
                            f"{kind} jacobian dense={dense}")
        assert report.jacobian["dense"].astype(bool).all() == dense
        # the metadata says which function the replay is
        cause = ("quantized.weight_dequantized_surrogate" if kind == "bnb_int8"
                 else "quantized.dequantized_weights")
        assert cause in (report.metadata.fallbacks or [])
        if dense:
            exact = report.jacobian
        else:  # matrix-free = dense where both are exact (the top eigenvalue moduli)
            np.testing.assert_allclose(report.jacobian["top_eig_abs"],
                                       exact["top_eig_abs"], rtol=1e-5)
    with torch.no_grad():
        assert torch.equal(model(input_ids=IDS).last_hidden_state, plain)  # nothing left


def test_how_quantization_moved_the_spectra():
    """``report_quantized.compare(report_float)`` on the same text: per layer, how nf4 moved
    the power view (gap, alignment) and the Jacobian view (rotation, symmetry)."""
    from .models import base_model

    reports = []
    for model in (base_model(), quantized("bnb_nf4")):
        with sh.instrument(model) as probe, torch.no_grad():
            model(input_ids=IDS)
        reports.append(probe.analyze(power=True, jacobian={"k": 4}, progress=False))
    moved = reports[1].compare(reports[0])
    for section in ("power", "jacobian"):
        table = moved.get(section)
        assert sorted(table["layer"].unique()) == [0, 1]
    gap = moved.get("power")["gap_ratio"].abs()
    assert bool((gap > 0).any()) and float(gap.max()) < 0.5  # moved, by a 4-bit grid's amount
    assert np.isfinite(moved.get("jacobian")["sym_energy"]).all()
