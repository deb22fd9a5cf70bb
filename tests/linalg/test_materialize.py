"""eigs is matrix-free by default; with materialize="auto" it materialises a batched operator
where its columns cost less than two Krylov cycles (issue 24), and its answer is the dense
oracle's either way, checked with fresh products of the operator itself."""

import numpy as np
import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.errors import ConvergenceWarning, OptionError, OptionTypeError
from spectral_hooks.linalg import DenseOperator, LinearOperator, eigs, materialize, svds

from ..oracles import assert_same_spectrum, eigvals_by_modulus, token_jacobian, top_k_by_modulus
from ..tiny_models import make_model
from ._spectra import make_matrix, set_distance, top_by_modulus

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class _Counting(LinearOperator):
    """A dense operator with a batched-product hint that records the width of each
    application."""

    def __init__(self, A, *, hint=32, dtype=None):
        self.widths = []

        def mm(X):
            self.widths.append(X.shape[1])
            return (A @ X.to(A.dtype)).to(X.dtype)
        super().__init__(tuple(A.shape), matvec=lambda x: mm(x[:, None])[:, 0], matmat=mm,
                         dtype=dtype or A.dtype, device=A.device, block_size=hint)


def test_by_default_a_batched_operator_is_never_materialised():
    A, vals = make_matrix(300, [2.0, 1.8 + 0.5j, 1.6, -1.55], bulk_radius=1.2,
                          nonnormal=0.3, seed=1)
    op = _Counting(A)
    res = eigs(op, 6, tol=1e-10)
    # Krylov vectors one at a time, the returned pairs checked in one product: no identity
    assert op.widths.count(1) == len(op.widths) - 1 and op.widths[-1] <= 7
    assert set_distance(res.values, top_by_modulus(vals, res.values.shape[-1])) < 1e-8
    assert bool(res.converged)


def test_auto_materialises_a_batched_operator_and_equals_the_oracle():
    # n = 300 columns at COLUMN_COST cost 36 single ones, under KRYLOV_MIN
    A, vals = make_matrix(300, [2.0, 1.8 + 0.5j, 1.6, -1.55], bulk_radius=1.2,
                          nonnormal=0.3, seed=1)
    op = _Counting(A)
    res = eigs(op, 6, tol=1e-10, materialize="auto")
    assert op.widths[:3] == [128, 128, 44]  # the identity, WIDTH columns an application
    # then one check of the returned pairs, zero-padded to the width the operator has built:
    # no Krylov step on it
    assert len(op.widths) == 4 and op.widths[3] == materialize.WIDTH
    assert res.n_matvecs == 300 + materialize.WIDTH
    assert set_distance(res.values, top_by_modulus(vals, res.values.shape[-1])) < 1e-8
    assert bool(res.converged) and float(res.residuals.max()) <= 1e-10
    Ax = A.to(torch.complex128) @ res.vectors
    np.testing.assert_allclose(res.residuals, (torch.linalg.vector_norm(
        Ax - res.vectors * res.values, dim=0) / res.values.abs()).numpy(), atol=1e-13)


def test_where_columns_cost_more_than_a_krylov_run_auto_iterates_on_the_operator():
    # n = 1300 at COLUMN_COST: 156 columns' cost, over KRYLOV_MIN and two cycles of ncv = 20
    A, vals = make_matrix(1300, [2.0, 1.8 + 0.5j, 1.6, -1.55], bulk_radius=1.2, seed=2)
    op = _Counting(A)
    res = eigs(op, 3, tol=1e-10, materialize="auto")
    assert materialize.WIDTH not in op.widths
    assert op.widths.count(1) > 0.9 * len(op.widths)
    assert set_distance(res.values, top_by_modulus(vals, res.values.shape[-1])) < 1e-8
    assert bool(res.converged)


def test_materialize_option_forces_either_path_and_is_checked():
    A, vals = make_matrix(200, [2.0, 1.8 + 0.5j, 1.6], bulk_radius=1.2, seed=3)
    on = _Counting(A, hint=None)  # no hint: never materialised unless asked
    res = eigs(on, 5, materialize=True)
    assert on.widths[:2] == [materialize.WIDTH, 200 - materialize.WIDTH]
    assert set_distance(res.values, top_by_modulus(vals, res.values.shape[-1])) < 1e-8
    off = _Counting(A)
    res = eigs(off, 5, materialize=False)
    assert materialize.WIDTH not in off.widths
    assert set_distance(res.values, top_by_modulus(vals, res.values.shape[-1])) < 1e-8
    plain = _Counting(A, hint=None)
    eigs(plain, 5, materialize="auto")
    assert materialize.WIDTH not in plain.widths  # "auto": only batched operators
    blocked = _Counting(A)
    eigs(blocked, 5, block_size=4, materialize="auto")  # a block size asked for is a Krylov
    assert materialize.WIDTH not in blocked.widths      # shape asked for
    for bad in ("yes", None, 1):
        with pytest.raises(OptionTypeError, match="materialize"):
            eigs(on, 5, materialize=bad)  # pyright: ignore[reportArgumentType]


def test_a_batch_and_a_complex_operator_are_materialised_member_by_member():
    mats = [make_matrix(150, [2.0 + 0.1 * i, 1.8 + 0.5j, 1.6], bulk_radius=1.2, seed=10 + i)
            for i in range(3)]
    ops = [_Counting(A) for A, _ in mats]
    res = eigs(ops, 4, tol=1e-10, materialize="auto")
    for i, (_, vals) in enumerate(mats):
        K = int(torch.isfinite(res.values[i].real).sum())
        assert materialize.WIDTH in ops[i].widths
        assert set_distance(res.values[i][:K], top_by_modulus(vals, K)) < 1e-8
    assert bool(res.converged.all())
    g = torch.Generator().manual_seed(4)
    C = torch.randn(140, 140, dtype=torch.complex128, generator=g) / 140 ** 0.5
    res = eigs(_Counting(C), 5, tol=1e-10, materialize="auto")
    assert_same_spectrum(res.values.numpy(), top_k_by_modulus(
        torch.linalg.eigvals(C).numpy(), 5), 1e-8)
    assert bool(res.converged)


def test_an_operator_not_linear_to_working_precision_is_not_converged():
    # a float32 product inside a float64 operator: its matrix meets tol=1e-10, the operator's
    # own fresh products cannot; converged=True would be a wrong claim
    A, _ = make_matrix(200, [2.0, 1.8 + 0.5j, 1.6], bulk_radius=1.2, seed=5)
    op = _Counting(A.to(torch.float32), dtype=torch.float64)
    with pytest.warns(ConvergenceWarning, match="materialised matrix met tol"):
        res = eigs(op, 4, tol=1e-10, materialize=True)
    assert not bool(res.converged)
    assert float(res.residuals.max()) > 1e-10


def test_the_rule_only_for_batched_cpu_operators_up_to_dense_max():
    def pays(n, m, device="cpu", hint=32):
        op = LinearOperator((n, n), matvec=lambda x: x, dtype=torch.float64, device=device,
                            block_size=hint)
        return materialize.pays(materialize.OpBatch(op, what="eigs"), m=m)
    # n * COLUMN_COST < max(2 ncv, KRYLOV_MIN): n < 1250, or n < 16.7 ncv where larger
    assert pays(768, 20) and pays(1249, 24) and not pays(1251, 24)
    assert pays(1599, 96) and not pays(1601, 96)
    assert not pays(768, 96, hint=None) and not pays(768, 96, hint=1)
    assert not pays(768, 96, device="meta")  # an accelerator: not measured, Krylov
    assert not pays(3000, 500)  # beyond DENSE_MAX


def test_the_check_of_the_pairs_reuses_the_width_the_matrix_was_built_at():
    # a batched-JVP operator traces (and checks) a graph per product width: the fresh
    # products of the returned pairs run at the materialising width, not a narrower new one
    A, _ = make_matrix(300, [2.0, 1.8 + 0.5j, 1.6, -1.55], bulk_radius=1.2, seed=1)
    for n, hint in ((300, 32), (40, 32), (300, None)):
        op = _Counting(A[:n, :n], hint=hint)
        eigs(op, 6, tol=1e-10, materialize=True)
        built = set(op.widths[:-1])
        if hint:  # the pairs' columns zero-padded to min(WIDTH, n)
            assert op.widths[-1] == min(materialize.WIDTH, n) == max(built)
        else:  # a plain operator pays for its columns alone: no padding
            assert op.widths[-1] <= 7


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_block_jacobian_materialised_or_not_equals_jacfwd(family):
    model = make_model(family, dtype=torch.float64)
    ids = torch.randint(0, 50, (1, 6), generator=torch.Generator().manual_seed(0))
    probe = sh.instrument(model)
    with torch.no_grad():
        model(ids)
    want = eigvals_by_modulus(token_jacobian(probe, layer=1)).numpy()
    for forced in ("auto", True, False):
        res = sh.eigs(probe.jacobian(1), 6, tol=1e-10, materialize=forced)
        assert bool(res.converged)
        got = res.values.flatten().numpy()
        assert_same_spectrum(got, top_k_by_modulus(want, len(got)), 1e-8)
    probe.remove()


def test_a_matrix_formed_by_the_caller_is_iterated_on_and_checked_with_the_operator():
    A, vals = make_matrix(200, [2.0, 1.8 + 0.5j, 1.6, -1.55], bulk_radius=1.2,
                          nonnormal=0.3, seed=2)
    op = _Counting(A)
    M = materialize.matrix_of(op)
    assert torch.equal(M, A) and op.widths == [materialize.WIDTH, 200 - materialize.WIDTH]
    res = eigs(op, 6, tol=1e-10, materialize=M)
    assert bool(res.converged)
    assert set_distance(res.values, top_by_modulus(vals, res.values.shape[-1])) < 1e-8
    # a matrix that is not the operator's: the fresh products refute it
    wrong = M.clone()
    wrong[0, 0] += 1e-3
    with pytest.warns(ConvergenceWarning, match="not linear"):
        assert not bool(eigs(op, 6, tol=1e-10, materialize=wrong).converged)
    with pytest.raises(OptionError, match="materialize"):
        eigs(op, 6, materialize=M[:100, :100])
    with pytest.raises(OptionError, match="materialize"):
        eigs(A, 6, materialize=M)  # op is a matrix already


def test_svd_residuals_check_the_triplets_with_fresh_products():
    A = torch.randn(120, 120, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    res = svds(A, 5, tol=1e-10)
    r = materialize.svd_residuals(DenseOperator(A), res)
    assert r.shape == (5,) and float(r.max()) <= 1e-10
    op = _Counting(A)  # a batched operator: the k columns padded to the width J was formed at
    assert float(materialize.svd_residuals(op, res).max()) <= 1e-10
    assert op.widths == [min(materialize.WIDTH, 120)]
    # the oracle's triplets pass; another matrix's fail
    U, S, Vh = torch.linalg.svd(A)
    exact = type(res)(U=U[:, :5], S=S[:5], Vh=Vh[:5], n_matvecs=0, converged=res.converged)
    assert float(materialize.svd_residuals(DenseOperator(A), exact).max()) < 1e-12
    B = A.clone()
    B[:, :] += 1e-4 * torch.randn(120, 120, dtype=torch.float64,
                                   generator=torch.Generator().manual_seed(5))
    assert float(materialize.svd_residuals(DenseOperator(B), res).max()) > 1e-6
    with pytest.raises(OptionError, match="return_vectors"):
        materialize.svd_residuals(DenseOperator(A), svds(A, 5, return_vectors=False))
