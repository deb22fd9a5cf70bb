import math

import pytest
import torch

from spectral_hooks.linalg import (
    DenseOperator,
    column_norms_sq,
    diagonal,
    frobenius_sq,
    hutchinson_trace,
    hutchpp_trace,
    svds,
    trace_of_square,
)


def _lowrankish(m, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    U = torch.linalg.qr(torch.randn(m, n, generator=g, dtype=torch.float64)).Q
    V = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64)).Q
    return U @ torch.diag(0.8 ** torch.arange(n, dtype=torch.float64)) @ V.T


@pytest.mark.parametrize("method", ["lanczos", "randomized"])
def test_svds_vs_dense(method):
    A = _lowrankish(150, 100)
    res = svds(DenseOperator(A), 6, method=method)
    s = torch.linalg.svdvals(A)[:6]
    assert torch.allclose(res.S, s, rtol=1e-8 if method == "lanczos" else 1e-4)
    approx = res.U @ torch.diag(res.S) @ res.Vh
    assert torch.linalg.matrix_norm(A @ res.Vh.T @ res.Vh - approx) < 1e-3
    if method == "lanczos":
        assert bool(res.converged)


def test_svds_batched_and_errors():
    A = torch.stack([_lowrankish(60, 40, s) for s in range(3)])
    res = svds(A, 4)
    torch.testing.assert_close(res.S, torch.linalg.svdvals(A)[:, :4])
    with pytest.raises(ValueError):
        svds(A, 0)


def test_estimators_close_to_dense():
    g = torch.Generator().manual_seed(0)
    A = torch.randn(80, 80, generator=g, dtype=torch.float64) + 10 * torch.eye(80, dtype=torch.float64)
    n = 4000
    assert hutchinson_trace(A, n_samples=n).value == pytest.approx(float(A.trace()), rel=1e-2)
    assert frobenius_sq(A, n_samples=n).value == pytest.approx(float((A ** 2).sum()), rel=1e-2)
    assert trace_of_square(A, n_samples=n).value == pytest.approx(float((A @ A).trace()), rel=1e-2)
    assert hutchpp_trace(A, n_matvecs=240).value == pytest.approx(float(A.trace()), rel=1e-2)
    d = diagonal(A, n_samples=n)
    assert float((d.value - A.diag()).abs().max()) < 5 * float(d.std_error.max()) + 1e-12
    c = column_norms_sq(DenseOperator(A), n_samples=n)
    assert torch.allclose(c.value, (A ** 2).sum(0), rtol=0.1)


def test_error_shrinks_like_inverse_sqrt():
    g = torch.Generator().manual_seed(1)
    A = torch.randn(60, 60, generator=g, dtype=torch.float64)
    exact = float(A.trace())
    err = {}
    for s in (16, 256):
        err[s] = sum(abs(hutchinson_trace(A, n_samples=s, seed=i).value - exact)
                     for i in range(40)) / 40
    ratio = err[16] / err[256]  # ideal sqrt(256 / 16) = 4
    assert 2.5 < ratio < 6.5


@pytest.mark.parametrize("scale", [1e-300, 2.0 ** -1000, 1e150, 1e300])
def test_estimates_and_std_errors_scale_with_the_operator(scale):
    """The std error of an operator at 1e-300 read 0 (the deviations' squares underflowed: an
    estimate that called itself exact) and at 1e150 inf; each estimator's value and std error
    scale with the operator (a power of two exactly, others to rounding)."""
    A = torch.randn(40, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for estimator, kw in ((hutchinson_trace, dict(n_samples=64)), (diagonal, dict(n_samples=64)),
                          (hutchpp_trace, dict(n_matvecs=30)), (trace_of_square, dict(n_samples=64)),
                          (frobenius_sq, dict(n_samples=64))):
        power = 2 if estimator in (trace_of_square, frobenius_sq) else 1
        if abs(power * math.log10(scale)) > 300:
            continue  # the value itself is not a float64
        base, scaled = estimator(A, **kw), estimator(A * scale, **kw)
        for got, want in ((scaled.value, base.value), (scaled.std_error, base.std_error)):
            got, want = (torch.as_tensor(x, dtype=torch.float64) for x in (got, want))
            assert bool(torch.isfinite(got).all()) and bool((got != 0).all())
            torch.testing.assert_close(got / scale ** power, want, rtol=1e-12, atol=0)


def test_a_float32_tensor_is_estimated_in_float64():
    """Hutch++ on a float32 30 x 30 with 90 products: Q spans everything, the estimate is exact
    but for rounding, and std_error ~1e-14 said so while float32 sums were 1e-7 off (all 69
    float32 cases of a fuzz). A dense tensor is now read in float64: its estimate is that
    exact tensor's, within its std error."""
    A = torch.randn(30, 30, generator=torch.Generator().manual_seed(0))  # float32
    exact = float(A.double().trace())
    est = hutchpp_trace(A, n_matvecs=90, seed=1)
    assert abs(est.value - exact) <= max(4 * est.std_error, 1e-12 * abs(exact))
    for estimator in (hutchinson_trace, diagonal):  # a batch's values are tensors
        assert estimator(torch.stack([A, A]), n_samples=8).value.dtype == torch.float64
