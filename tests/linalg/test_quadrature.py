"""Lanczos quadrature (linalg/quadrature.py) against the dense eigendecomposition, and its
accelerator shape: the host reads the state only every few steps."""

import math

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from spectral_hooks.linalg.quadrature import CHECK_EVERY, lanczos_quadrature
from tests.host_reads import host_reads


def _psd(d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    M = torch.randn(d, d, generator=g, dtype=torch.float64)
    return M @ M.T / d


def _rademacher(d: int, s: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 2, (d, s), generator=g) * 2 - 1).to(torch.float64)


def _oracle(A: torch.Tensor, z: torch.Tensor, f) -> float:
    lam, V = torch.linalg.eigh(A)
    c = V.T @ z
    return float((c ** 2 * f(lam.clamp(min=0.0))).sum())


@pytest.mark.parametrize("seed", [0, 1])
def test_full_steps_are_exact_for_any_function(seed):
    """With d steps the Krylov space is exhausted: z^T f(A) z for f = sqrt and x log x equals
    the dense eigendecomposition's, to rounding."""
    d = 24
    A, Z = _psd(d, seed), _rademacher(d, 3, seed)
    rules = lanczos_quadrature(lambda X: A @ X, Z, d)
    for c, rule in enumerate(rules):
        z, theta, w = Z[:, c], rule.nodes, rule.weights
        assert rule.exact
        for f in (torch.sqrt, lambda x: torch.where(x > 0, x * x.clamp(min=1e-300).log(), 0 * x)):
            got = float(z @ z) * float((w * f(theta)).sum())
            assert math.isclose(got, _oracle(A, z, f), rel_tol=1e-9, abs_tol=1e-10)


def test_few_steps_are_exact_for_low_degree_polynomials():
    """m steps integrate polynomials of degree < 2m exactly (Gauss): x^5 with 3 steps."""
    d = 40
    A, Z = _psd(d, 7), _rademacher(d, 4, 7)
    rules = lanczos_quadrature(lambda X: A @ X, Z, 3)
    for c, rule in enumerate(rules):
        z, theta, w = Z[:, c], rule.nodes, rule.weights
        assert not rule.exact and theta.numel() == 3
        got = float(z @ z) * float((w * theta ** 5).sum())
        assert math.isclose(got, _oracle(A, z, lambda x: x ** 5), rel_tol=1e-9)


def test_gauss_radau_is_exact_to_degree_2m_with_a_node_at_the_end():
    """Gauss-Radau with m free nodes and one prescribed at 0 integrates polynomials of degree
    <= 2m exactly (Gauss with m nodes: < 2m): x^6 with 3 steps, where Gauss is not exact."""
    d = 40
    A, Z = _psd(d, 7), _rademacher(d, 4, 7)
    for c, rule in enumerate(lanczos_quadrature(lambda X: A @ X, Z, 3)):
        z = Z[:, c]
        nodes, w = rule.radau(0.0)
        assert nodes.numel() == 4 and abs(float(nodes[0])) < 1e-12
        want = _oracle(A, z, lambda x: x ** 6)
        assert math.isclose(float(z @ z) * float((w * nodes ** 6).sum()), want, rel_tol=1e-9)
        gauss = float(z @ z) * float((rule.weights * rule.nodes ** 6).sum())
        assert not math.isclose(gauss, want, rel_tol=1e-6)
        with pytest.raises(ValueError, match="smallest node"):  # not below the spectrum
            rule.radau(float(rule.nodes[1]))


def _spectra(d: int, seed: int):
    """PSD matrices whose spectra are hard for a quadrature of sqrt: power laws, eight decades
    log-uniform, exact zeros (a LayerNorm's null direction), a few large over a small bulk."""
    g = torch.Generator().manual_seed(seed)
    Q = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0]
    u = torch.rand(d, generator=g, dtype=torch.float64)
    for sigma in (u ** 4, 10.0 ** (-8 * u), 1.0 / torch.arange(1, d + 1) ** 1.5,
                  torch.where(u < 0.5, 0.0, u + 0.5), torch.cat([3 * torch.ones(5), 1e-3 * u[5:]])):
        yield Q @ torch.diag(sigma.to(torch.float64) ** 2) @ Q.T


@pytest.mark.parametrize("steps", [4, 12, 32])
def test_gauss_and_radau_at_zero_bracket_sqrt_for_every_probe(steps):
    """sqrt's even derivatives are negative and its odd ones positive on (0, inf): for every
    probe, z^T A^(1/2) z lies between the Gauss-Radau rule at 0 (below) and the Gauss rule
    (above), against the dense eigendecomposition. Up to rounding: a node at 0 moved by
    eps ||A|| moves its sqrt by sqrt(eps ||A||) ~ 1e-8 sqrt(||A||)."""
    wide = 0  # probes where both ends are off the exact value: the bracket is not vacuous
    for A in _spectra(96, steps):
        slack = 1e-7 * float(torch.linalg.matrix_norm(A, 2)) ** 0.5
        Z = _rademacher(96, 6, steps)
        for c, rule in enumerate(lanczos_quadrature(lambda X: A @ X, Z, steps)):
            z, nodes, w = Z[:, c], *rule.radau(0.0)
            want = _oracle(A, z, torch.sqrt) / float(z @ z)
            gauss = float((rule.weights * rule.nodes.sqrt()).sum())
            radau = float((w * nodes.sqrt()).sum())
            assert radau <= want + slack and want <= gauss + slack, (radau, want, gauss)
            wide += min(want - radau, gauss - want) > 1e-4 * want
    assert wide >= 6


def test_a_breakdown_is_exact_and_stops_at_the_next_check():
    """Three distinct eigenvalues: every column breaks down after three steps; the loop reads
    that at its next check and stops there, not after all the steps asked for."""
    A = torch.diag(torch.tensor([2.0] * 5 + [1.0] * 5 + [0.0] * 5, dtype=torch.float64))
    applied = []

    def apply(X):
        applied.append(1)
        return A @ X

    rules = lanczos_quadrature(apply, _rademacher(15, 4, 0), 40)
    assert len(applied) == CHECK_EVERY
    for rule in rules:
        assert rule.exact and rule.nodes.numel() == 3
        assert torch.allclose(rule.nodes, torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64),
                              atol=1e-12)
        assert math.isclose(float(rule.weights.sum()), 1.0, rel_tol=1e-12)
        assert rule.radau(0.0) == (rule.nodes, rule.weights)  # exact: nothing to bracket


def test_host_reads_are_per_check_not_per_step():
    """Issue 37: no host read inside a step. Over 48 steps the loop reads whether a column
    is alive every CHECK_EVERY steps; the end copies the tridiagonals once and reads the
    columns' lengths on the host (LAPACK's own workspace reads inside eigh left out)."""
    d, s, steps = 80, 4, 48
    A, Z = _psd(d, 3), _rademacher(d, s, 3)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        lanczos_quadrature(lambda X: A @ X, Z, steps)
    reads = host_reads(prof.events(), ("aten::linalg_eigh",))
    assert reads <= steps // CHECK_EVERY + s, reads


def test_a_nonfinite_product_raises_the_callers_error_at_the_next_check():
    """Products are tested on the device and read with the breakdown check: a NaN from the
    third product raises the caller's error within CHECK_EVERY steps, never a quadrature."""
    A, applied = _psd(20, 1), []

    def apply(X):
        applied.append(1)
        return A @ X if len(applied) < 3 else torch.full_like(X, float("nan"))

    with pytest.raises(FloatingPointError, match="the test's NaN"):
        lanczos_quadrature(apply, _rademacher(20, 2, 1), 16,
                           nonfinite=lambda: FloatingPointError("the test's NaN"))
    assert len(applied) == CHECK_EVERY


def test_rank_estimates_name_a_nonfinite_operator():
    from spectral_hooks.linalg import LinearOperator
    from spectral_hooks.metrics.rank_estimates import rank_estimates

    def nan(X):
        return torch.full_like(X, float("nan"))
    op = LinearOperator((10, 10), matvec=nan, rmatvec=nan, matmat=nan, rmatmat=nan,
                        dtype=torch.float64, device="cpu", name="broken")
    with pytest.raises(FloatingPointError, match="broken"):
        rank_estimates(op, n_probes=2, steps=6)
    assert not op.caller_checks_finite


def test_gram_quadrature_in_lockstep_is_each_operators_own_and_exact_at_d_steps():
    from spectral_hooks.linalg import DenseOperator, gram_quadrature

    g = torch.Generator().manual_seed(11)
    mats = [torch.randn(9, 7, generator=g, dtype=torch.float64) for _ in range(3)]
    probes = [torch.randn(7, 2, generator=g, dtype=torch.float64) for _ in range(3)]
    together = gram_quadrature([DenseOperator(M) for M in mats], probes, 7)
    for M, Z, rules in zip(mats, probes, together):
        alone = lanczos_quadrature(lambda X, M=M: M.T @ (M @ X), Z, 7)
        evals, evecs = torch.linalg.eigh(M.T @ M)
        for col, (a, b) in enumerate(zip(rules, alone)):
            torch.testing.assert_close(a.nodes, b.nodes, rtol=1e-10, atol=1e-10)
            assert a.exact and b.exact  # d = 7 steps: the Krylov space is exhausted
            # exact quadrature: z^T f(A) z / ||z||^2 for f = sqrt, against eigh
            z = Z[:, col] / Z[:, col].norm()
            want = float(((evecs.T @ z) ** 2 * evals.clamp(min=0).sqrt()).sum())
            assert float((a.weights * a.nodes.sqrt()).sum()) == pytest.approx(want, rel=1e-9)


def test_gram_quadrature_refuses_mismatched_probes():
    from spectral_hooks.linalg import DenseOperator, gram_quadrature

    op = DenseOperator(torch.eye(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="probe blocks"):
        gram_quadrature([op, op], [torch.ones(4, 1, dtype=torch.float64)], 2)
    with pytest.raises(ValueError, match=r"\[4, s\]"):
        gram_quadrature([op, op], [torch.ones(4, 1, dtype=torch.float64),
                                   torch.ones(4, 2, dtype=torch.float64)], 2)
    with pytest.raises(ValueError, match=r"probes\[1\] column 1 is zero"):
        gram_quadrature([op, op], [torch.ones(4, 2, dtype=torch.float64),
                                   torch.tensor([[1.0, 0.0]] * 4, dtype=torch.float64)], 2)
    with pytest.raises(ValueError, match=r"probes\[0\] column 0 is not finite"):
        gram_quadrature([op], [torch.full((4, 1), float("nan"), dtype=torch.float64)], 2)
