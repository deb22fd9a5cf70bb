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


def test_real_operators_take_complex_operands_in_complex_composites():
    """1j * A and A + A_complex are complex operators over a real part: the real part gets
    A Re x + i A Im x (it crashed with a dtype error inside matmul, found by fuzzing), and
    eigs / svds of the composites equal the dense oracle."""
    from spectral_hooks.linalg import eigs, svds

    g = torch.Generator().manual_seed(0)
    A = torch.randn(12, 12, generator=g, dtype=torch.float64)
    Z = torch.randn(12, 3, generator=g, dtype=torch.complex128)
    op = DenseOperator(A)
    torch.testing.assert_close(op.matmat(Z), A.to(Z.dtype) @ Z)
    torch.testing.assert_close(op.rmatvec(Z[:, 0]), A.T.to(Z.dtype) @ Z[:, 0])
    for composite, dense in ((1j * op, 1j * A), (op + DenseOperator(A.to(torch.complex128)),
                                                 2 * A.to(torch.complex128))):
        torch.testing.assert_close(composite.matmat(Z), dense @ Z)
        res = eigs(composite, 3)
        want = torch.linalg.eigvals(dense)
        want = want[want.abs().argsort(descending=True)][:3]
        assert bool(res.converged)
        torch.testing.assert_close(res.values.abs(), want.abs())
        torch.testing.assert_close(svds(composite, 2).S, torch.linalg.svdvals(dense)[:2])


def test_bad_operands_and_products_are_named():
    with pytest.raises(TypeError, match="floating or complex matrix"):
        DenseOperator(torch.ones(3, 3, dtype=torch.int64))
    liar = LinearOperator((3, 3), matvec=lambda x: x * 1j, dtype=torch.float64, device="cpu")
    with pytest.raises(TypeError, match="complex tensor for a real operand"):
        liar.matvec(torch.ones(3, dtype=torch.float64))


@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (0, 0), (3, 0, 5), (0, 4, 4)])
def test_an_empty_tensor_is_named_not_reshaped(shape):
    # was a RuntimeError from a reshape inside the batch ("cannot reshape tensor of 0 elements")
    import re

    from spectral_hooks.errors import OptionError
    from spectral_hooks.linalg import eigs, svds

    A = torch.zeros(shape, dtype=torch.float64)
    for solve in (eigs, svds):
        with pytest.raises(OptionError, match=re.escape(f"empty tensor of shape {shape}")):
            solve(A, 1)


def test_a_tensor_that_requires_grad_is_read_as_data():
    from spectral_hooks.linalg import eigs, svds

    W = torch.randn(12, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(1),
                    requires_grad=True)
    torch.testing.assert_close(eigs(W, 2).values, eigs(W.detach(), 2).values)
    torch.testing.assert_close(svds(W, 2).S, torch.linalg.svdvals(W.detach())[:2])


def test_a_matvec_that_returns_no_tensor_and_an_integer_dtype_are_named():
    from spectral_hooks.linalg import eigs

    B = torch.randn(12, 12, dtype=torch.float64)
    for bad in (lambda x: (B @ x).numpy(), lambda x: None):
        op = LinearOperator((12, 12), matvec=bad, dtype=torch.float64, device="cpu")
        with pytest.raises(TypeError, match="not a torch.Tensor"):
            eigs(op, 2)
    with pytest.raises(TypeError, match="floating or complex torch.dtype"):
        LinearOperator((3, 3), matvec=lambda x: x, dtype=torch.int64, device="cpu")


@pytest.mark.parametrize("members", [1, 2])
def test_a_batch_applies_real_operators_to_complex_blocks_and_counts_both_parts(members):
    """OpBatch leaves the split of a complex block to the real operator itself (A Re X +
    i A Im X, in the operator's own precision) and counts two applications a column."""
    from spectral_hooks.linalg.batch import OpBatch

    g = torch.Generator().manual_seed(0)
    mats = [torch.randn(5, 4, generator=g, dtype=dtype)
            for dtype in (torch.float64, torch.float32)[:members]]
    X = torch.randn(members, 4, 3, generator=g, dtype=torch.complex128)
    dense = torch.stack([M.double() for M in mats])
    for batch in (OpBatch([DenseOperator(M) for M in mats], what="test"),
                  OpBatch(dense, what="test")):
        Y = batch.apply(X, [True] * members)
        H = batch.apply(Y, [True] * members, adjoint=True)
        for b, M in enumerate(mats):
            A = M.to(torch.complex128)
            tol = 1e-12 if M.dtype == torch.float64 or batch.dense is not None else 1e-5
            assert Y.dtype == H.dtype == torch.complex128
            assert float((Y[b] - A @ X[b]).abs().max()) <= tol
            assert float((H[b] - A.mH @ Y[b]).abs().max()) <= tol
        assert batch.counts == [12] * members
