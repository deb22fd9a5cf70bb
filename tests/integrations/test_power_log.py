"""The power metrics of a logging event are the report's, row for row: one pipeline (one reader
of a layer's factors, one routing rule, one row builder) for ``probe.analyze(power=...)`` and
the training logger, checked identical (same values, columns and converged / truncated /
n_computed) on MHA and GQA models, near MATRIX_FREE_D where the two once took different
paths, and against a dense float64 oracle on the factored and top-k paths; Jacobian
spectra join the log every ``jacobian_every`` steps only."""

import math

import pandas as pd
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model, LlamaConfig, LlamaModel

import spectral_hooks as sh
from spectral_hooks.analysis.power import layer_power_spectrum
from spectral_hooks.anatomy.weights import LayerFactors
from spectral_hooks.errors import UnknownOptionError
from spectral_hooks.integrations import SpectralTracker, flatten_power
from spectral_hooks.integrations.power_log import power_metrics, power_rows
from spectral_hooks.metrics.power import power_columns, power_row, power_table
from spectral_hooks.metrics.spectrum import MATRIX_FREE_D, spectrum

COLUMNS = ("abs_lambda1", "abs_lambda2", "gap_ratio", "gamma_in", "gamma", "lift", "gamma2",
           "rho", "mean_cos", "collapse_residual", "erank")


def _factors(seed=0, h=4, d=24, dk=6):
    g = torch.Generator().manual_seed(seed)
    W_O = torch.randn(h, d, dk, generator=g, dtype=torch.float64)
    W_V = torch.randn(h, dk, d, generator=g, dtype=torch.float64)
    W_O[0, :, 0] += 3 * torch.randn(d, generator=g, dtype=torch.float64)  # an outlier pair
    W_V[0, 0] += 3 * torch.randn(d, generator=g, dtype=torch.float64)
    pre = torch.randn(40, d, generator=g, dtype=torch.float64)
    post = pre + 0.5 * torch.randn(40, d, generator=g, dtype=torch.float64)
    return W_O, W_V, pre, post


@pytest.mark.parametrize("iterate", ["F", "I+F"])
@pytest.mark.parametrize("full", [None, False])  # dense eig (d < MATRIX_FREE_D); top-k eigs
def test_layer_row_equals_the_dense_oracle(iterate, full):
    W_O, W_V, pre, post = _factors(seed=1)
    F = torch.einsum("hdk,hkm->dm", W_O, W_V)
    oracle = power_table(F[None], [pre], [post], iterate=iterate).iloc[0]
    s = layer_power_spectrum(LayerFactors(0, W_O, W_V, None), iterate=iterate, full=full, k=8)
    row = power_row(s, pre, post, layer=0)
    assert list(row) == list(power_columns())
    assert row["truncated"] is (full is False) and row["converged"]
    for column in COLUMNS:
        assert math.isclose(row[column], oracle[column], rel_tol=1e-7, abs_tol=1e-9), column


@pytest.mark.parametrize("iterate", ["F", "I+F"])
@pytest.mark.parametrize("full", [None, True])
def test_grouped_query_factors_give_every_eigenvalue_exactly(iterate, full):
    """8 heads sharing 2 W_V (GQA), d = 24: by default F is never formed, its full spectrum
    comes from the 6 x 6 matrix W_V W_O (18 exact zeros): the dense oracle's row, untruncated."""
    W_O, W_V, pre, post = _factors(seed=2, h=8, dk=3)
    W_V = W_V[::4].repeat_interleave(4, dim=0)
    gain = torch.linspace(0.5, 2, 24, dtype=torch.float64)
    F = torch.einsum("hdk,hkm->dm", W_O, W_V) * gain[None, :]
    oracle = power_table(F[None], [pre], [post], iterate=iterate).iloc[0]
    s = layer_power_spectrum(LayerFactors(0, W_O, W_V, gain), iterate=iterate, full=full)
    row = power_row(s, pre, post, layer=0)
    assert row["truncated"] is False and row["n_computed"] == 24 and row["converged"]
    for column in COLUMNS:
        assert math.isclose(row[column], oracle[column], rel_tol=1e-9, abs_tol=1e-11), column
    assert int((s.eigenvalues == 0).sum()) == (18 if full is None else 0)
    dense = spectrum(F, iterate=iterate)
    assert not isinstance(dense, list)
    torch.testing.assert_close(s.eigenvalues, dense.eigenvalues, rtol=0,
                               atol=1e-12 if full is None else 0)


def _gpt2(d=32, layers=2, heads=4):
    torch.manual_seed(0)
    return GPT2Model(GPT2Config(n_layer=layers, n_embd=d, n_head=heads, vocab_size=64,
                                n_positions=32, bos_token_id=0, eos_token_id=0))


def _llama(d=48, layers=2, heads=4, kv=2):
    torch.manual_seed(0)
    return LlamaModel(LlamaConfig(num_hidden_layers=layers, hidden_size=d, intermediate_size=32,
                                  num_attention_heads=heads, num_key_value_heads=kv,
                                  vocab_size=64, bos_token_id=0, eos_token_id=0))


ROW_CASES = {  # name: (model, expected route of every layer: truncated, n_computed)
    "mha": (lambda: _gpt2(), None),
    "gqa": (lambda: _llama(), None),
    # the logger once took Krylov from d = 1024, analyze() the dense eig up to its own threshold;
    # now both the dense eig just below MATRIX_FREE_D (MHA), the exact factored spectrum (GQA)
    "mha_d1000": (lambda: _gpt2(d=1000, layers=1, heads=8), 1000),
    "gqa_d1536": (lambda: _llama(d=1536, layers=1, heads=12, kv=2), 1536),
}


def _rows_and_table(model, **options):
    probe = sh.instrument(model)
    with torch.no_grad():
        model(torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(2)))
    analysis = {k: v for k, v in options.items() if k in ("iterate", "fold_norm")}
    power = {k: v for k, v in options.items() if k in ("full", "k", "reference_layer")}
    table = probe.analyze(power=power or True, progress=False, **analysis).power
    rows = power_rows(probe, **options)
    probe.remove()
    return rows, table


@pytest.mark.parametrize("case", list(ROW_CASES))
def test_logger_rows_are_the_analysis_rows(case):
    """Same columns, same values (exactly: the same computation), same converged / truncated /
    n_computed, on an MHA and a GQA model, below MATRIX_FREE_D and (GQA) above it."""
    build, d = ROW_CASES[case]
    assert d is None or d < MATRIX_FREE_D or case.startswith("gqa")
    rows, table = _rows_and_table(build())
    assert list(rows.columns) == list(table.columns)
    pd.testing.assert_frame_equal(rows, table, check_exact=True, check_dtype=False,
                                  check_categorical=False)
    assert not table["truncated"].any() and table["converged"].all()
    if d is not None:
        assert (table["n_computed"] == d).all()


@pytest.mark.parametrize("options", [{"iterate": "I+F", "fold_norm": True},
                                     {"full": False, "k": 4}, {"full": True},
                                     {"reference_layer": 0}])
@pytest.mark.parametrize("case", ["mha", "gqa"])
def test_logger_rows_follow_the_analysis_options(case, options):
    rows, table = _rows_and_table(ROW_CASES[case][0](), **options)
    pd.testing.assert_frame_equal(rows, table, check_exact=True, check_dtype=False,
                                  check_categorical=False)
    assert list(table["truncated"]) == [options.get("full") is False] * len(table)


def _tiny(seed=0):
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100,
                                      n_positions=64, bos_token_id=0, eos_token_id=0))


@pytest.mark.parametrize("options", [{}, {"iterate": "I+F", "fold_norm": True},
                                     {"full": False, "k": 4}])
def test_power_metrics_equal_the_report(options):
    model = _tiny()
    probe = sh.instrument(model)
    with torch.no_grad():
        model(torch.randint(0, 100, (3, 9), generator=torch.Generator().manual_seed(2)))
    report = probe.analyze(power={k: v for k, v in options.items() if k in ("full", "k")}
                           or True, progress=False,
                           **{k: v for k, v in options.items() if k in ("iterate", "fold_norm")})
    oracle = flatten_power(report, columns=COLUMNS)
    got = power_metrics(probe, columns=COLUMNS, **options)
    assert set(got) == set(oracle)
    for name, value in oracle.items():
        assert got[name] == value, name  # the same computation
    probe.remove()


def test_jacobian_every_and_unknown_options():
    model = _tiny()
    with pytest.raises(UnknownOptionError):
        SpectralTracker(model, analyze_options={"jacobian": True})
    tracker = SpectralTracker(model, every=2, jacobian_every=3,
                              jacobian_options={"k": 4, "dense": True})
    logged = {}
    ids = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(3))
    for step in range(1, 7):
        with torch.no_grad():
            model(ids)
        if step == 6:  # the event replays the blocks in eval mode (no dropout)
            model.eval()
            oracle = tracker.probe.analyze(power=False, jacobian={"k": 4, "dense": True},
                                           progress=False).jacobian
            model.train()
        logged[step] = tracker.step(step)
    tracker.close()
    assert model.training and all(m.training for m in model.modules())
    assert logged[1] is None and logged[5] is None
    jac = "spectral/layer_01/jacobian/top_eig_abs"
    assert "spectral/layer_01/gap_ratio" in logged[2] and jac not in logged[2]
    assert jac in logged[3] and "spectral/layer_01/gap_ratio" not in logged[3]
    assert jac in logged[6] and "spectral/layer_01/gap_ratio" in logged[6]
    assert all(logged[s]["spectral/seconds"] > 0 for s in (2, 3, 4, 6))
    expected = float(oracle.loc[oracle["layer"] == 1, "top_eig_abs"].iloc[0])
    assert math.isclose(logged[6][jac], expected, rel_tol=1e-9)
