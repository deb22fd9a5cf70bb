"""Sections agree with each other: what one section derives from another uses the same options."""

import numpy as np
import torch

import spectral_hooks as sh
from spectral_hooks.metrics.trends import trends_table
from tests.tiny_models import make_model


def test_power_trends_follow_the_reports_iterate_and_fold_norm():
    model = make_model("llama")
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.randint(0, 100, (2, 6), generator=torch.Generator().manual_seed(0)))
    report = probe.analyze(iterate="I+F", fold_norm=True, jacobian={"k": 3, "dense": True})
    power_rows = report.trends[report.trends.metric == "gap_ratio"]
    expected = trends_table(report.power, ["gap_ratio"])
    np.testing.assert_allclose(power_rows.spearman_rho.to_numpy(), expected.spearman_rho.to_numpy())
    default = probe.analyze(jacobian={"k": 3, "dense": True}).trends
    assert not np.allclose(default[default.metric == "gap_ratio"].spearman_rho, power_rows.spearman_rho)
