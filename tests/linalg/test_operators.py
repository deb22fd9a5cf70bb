import pytest
import torch

from spectral_hooks.linalg import DenseOperator, IdentityOperator, LinearOperator, aslinearoperator


def _mats(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(5, 4, generator=g, dtype=torch.float64),
            torch.randn(4, 3, generator=g, dtype=torch.float64),
            torch.randn(5, 4, generator=g, dtype=torch.float64))


def _fn_op(M, **kw):
    return LinearOperator(M.shape, matvec=lambda x: M @ x, rmatvec=lambda y: M.T @ y,
                          dtype=M.dtype, device=M.device, **kw)


def test_algebra_matches_dense():
    A, B, C = _mats()
    a, b, c = _fn_op(A), DenseOperator(B), _fn_op(C)
    torch.testing.assert_close((a @ b).to_dense(), A @ B)
    torch.testing.assert_close((a + c).to_dense(), A + C)
    torch.testing.assert_close((a - c).to_dense(), A - C)
    torch.testing.assert_close((2.5 * a).to_dense(), 2.5 * A)
    torch.testing.assert_close((-a).to_dense(), -A)
    torch.testing.assert_close(a.T.to_dense(), A.T)
    torch.testing.assert_close(a.H.to_dense(), A.T)
    torch.testing.assert_close(((a @ b).T @ (a @ b)).to_dense(), (A @ B).T @ (A @ B))
    x = torch.randn(3, dtype=torch.float64)
    torch.testing.assert_close(a @ (b @ x), A @ B @ x)


def test_complex_adjoint_and_scaling():
    g = torch.Generator().manual_seed(1)
    M = torch.randn(4, 4, generator=g, dtype=torch.complex128)
    a = DenseOperator(M)
    torch.testing.assert_close(a.H.to_dense(), M.mH)
    torch.testing.assert_close((1j * a).H.to_dense(), (1j * M).mH)


def test_counter_and_matmat_fallbacks():
    A, _, _ = _mats()
    a = _fn_op(A)
    a.matmat(torch.randn(4, 7, dtype=torch.float64))
    assert a.n_matvecs == 7
    a.rmatvec(torch.randn(5, dtype=torch.float64))
    assert a.n_matvecs == 8
    v = _fn_op(A, vectorized=True)
    torch.testing.assert_close(v.to_dense(), A)


def test_shape_errors_name_both_shapes():
    A, B, C = _mats()
    with pytest.raises(ValueError, match=r"\(5, 4\).*\(5, 4\)"):
        _fn_op(A) @ _fn_op(C)
    with pytest.raises(ValueError, match=r"\(5, 4\).*\(4, 3\)"):
        _fn_op(A) + DenseOperator(B)
    with pytest.raises(ValueError, match=r"\(3,\)"):
        _fn_op(A).matvec(torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError):
        LinearOperator((3,), matvec=lambda x: x, dtype=torch.float64, device="cpu")
    with pytest.raises(TypeError):
        aslinearoperator([[1.0]])


def test_missing_adjoint_names_operator():
    A, _, _ = _mats()
    a = LinearOperator(A.shape, matvec=lambda x: A @ x, dtype=A.dtype, device="cpu",
                       name="jvp_op")
    with pytest.raises(NotImplementedError, match="jvp_op"):
        a.T
    with pytest.raises(NotImplementedError, match="jvp_op"):
        a.rmatvec(torch.zeros(5, dtype=torch.float64))


def test_dtype_device_propagate():
    A = torch.randn(3, 3, dtype=torch.float32)
    a = aslinearoperator(A)
    assert a.dtype == torch.float32 and a.device == A.device
    assert (a + 1j * a).dtype == torch.complex64
    assert (a @ IdentityOperator(3, torch.float64)).dtype == torch.float64
    assert a.to_dense().dtype == torch.float32


def test_finite_checks_reach_a_composites_parts_and_its_error_names_the_part_at_fault():
    """Issue 37: a solver that tests a composite's products itself tells every part
    (``caller_checks_finite``); where the product is not finite, the composite's error is that
    of the part whose coefficients are not."""
    from spectral_hooks.linalg import DenseOperator

    good = DenseOperator(torch.eye(4, dtype=torch.float64))
    bad_matrix = torch.eye(4, dtype=torch.float64)
    bad_matrix[2, 1] = float("inf")
    bad = DenseOperator(bad_matrix)
    composite = 2.0 * (good @ (bad - good)).T
    composite.caller_checks_finite = True
    assert good.caller_checks_finite and bad.caller_checks_finite
    composite.caller_checks_finite = False
    assert not good.caller_checks_finite and not bad.caller_checks_finite
    err = composite.nonfinite_error()
    assert isinstance(err, FloatingPointError) and str(err) == f"{bad!r} returned NaN or Inf"
    assert (good @ good).nonfinite_error() is None
