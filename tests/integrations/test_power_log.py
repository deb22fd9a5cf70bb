"""The cheap power metrics of a logging event equal the report's (a dense float64 oracle), on the
dense path and on the top-k ``eigs`` path over the thin products W_O (W_V x); Jacobian spectra
join the log every ``jacobian_every`` steps only."""

import math

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import spectral_hooks as sh
from spectral_hooks.errors import UnknownOptionError
from spectral_hooks.integrations import SpectralTracker, flatten_power
from spectral_hooks.integrations.power_log import power_metrics
from spectral_hooks.metrics.power import POWER_COLUMNS, power_table, spectrum
from spectral_hooks.metrics.power_factors import (
    factor_operator,
    factor_spectrum,
    power_row_from_factors,
)

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


def test_factor_operator_is_F():
    W_O, W_V, _, _ = _factors()
    F = torch.einsum("hdk,hkm->dm", W_O, W_V)
    gain = torch.linspace(0.5, 2, 24, dtype=torch.float64)
    assert torch.allclose(factor_operator(W_O, W_V).to_dense(), F)
    assert torch.allclose(factor_operator(W_O, W_V, gain=gain, shift=1.0).to_dense(),
                          torch.eye(24, dtype=torch.float64) + F * gain[None, :])


@pytest.mark.parametrize("iterate", ["F", "I+F"])
@pytest.mark.parametrize("dense_limit", [1024, 0])  # dense eig; top-k eigs on thin products
def test_row_equals_power_table(iterate, dense_limit):
    W_O, W_V, pre, post = _factors(seed=1)
    F = torch.einsum("hdk,hkm->dm", W_O, W_V)
    oracle = power_table(F[None], [pre], [post], iterate=iterate).iloc[0]
    row = power_row_from_factors(W_O, W_V, pre, post, layer=0, iterate=iterate,
                                 dense_limit=dense_limit)
    assert list(row) == list(POWER_COLUMNS)
    assert row["truncated"] is (dense_limit == 0) and row["converged"]
    for column in COLUMNS:
        assert math.isclose(row[column], oracle[column], rel_tol=1e-7, abs_tol=1e-9), column


@pytest.mark.parametrize("iterate", ["F", "I+F"])
@pytest.mark.parametrize("dense_limit", [16, 1024])  # d = 24 above / below it
def test_grouped_query_factors_give_every_eigenvalue_exactly(iterate, dense_limit):
    """8 heads sharing 2 W_V (GQA), d = 24: F is never formed, its full spectrum comes from
    the 6 x 6 matrix W_V W_O (18 exact zeros): the dense oracle's row, untruncated."""
    W_O, W_V, pre, post = _factors(seed=2, h=8, dk=3)
    W_V = W_V[::4].repeat_interleave(4, dim=0)
    gain = torch.linspace(0.5, 2, 24, dtype=torch.float64)
    F = torch.einsum("hdk,hkm->dm", W_O, W_V) * gain[None, :]
    oracle = power_table(F[None], [pre], [post], iterate=iterate).iloc[0]
    row = power_row_from_factors(W_O, W_V, pre, post, layer=0, iterate=iterate, gain=gain,
                                 dense_limit=dense_limit)
    assert row["truncated"] is False and row["n_computed"] == 24 and row["converged"]
    for column in COLUMNS:
        assert math.isclose(row[column], oracle[column], rel_tol=1e-9, abs_tol=1e-11), column
    s = factor_spectrum(W_O, W_V, gain=gain, iterate=iterate, dense_limit=dense_limit)
    assert s.eigenvectors.shape == (24, 24) and int((s.eigenvalues == 0).sum()) == 18
    dense = spectrum(F, iterate=iterate)
    assert not isinstance(dense, list)
    torch.testing.assert_close(s.eigenvalues, dense.eigenvalues, rtol=0, atol=1e-12)


def _tiny(seed=0):
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100,
                                      n_positions=64, bos_token_id=0, eos_token_id=0))


@pytest.mark.parametrize("options", [{}, {"iterate": "I+F", "fold_norm": True},
                                     {"dense_limit": 0, "top_k": 4}])
def test_power_metrics_equal_the_report(options):
    model = _tiny()
    probe = sh.instrument(model)
    with torch.no_grad():
        model(torch.randint(0, 100, (3, 9), generator=torch.Generator().manual_seed(2)))
    report = probe.analyze(power=True, progress=False,
                           **{k: v for k, v in options.items() if k in ("iterate", "fold_norm")})
    oracle = flatten_power(report, columns=COLUMNS)
    got = power_metrics(probe, columns=COLUMNS, **options)
    assert set(got) == set(oracle)
    for name, value in oracle.items():
        assert math.isclose(got[name], value, rel_tol=1e-7, abs_tol=1e-9), name
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
