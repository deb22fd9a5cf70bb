"""The bottleneck section above its dense cut-off (forced on a tiny model with
``bottleneck_dense=False``): the top-k columns are truncated quantities, and ``erank_est`` /
``surviving_est`` agree with the full-spectrum values of the float64 oracle (products of
jacfwd block Jacobians; end-to-end jacfwd for the bidirectional model) within a few standard
errors. Tiny models (d = 32, 2 layers): a few seconds."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.errors import ConvergenceWarning, OptionError
from spectral_hooks.linalg import effective_rank, surviving
from spectral_hooks.linearize.end_to_end import end_to_end_jacobians
from tests.oracles import last_real_position, token_jacobian
from tests.tiny_models import make_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
K, PROBES = 4, 8


def _exact_spectra(probe, family: str) -> list[torch.Tensor]:
    if family == "bert":  # bidirectional: P_l through the whole stack, not the product
        P = end_to_end_jacobians(probe.anatomy, probe.recording)
        return [torch.linalg.svdvals(p.to(torch.float64)) for p in P]
    pos = last_real_position(probe, 0)
    P, out = None, []
    for layer in range(probe.anatomy.n_layers):
        J = token_jacobian(probe, layer, position=pos, sample=0).to(torch.float64)
        P = J if P is None else J @ P
        out.append(torch.linalg.svdvals(P))
    return out


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_matrix_free_bottleneck_estimates_cover_the_dense_oracle(family):
    model = make_model(family)
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.randint(1, 100, (1, 6), generator=torch.Generator().manual_seed(0)))
    d = probe.anatomy.d_model
    options = {"k": 4, "bottleneck_k": K, "bottleneck_dense": False, "bottleneck_probes": PROBES,
               "bottleneck_steps": d, "ablations": ()}
    table = probe.analyze(power=False, jacobian=options, bottleneck=True).bottleneck
    exact = _exact_spectra(probe, family)
    assert len(table) == len(exact) and table["truncated"].all()
    for row, s in zip(table.itertuples(), exact):
        erank, surv = float(effective_rank(s)), int(surviving(s, 1e-2))
        assert row.surviving == min(surv, K)
        assert abs(row.erank_est - erank) <= 4 * row.erank_est_se, (row.erank_est, erank)
        assert abs(row.surviving_est - surv) <= 4 * row.surviving_est_se + 1e-9
    assert (table.erank_est > table.erank + 1).any()  # beyond what the top-4 can show
    dense = probe.analyze(power=False, bottleneck=True,
                          jacobian={**options, "bottleneck_dense": True}).bottleneck
    assert "erank_est" not in dense.columns
    np.testing.assert_allclose(dense.erank, [float(effective_rank(s)) for s in exact], rtol=1e-6)


def test_bottleneck_probes_options():
    assert sh.JacobianOptions(bottleneck_probes=0).bottleneck_probes == 0
    for bad in ({"bottleneck_probes": 1}, {"bottleneck_probes": -1}, {"bottleneck_steps": 0}):
        with pytest.raises(OptionError):
            sh.JacobianOptions(**bad)


def test_a_coarse_quadrature_is_warned_about():
    """Few Lanczos steps: the erank bracket is wider than the Monte Carlo error, and the
    analysis says so (ConvergenceWarning naming the rows and bottleneck_steps); with steps = d
    the quadrature is exact and nothing is said."""
    model = make_model("gpt2")
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.randint(1, 100, (1, 6), generator=torch.Generator().manual_seed(0)))
    d = probe.anatomy.d_model
    options = {"k": 4, "bottleneck_k": K, "bottleneck_dense": False, "bottleneck_probes": 32,
               "ablations": ()}
    with pytest.warns(ConvergenceWarning, match="bottleneck_steps \\(now 2\\)"):
        coarse = probe.analyze(power=False, bottleneck=True,
                               jacobian={**options, "bottleneck_steps": 2}).bottleneck
    half = (coarse.erank_est_hi - coarse.erank_est_lo) / 2
    assert (half > 2 * coarse.erank_est_se).any()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        exact = probe.analyze(power=False, bottleneck=True,
                              jacobian={**options, "bottleneck_steps": d}).bottleneck
    assert (exact.erank_est_hi == exact.erank_est_lo).all()


def test_bottleneck_depths_option():
    """``bottleneck_depths`` keeps the full table's rows at those depths (matrix-free, every
    variant), refuses depths beyond the recorded stack, and is stored as a list."""
    model = make_model("gpt2")
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.randint(1, 100, (1, 6), generator=torch.Generator().manual_seed(0)))
    options = {"k": 4, "bottleneck_k": K, "bottleneck_dense": False, "bottleneck_probes": 4,
               "bottleneck_steps": 8, "ablations": ("symmetric",)}
    full = probe.analyze(power=False, bottleneck=True, jacobian=options).bottleneck
    some = probe.analyze(power=False, bottleneck=True,
                         jacobian={**options, "bottleneck_depths": [2]}).bottleneck
    every_layer = some[some.ablated_layer == -1]
    assert every_layer["depth"].tolist() == [2, 2]  # trained and symmetric, depth 2 only
    keys = ["variant", "ablated_layer", "depth"]
    merged = full.merge(some, on=keys, suffixes=("", "_some"))
    assert len(merged) == len(some)
    np.testing.assert_allclose(merged["erank_est_some"], merged["erank_est"], rtol=1e-10)
    np.testing.assert_allclose(merged["sigma_max_some"], merged["sigma_max"], rtol=1e-8)
    with pytest.raises(OptionError, match="bottleneck_depths"):
        probe.analyze(power=False, bottleneck=True,
                      jacobian={**options, "bottleneck_depths": [3]}).bottleneck
    assert sh.JacobianOptions(bottleneck_depths=[2, 1]).to_dict()["bottleneck_depths"] == [1, 2]
    assert sh.JacobianOptions(bottleneck_depths="log2").bottleneck_depths == "log2"
    for bad in ("all", [0], [], 1.5):
        with pytest.raises(OptionError):
            sh.JacobianOptions(bottleneck_depths=bad)
