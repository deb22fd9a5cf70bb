"""Matrix-free bottleneck rows: the top-k ranks are those of the truncation (surviving = min(exact,
k), stable rank and participation ratio below the exact values) and the SLQ estimates of the
full-spectrum erank and surviving (``erank_est``, ``surviving_est``) agree with the dense
float64 values within a few standard errors, with an error that shrinks as probes grow."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from spectral_hooks.linalg import DenseOperator, effective_rank, participation_ratio, stable_rank
from spectral_hooks.linalg import surviving as surviving_count
from spectral_hooks.metrics.bottleneck import (
    RANK_ESTIMATE_COLUMNS,
    bottleneck_table,
    end_to_end_table,
    single_layer_ablation_table,
)


def _chain(d: int, L: int, seed: int) -> list[torch.Tensor]:
    """Blocks near a scaled identity with decaying column scales: the products keep many more
    than k = 8 directions above 1e-2 sigma_1, so the top-k truncation is visible."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.linspace(1.0, 0.3, d, dtype=torch.float64)
    return [(0.5 * torch.eye(d, dtype=torch.float64)
             + torch.randn(d, d, generator=g, dtype=torch.float64) / math.sqrt(d)) * scale
            for _ in range(L)]


def _exact(Js: list[torch.Tensor]) -> list[torch.Tensor]:
    P, out = torch.eye(Js[0].shape[0], dtype=torch.float64), []
    for J in Js:
        P = J @ P
        out.append(torch.linalg.svdvals(P))
    return out


def test_truncated_ranks_are_the_truncation_and_estimates_cover_the_dense_values():
    d, k = 48, 8
    Js = _chain(d, 3, seed=0)
    table = bottleneck_table([DenseOperator(J) for J in Js], k=k, n_probes=48, steps=d, seed=0)
    assert set(RANK_ESTIMATE_COLUMNS) <= set(table.columns) and table["truncated"].all()
    for row, s in zip(table.itertuples(), _exact(Js)):
        erank, surv = float(effective_rank(s)), int(surviving_count(s, 1e-2))
        assert surv > k  # the truncation matters here
        # the existing columns are the truncated quantities, as documented
        assert row.surviving == min(surv, k)
        assert row.stable_rank <= float(stable_rank(s)) + 1e-9
        assert row.participation_ratio <= float(participation_ratio(s)) + 1e-9
        assert row.erank == pytest.approx(float(effective_rank(s[:k])), rel=1e-6)
        # the estimates: the full spectrum, within 4 standard errors (exact quadrature, steps = d)
        assert abs(row.erank_est - erank) <= 4 * row.erank_est_se
        assert abs(row.surviving_est - surv) <= 4 * row.surviving_est_se + 1e-9
        assert 0 < row.erank_est_se < 0.1 * erank


def test_estimate_error_shrinks_with_probes():
    d = 40
    Js = _chain(d, 2, seed=1)
    s = _exact(Js)[-1]
    erank = float(effective_rank(s))

    def errors(n: int) -> tuple[float, float]:
        runs = [bottleneck_table(Js, k=4, n_probes=n, steps=d, seed=seed).iloc[-1]
                for seed in range(5)]
        return (float(np.mean([abs(r.erank_est - erank) for r in runs])),
                float(np.mean([r.erank_est_se for r in runs])))
    (err_few, se_few), (err_many, se_many) = errors(4), errors(64)
    assert err_many < err_few / 2
    assert se_many < se_few / 2  # ~ 1/sqrt(n): 4x fewer at 16x the probes


def test_end_to_end_and_single_layer_tables_carry_the_estimates():
    d = 32
    Js = _chain(d, 2, seed=2)
    s = _exact(Js)
    e2e = end_to_end_table([Js[0], Js[1] @ Js[0]], k=6, n_probes=32, steps=d, seed=3)
    for row, sv in zip(e2e.itertuples(), s):
        assert abs(row.erank_est - float(effective_rank(sv))) <= 4 * row.erank_est_se
    abl = single_layer_ablation_table([DenseOperator(J) for J in Js], variant="symmetric", k=6,
                                      n_probes=32, steps=d, seed=4)
    sym = [0.5 * (J + J.T) for J in Js]
    for row, P in zip(abl.itertuples(), [Js[1] @ sym[0], sym[1] @ Js[0]]):
        assert abs(row.erank_est - float(effective_rank(torch.linalg.svdvals(P)))) \
            <= 4 * row.erank_est_se


def test_dense_rows_and_probes_zero_have_no_estimates():
    Js = _chain(16, 2, seed=5)
    assert not set(RANK_ESTIMATE_COLUMNS) & set(bottleneck_table(Js, dense=True).columns)
    assert not set(RANK_ESTIMATE_COLUMNS) & set(bottleneck_table(Js, k=4, n_probes=0).columns)
    for bad in ({"n_probes": 1}, {"n_probes": -2}, {"steps": 0}, {"n_probes": True}):
        with pytest.raises(ValueError):
            bottleneck_table(Js, k=4, **bad)


def test_minilm_erank_bracket_covers_the_dense_erank_at_the_defaults(minilm):
    """The real pretrained MiniLM-L6 (d = 384): products of its block Jacobians have exact zeros
    (LayerNorm's null direction) and mass near 0, where a Gauss rule of sqrt overestimates. At
    the section's defaults (16 probes, 48 steps) the dense erank of every depth lies in
    [erank_est_lo, erank_est_hi] up to 4 standard errors."""
    import spectral_hooks

    model, tok = minilm
    probe = spectral_hooks.instrument(model)
    try:
        with torch.no_grad():
            model(**tok(["The quick brown fox jumps over the lazy dog near the river bank."],
                        return_tensors="pt"))
        Js = [probe.jacobian(layer).to_dense() for layer in range(6)]
    finally:
        probe.remove()
    table = bottleneck_table([DenseOperator(J) for J in Js], k=32, n_probes=16, steps=48, seed=0)
    for row, s in zip(table.itertuples(), _exact(Js)):
        erank = float(effective_rank(s))
        assert row.erank_est_lo <= row.erank_est <= row.erank_est_hi
        assert row.erank_est_lo - 4 * row.erank_est_se <= erank \
            <= row.erank_est_hi + 4 * row.erank_est_se, (row.depth, erank)


def test_selected_depths_are_the_full_tables_rows_for_less():
    """``depths`` ranks only those depths: the same rows as the full table (seeds are per
    depth), matrix-free for fewer block products (composing the skipped depths is free)."""
    from spectral_hooks.linalg import LinearOperator

    d, L = 24, 4
    Js = _chain(d, L, seed=6)

    def counted():
        return [LinearOperator((d, d), matvec=lambda x, J=J: J @ x, rmatvec=lambda y, J=J: J.T @ y,
                               matmat=lambda X, J=J: J @ X, rmatmat=lambda Y, J=J: J.T @ Y,
                               dtype=torch.float64, device="cpu") for J in Js]
    full_ops, some_ops = counted(), counted()
    full = bottleneck_table(full_ops, k=6, n_probes=4, steps=8, seed=1)
    some = bottleneck_table(some_ops, k=6, n_probes=4, steps=8, seed=1, depths=[4, 2])
    assert some["depth"].tolist() == [2, 4]
    # the same probes per depth; the depths' Lanczos runs go in lockstep (one sweep through
    # the chain a step), so other depths in the run change the rounding only. The Gauss-Radau
    # rule at 0 (erank_est_lo, and erank_est, the midpoint) amplifies it where a Ritz value
    # nears 0 (its bordered system is then near singular): 1e-6 there, far below the se
    radau = ["erank_est", "erank_est_lo", "erank_est_se"]
    columns = [c for c in full.columns if c not in ("n_matvecs", *radau)]
    for depth in (2, 4):
        a = full[full.depth == depth].reset_index(drop=True)
        b = some[some.depth == depth].reset_index(drop=True)
        pd.testing.assert_frame_equal(a[columns], b[columns], check_exact=False, rtol=1e-10)
        pd.testing.assert_frame_equal(a[radau], b[radau], check_exact=False, rtol=1e-6)
        assert float((a.erank_est - b.erank_est).abs().max()) < 1e-3 * float(a.erank_est_se.min())
    assert sum(o.n_matvecs for o in some_ops) < 0.8 * sum(o.n_matvecs for o in full_ops)
    dense = bottleneck_table(Js, dense=True, depths=[3])
    assert dense["depth"].tolist() == [3]
    assert dense.erank.iloc[0] == pytest.approx(bottleneck_table(Js, dense=True).erank.iloc[2])
    e2e = end_to_end_table([Js[0], Js[1] @ Js[0]], dense=True, depths=[2])
    assert e2e["depth"].tolist() == [2]
    for bad in ([0], [L + 1], [], "2"):
        with pytest.raises(ValueError):
            bottleneck_table(Js, dense=True, depths=bad)
