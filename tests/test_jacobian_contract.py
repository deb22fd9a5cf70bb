"""The contract of docs/metrics.md: every numeric metric column of the matrix-free jacobian table
exists in the exact (dense) table with the same meaning and agrees with it - to 1e-6 relative,
or within 4 standard errors where ``<name>_se`` exists (the error under 5% of the value) - and
the matrix-free top-k eigenvalues are the exact top-k (1e-8, conjugate-invariant, with
multiplicity). On every fast tiny family and on the bundled MiniLM-L6 in float64."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import spectral_hooks as sh
from tests.golden.cases import SENTENCES, tiny_batch
from tests.oracles import assert_same_spectrum, top_k_by_modulus
from tests.tiny_models import make_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BOOKKEEPING = {"variant", "layer", "position", "sample", "k", "d", "n_matvecs", "n_eigenvalues", "dense",
               "converged", "token"}
FAMILIES = ("gpt2", "bert", "albert", "gpt_neo", "gpt_neox", "llama", "mistral", "qwen2",
            "gemma2", "gemma3", "olmo2")


def metric_columns(table: pd.DataFrame) -> list[str]:
    return [c for c in table.columns if c not in BOOKKEEPING and not c.endswith("_se")
            and pd.api.types.is_numeric_dtype(table[c]) and not pd.api.types.is_bool_dtype(
                table[c])]


def assert_contract(free: sh.Report, exact: sh.Report) -> list[str]:
    """Column-by-column agreement of two reports of the same recording; returns the columns."""
    mf, ex = free.jacobian, exact.jacobian
    assert (~mf.dense).all() and ex.dense.all() and mf.converged.all()
    assert list(mf.layer) == list(ex.layer) and list(mf.position) == list(ex.position)
    columns = metric_columns(mf)
    assert len(columns) >= 5, columns
    for c in columns:
        assert c in ex.columns, f"{c}: matrix-free only"
        a, b = mf[c].to_numpy(float), ex[c].to_numpy(float)
        if f"{c}_se" in mf.columns:
            se = mf[f"{c}_se"].to_numpy(float)
            assert (se < 0.05 * np.abs(a)).all(), (c, se, a)
            assert (np.abs(a - b) <= 4 * se).all(), (c, a, b, se)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-12, equal_nan=True, err_msg=c)
    for (layer, position), rows in free.spectra.groupby(["layer", "position"]):
        got = (rows.real + 1j * rows.imag).to_numpy()
        e = exact.spectra[(exact.spectra.layer == layer) & (exact.spectra.position == position)]
        want = top_k_by_modulus((e.real + 1j * e.imag).to_numpy(), int(mf.k.iloc[0]))
        assert_same_spectrum(got, want, 1e-8)
    return columns


def both(probe, **jacobian):
    free = probe.analyze(power=False, progress=False, jacobian={**jacobian, "dense": False})
    exact = probe.analyze(power=False, progress=False, jacobian={**jacobian, "dense": True})
    return free, exact


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_family_matrix_free_equals_exact(family):
    model = make_model(family, dtype=torch.float64)
    batch = tiny_batch()
    if family in ("bert", "albert"):
        batch["attention_mask"][1] = torch.tensor([1, 1, 1, 1, 1, 0, 0])
    if family in ("gemma2", "gemma3"):  # float64 Gemma gives NaN rows under left padding (HF)
        batch["attention_mask"][1] = 1
    with sh.instrument(model) as probe, torch.no_grad():
        model(**batch)
    free, exact = both(probe, k=4, n_samples=512)
    columns = assert_contract(free, exact)
    assert {"sym_energy", "commutator", "frac_complex_top4", "top_eig_abs"} <= set(columns)
    assert "departure" not in free.jacobian and "departure" in exact.jacobian
    assert free.metadata["jacobian"]["computation"] == "matrix-free"


@pytest.mark.slow
def test_minilm_matrix_free_equals_exact(minilm):
    model, tokenizer = minilm
    model = model.double()
    try:
        with sh.instrument(model) as probe, torch.no_grad():
            model(**tokenizer(SENTENCES[:1], return_tensors="pt"))
        free, exact = both(probe, k=16, n_samples=256)
        assert len(assert_contract(free, exact)) >= 5
        auto = probe.analyze(power=False, progress=False, jacobian={"k": 16}).jacobian
        assert auto.dense.all()  # d = 384: the automatic choice is exact
    finally:
        model.float()
