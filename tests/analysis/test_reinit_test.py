"""Section ``reinit_test`` against a direct computation: the same fresh models built here, their
block Jacobians and end-to-end Jacobians by jacfwd (tests/oracles.py), the metrics by numpy /
scipy, the statistics by scipy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

import spectral_hooks as sh
from spectral_hooks.anatomy.base import fresh_model
from spectral_hooks.errors import OptionError
from tests.oracles import (
    chained_token_jacobian,
    commutator,
    henrici_departure,
    sym_energy,
    token_jacobian,
)
from tests.tiny_models import make_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
N_SEEDS = 4
IDS = torch.randint(1, 100, (1, 6), generator=torch.Generator().manual_seed(0))


def _oracle_values(model) -> dict[tuple[str, int], float]:
    """Per (metric, layer) of one model, from jacfwd Jacobians at the last token."""
    with sh.instrument(model) as probe, torch.no_grad():
        model(IDS)
    out = {}
    for layer in range(probe.anatomy.n_layers):
        J = token_jacobian(probe, layer).numpy()
        D = J - np.eye(J.shape[0])
        out["sym_energy", layer] = sym_energy(D)
        out["commutator", layer] = commutator(D)
        out["departure_rel", layer] = henrici_departure(J) / np.linalg.norm(D)
        s = np.linalg.svd(chained_token_jacobian(probe, 0, layer).numpy(), compute_uv=False)
        p = s / s.sum()
        out["erank_end_to_end", layer] = float(np.exp(-np.sum(p * np.log(p))))
    return out


@pytest.fixture(scope="module")
def bert_case():
    model = make_model("bert")
    with sh.instrument(model) as probe, torch.no_grad():
        model(IDS)
    table = probe.analyze(power=False, jacobian={"dense": True, "init_seed": 3},
                          reinit_seeds=N_SEEDS, progress=False).reinit_test
    trained = _oracle_values(model)
    init = [_oracle_values(fresh_model(model, seed=3 + i)) for i in range(N_SEEDS)]
    return table, trained, init


def test_values_and_statistics_match_a_direct_computation(bert_case):
    table, trained, init = bert_case
    assert len(table) == 4 * 2 and table["dense"].all() and (table["n_init"] == N_SEEDS).all()
    for row in table.itertuples():
        key = (row.metric, row.layer)
        z = np.array([values[key] for values in init])
        assert row.trained == pytest.approx(trained[key], rel=1e-9)
        np.testing.assert_allclose([row.init_mean, row.init_std], [z.mean(), z.std(ddof=1)],
                                   rtol=1e-8)
        assert row.greater_pvalue == (1 + np.sum(z >= row.trained)) / (N_SEEDS + 1)
        assert row.less_pvalue == (1 + np.sum(z <= row.trained)) / (N_SEEDS + 1)
        # single-case t = the pooled two-sample t-test with a group of one
        ref = stats.ttest_ind([trained[key]], z, equal_var=True)
        np.testing.assert_allclose([row.t_stat, row.t_pvalue], [ref.statistic, ref.pvalue],
                                   rtol=1e-6)
    for name in ("greater_pvalue", "less_pvalue", "two_sided_pvalue", "t_pvalue"):
        np.testing.assert_allclose(table[f"{name}_adj"],
                                   stats.false_discovery_control(table[name]), rtol=1e-12)


def test_init_values_differ_across_seeds(bert_case):
    """Each seed is its own model (not one model n times)."""
    table = bert_case[0]
    assert (table["init_std"] > 0).all()


def test_reinit_seeds_option_is_checked():
    for bad in (1, -2, 2.5, True):
        with pytest.raises(OptionError, match="reinit_seeds"):
            sh.AnalyzeOptions(reinit_seeds=bad)
    assert sh.AnalyzeOptions(reinit_seeds=3).jacobian_view


def test_causal_model_erank_uses_the_product():
    """GPT-2: the end-to-end rank is the bottleneck's (the product of per-position blocks)."""
    model = make_model("gpt2")
    with sh.instrument(model) as probe, torch.no_grad():
        model(IDS)
    report = probe.analyze(power=False, bottleneck=True, reinit_seeds=2, progress=False,
                           jacobian={"ablations": ()})
    rows = report.reinit_test.query("metric == 'erank_end_to_end'")
    trained = report.bottleneck.query("variant == 'trained'")
    np.testing.assert_allclose(rows["trained"], trained["erank"], rtol=1e-12)
