"""Bounds on Henrici's departure (metrics/departure.py) against a numpy float64 oracle:
dep^2 = ||A||_F^2 - sum |lambda|^2 from np.linalg.eigvals. The upper bound is the identity
dep^2 = 2 (||K||_F^2 - sum (Im lambda)^2) restricted to a subset of eigenvalues (equal to dep
with every eigenvalue, or when the others are real); the lower bound is Eberlein's. Both hold
on random and structured matrices; the matrix-free (Hutchinson) estimates cover the exact
bounds within a few standard errors, which shrink as probes grow."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from spectral_hooks.linalg import DenseOperator
from spectral_hooks.metrics.departure import departure_bounds
from spectral_hooks.metrics.jacobian import jacobian_metrics, jacobian_row


def _dep_rel(J: np.ndarray) -> float:
    D = J - np.eye(J.shape[0])
    lam = np.linalg.eigvals(D)
    fro2 = float(np.sum(D ** 2))
    return math.sqrt(max(fro2 - float(np.sum(np.abs(lam) ** 2)), 0.0) / fro2)


def _top(J: np.ndarray, k: int) -> torch.Tensor:
    lam = np.linalg.eigvals(J)
    return torch.as_tensor(lam[np.argsort(-np.abs(lam), kind="stable")][:k])


def _matrices(seed: int):
    rng = np.random.default_rng(seed)
    for d in (5, 12, 30):
        G = rng.standard_normal((d, d))
        Q = np.linalg.qr(rng.standard_normal((d, d)))[0]
        yield "gaussian", G
        yield "near identity", np.eye(d) + 0.2 * G
        yield "triangular", np.triu(G)
        yield "jordan", np.eye(d) + np.diag(np.ones(d - 1), 1)
        yield "normal", Q @ np.diag(rng.standard_normal(d)) @ Q.T + np.eye(d)
        yield "rotation + shear", np.eye(d) + Q @ (np.triu(G, 1) * 0.3 + np.diag(G.diagonal())) @ Q.T
        yield "scaled columns", (np.eye(d) + G / math.sqrt(d)) * np.logspace(0, -3, d)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bounds_bracket_the_exact_departure(seed):
    for name, J in _matrices(seed):
        d = J.shape[0]
        D = torch.as_tensor(J - np.eye(d))
        exact = _dep_rel(J)
        # every eigenvalue: the upper bound is the identity, the exact value
        full = departure_bounds(D, _top(J, d))
        assert full["upper"] == pytest.approx(exact, rel=1e-6, abs=1e-6), name
        for k in (1, max(1, d // 4)):
            b = departure_bounds(D, _top(J, k))
            # the oracle's subtraction is accurate to ~sqrt(eps) (dep of a normal matrix: ~5e-8)
            assert b["upper"] >= exact - 1e-6, (name, k, b, exact)
            assert b["lower"] <= exact + 1e-6, (name, k, b, exact)


def test_upper_bound_is_tight_when_the_rest_of_the_spectrum_is_real():
    rng = np.random.default_rng(3)
    d = 10
    T = np.triu(rng.standard_normal((d, d)), 1)
    T[np.diag_indices(d)] = np.linspace(0.1, 0.5, d)
    T[0, 0], T[1, 1], T[0, 1], T[1, 0] = 3.0, 3.0, 1.5, -0.8  # one complex pair, the largest
    Q = np.linalg.qr(rng.standard_normal((d, d)))[0]
    J = Q @ T @ Q.T
    b = departure_bounds(torch.as_tensor(J - np.eye(d)), _top(J, 2))
    assert b["upper"] == pytest.approx(_dep_rel(J), rel=1e-8)
    # without the pair the bound is loose by exactly 2 sum (Im lambda)^2 of what is left out
    loose = departure_bounds(torch.as_tensor(J - np.eye(d)), _top(J, 0))
    D = J - np.eye(d)
    im2 = float(np.sum(np.linalg.eigvals(J).imag ** 2))
    assert loose["upper"] ** 2 == pytest.approx(_dep_rel(J) ** 2 + 2 * im2 / np.sum(D ** 2),
                                                rel=1e-8)


def test_matrix_free_estimates_cover_the_exact_bounds_and_converge():
    g = torch.Generator().manual_seed(4)
    d, k = 48, 6
    J = torch.eye(d, dtype=torch.float64) + torch.randn(d, d, generator=g, dtype=torch.float64) / 5
    J[: d // 2, d // 2:] *= 3  # more non-normal than a Gaussian block
    ex = jacobian_metrics(J, k=k, dense=True)
    assert ex.departure_rel_lower <= ex.departure_rel <= ex.departure_rel_upper
    errors, ses = {}, {}
    for n in (8, 128):
        runs = [jacobian_metrics(DenseOperator(J), k=k, n_samples=n, seed=s) for s in range(4)]
        for m in runs:
            assert abs(m.departure_rel_upper - ex.departure_rel_upper) <= 4 * m.departure_rel_upper_se
            assert abs(m.departure_rel_lower - ex.departure_rel_lower) <= 4 * m.departure_rel_lower_se
        errors[n] = np.mean([abs(m.departure_rel_upper - ex.departure_rel_upper) for m in runs])
        ses[n] = np.mean([m.departure_rel_upper_se for m in runs])
    assert errors[128] < errors[8] and ses[128] < ses[8] / 2


def test_rows_carry_the_bounds_in_both_computations():
    J = torch.eye(12, dtype=torch.float64) + torch.triu(torch.ones(12, 12, dtype=torch.float64), 1)
    for m in (jacobian_metrics(J, k=3, dense=True),
              jacobian_metrics(DenseOperator(J), k=3, n_samples=16)):
        row = jacobian_row(m, layer=0, position=0)
        assert {"departure_rel_upper_top3", "departure_rel_upper_top3_se", "departure_rel_lower",
                "departure_rel_lower_se"} <= set(row)
        assert ("departure_rel" in row) == m.dense
    assert jacobian_row(jacobian_metrics(J, k=3, dense=True), layer=0,
                        position=0)["departure_rel_upper_top3_se"] == 0.0
