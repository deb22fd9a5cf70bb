"""Block Golub-Kahan-Lanczos ``svds``: every triplet against a dense float64 SVD oracle."""

import pytest
import torch

from spectral_hooks.errors import OptionError
from spectral_hooks.linalg import DenseOperator, svds
from spectral_hooks.linalg.svd import orthonormal_block


def _matrix(m, n, decay, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    U = torch.linalg.qr(torch.randn(m, min(m, n), generator=g, dtype=torch.float64)).Q
    V = torch.linalg.qr(torch.randn(n, min(m, n), generator=g, dtype=torch.float64)).Q
    s = decay ** torch.arange(min(m, n), dtype=torch.float64)
    return ((U * s) @ V.T).to(dtype)


def _check(A, res, k, tol):
    s = torch.linalg.svdvals(A.to(torch.complex128 if A.is_complex() else torch.float64))
    assert res.S == pytest.approx(s[..., :k], rel=1e-8, abs=1e-12 * float(s.max()))
    U, Vh = res.U, res.Vh
    AV = A.to(U.dtype) @ Vh.mH
    # fresh residuals of every triplet, computed here from the dense matrix
    r1 = torch.linalg.vector_norm(AV - U * res.S.unsqueeze(-2).to(U.dtype), dim=-2)
    r2 = torch.linalg.vector_norm(A.to(U.dtype).mH @ U - Vh.mH * res.S.unsqueeze(-2).to(U.dtype),
                                  dim=-2)
    assert float(torch.maximum(r1, r2).max()) <= 10 * tol * float(s.max())


@pytest.mark.parametrize("block_size", [1, 3, 4, 8])
@pytest.mark.parametrize("shape", [(150, 100), (90, 160)])
def test_block_svds_vs_dense_svd(block_size, shape):
    A = _matrix(*shape, 0.93, seed=block_size)
    res = svds(DenseOperator(A), 6, block_size=block_size, tol=1e-10)
    assert bool(res.converged)
    _check(A, res, 6, 1e-10)


def test_block_svds_batch_masks_members_that_converge_first():
    # an easy member (fast decay) and a hard one (slow decay) in one call
    A = torch.stack([_matrix(120, 100, 0.5, 0), _matrix(120, 100, 0.99, 1)])
    res = svds(A, 5, block_size=4)
    assert res.converged.tolist() == [True, True]
    _check(A, res, 5, 1e-10)
    one = svds(A[1], 5, block_size=4)
    assert res.S[1] == pytest.approx(one.S, rel=1e-9)


def test_block_svds_rank_deficient_and_complex():
    A = _matrix(80, 60, 0.9, 3)
    A[:, 30:] = 0  # rank <= 30: columns of V beyond it are made-up directions, coupling zero
    res = svds(A, 8, block_size=8)
    assert bool(res.converged)
    _check(A, res, 8, 1e-10)
    g = torch.Generator().manual_seed(4)
    C = torch.complex(_matrix(70, 50, 0.9, 5), torch.randn(70, 50, generator=g, dtype=torch.float64) * 0.1)
    res = svds(C, 4, block_size=2)
    assert bool(res.converged)
    _check(C, res, 4, 1e-10)


def test_block_svds_full_space_and_single_column_fallback():
    A = _matrix(12, 10, 0.8, 6)
    res = svds(A, 9, block_size=4)  # no room for a block: the single-vector method, full space
    assert bool(res.converged)
    _check(A, res, 9, 1e-10)


def test_block_svds_nonfinite_operator_is_named():
    A = _matrix(40, 30, 0.9, 7)
    A[3, 4] = float("nan")
    with pytest.raises(FloatingPointError, match="svds"):
        svds(DenseOperator(A), 3, block_size=2)


def test_unconverged_block_svds_is_never_reported_converged():
    A = _matrix(200, 200, 0.999, 8)
    with pytest.warns(Warning, match="did not converge"):
        res = svds(A, 6, block_size=2, max_restarts=1)
    s = torch.linalg.svdvals(A)[:6]
    wrong = float(((res.S - s).abs() / s).max()) > 1e-8
    assert not bool(res.converged) or not wrong


def test_orthonormal_block_turns_a_column_in_the_span_into_a_new_direction():
    g = torch.Generator().manual_seed(9)
    Q = torch.linalg.qr(torch.randn(2, 40, 6, generator=g, dtype=torch.float64)).Q
    W = torch.cat([Q[:, :, :3] @ torch.randn(2, 3, 2, generator=g, dtype=torch.float64),
                   torch.zeros(2, 40, 1, dtype=torch.float64),
                   torch.randn(2, 40, 2, generator=g, dtype=torch.float64)], 2)
    X = orthonormal_block(Q, W)
    assert float((Q.mH @ X).abs().max()) < 1e-13
    assert float((X.mH @ X - torch.eye(5, dtype=torch.float64)).abs().max()) < 1e-13
    # the part of W off Q lies in span(X)
    off = W - Q @ (Q.mH @ W)
    assert float(torch.linalg.matrix_norm(off - X @ (X.mH @ off)).max()) < 1e-12


@pytest.mark.parametrize("block_size", [None, 1, 4])
@pytest.mark.parametrize("shape", [(3, 10), (8, 40), (20, 100)])
def test_wide_operators_are_bidiagonalised_through_their_adjoint(block_size, shape):
    """A wide A (m < n): the m-dimensional left space cannot hold the right start block's
    directions, so the space was taken for exact at ncv = m and a singular value could be
    missed with converged=True (found by fuzzing: 8 x 40, k = 3). Every triplet against the
    dense SVD, alone and in a batch."""
    g = torch.Generator().manual_seed(140)
    A = torch.randn(*shape, generator=g, dtype=torch.float64)
    for k in (1, 3):
        res = svds(A, k, block_size=block_size, tol=1e-10)
        assert bool(res.converged)
        _check(A, res, k, 1e-10)
    both = svds([DenseOperator(A), DenseOperator(2 * A)], 3, block_size=block_size)
    s = torch.linalg.svdvals(A)[:3]
    torch.testing.assert_close(both.S, torch.stack([s, 2 * s]), rtol=1e-8, atol=1e-12)
    assert both.U.shape == (2, shape[0], 3) and both.Vh.shape == (2, 3, shape[1])


def test_a_subspace_no_wider_than_k_is_refused_unless_it_is_everything():
    A = torch.randn(12, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with pytest.raises(OptionError, match="k = 2 < ncv"):
        svds(A, 2, ncv=2)
    res = svds(A[:, :3], 3, ncv=3)  # k = ncv = min(m, n): the whole space, exact
    torch.testing.assert_close(res.S, torch.linalg.svdvals(A[:, :3]))


@pytest.mark.parametrize("scale", [1e-200, 1e-170, 1e150, 1e200])
def test_scale_does_not_decide_convergence(scale):
    """The squares of a 1e-170 operator's residuals underflow to 0: every test passed and a
    wrong spectrum came back converged (found by fuzzing). Residuals and estimates are now
    relative before their norms."""
    A = torch.randn(50, 50, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    res = svds(A * scale, 3)
    assert bool(res.converged)
    torch.testing.assert_close(res.S / scale, torch.linalg.svdvals(A)[:3], rtol=1e-10, atol=0)
    quick = svds(A * scale, 3, method="randomized")  # 4 power steps: not converged at 1e-10
    assert not bool(quick.converged)
    assert bool(svds(A * scale, 3, method="randomized", tol=1e-1).converged)


@pytest.mark.parametrize("kw", [{}, {"block_size": 4}, {"device_path": True}])
def test_every_copy_of_a_repeated_top_value(kw):
    """Singular values 5 (x10), 2 (x10), 1 (x10) of a 30 x 120 matrix: a Krylov space of 20
    of the 30 directions found seven copies of 5, then 2, converged=True (found by fuzzing).
    Where the default space is over half the whole, the whole is taken: exact."""
    g = torch.Generator().manual_seed(0)
    s = torch.tensor([5.0] * 10 + [2.0] * 10 + [1.0] * 10, dtype=torch.float64)
    U = torch.linalg.qr(torch.randn(30, 30, generator=g, dtype=torch.float64)).Q
    V = torch.linalg.qr(torch.randn(120, 30, generator=g, dtype=torch.float64)).Q
    A = U @ torch.diag(s) @ V.T
    for k in (3, 8, 12):
        res = svds(A, k, **kw)
        assert bool(res.converged)
        torch.testing.assert_close(res.S, s[:k], rtol=1e-10, atol=1e-10)


def _with_copies(m, n, copies, at, seed, dtype=torch.float64):
    """An m x n matrix whose singular values are 6 .. 0.1 with ``copies`` extra copies of the
    ``at``-th; returns it and its singular values."""
    g = torch.Generator().manual_seed(seed)
    r = min(m, n)
    s = torch.linspace(6, 0.1, r - copies, dtype=torch.float64)
    s = torch.cat([s, s[at].repeat(copies)]).sort(descending=True).values
    U = torch.linalg.qr(torch.randn(m, r, generator=g, dtype=dtype)).Q
    V = torch.linalg.qr(torch.randn(n, r, generator=g, dtype=dtype)).Q
    return (U * s.to(dtype)) @ V.mH, s


def test_the_probe_finds_copies_for_each_member_of_a_batch():
    """A batch of one matrix with 30 copies of its second value and one with distinct values,
    one column a step: the first member's probe finds a rival and is solved again on the
    complement of what it found; both members hold the oracle's triplets (and the second its
    own answer, as solved alone)."""
    A, _ = _with_copies(120, 100, 30, 1, seed=1)
    C = _matrix(120, 100, 0.97, seed=2)
    res = svds([DenseOperator(A), DenseOperator(C)], 10, block_size=1)
    assert res.converged.all()
    for j, M in enumerate((A, C)):
        _check(M, type(res)(U=res.U[j], S=res.S[j], Vh=res.Vh[j], n_matvecs=0,
                            converged=res.converged[j]), 10, 1e-10)
    alone = svds(C, 10, block_size=1)
    torch.testing.assert_close(res.S[1], alone.S, rtol=1e-10, atol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_the_probe_in_a_small_complement_takes_the_whole_space(dtype):
    """ncv = 30 of 48 with k = 16 leaves a complement of 32, too small for a part of it: a
    member with a rival is solved in the whole space (exact), complex operators too."""
    A, s = _with_copies(60, 48, 20, 0, seed=3, dtype=dtype)
    res = svds(A, 16, block_size=2, ncv=30)
    assert bool(res.converged)
    _check(A, res, 16, 1e-10)


def test_wide_operators_are_probed_through_their_adjoint():
    A, _ = _with_copies(90, 300, 25, 2, seed=4)
    res = svds(A.T.contiguous(), 12, block_size=1)  # 300 x 90: tall, the probe on A^H
    _check(A.T, res, 12, 1e-10)
    res = svds(A, 12, block_size=1)
    _check(A, res, 12, 1e-10)


def test_a_product_with_no_part_off_the_basis_gets_a_direction_off_it():
    """QR makes up e_1 for an exactly zero column. Where e_1 lies in the basis, every pass
    returned e_1 again: a "new" basis vector inside the old basis."""
    Q = torch.eye(3, dtype=torch.float64)[:, :2].unsqueeze(0)   # e_1, e_2
    for W in (1e-19 * Q[:, :, :1], torch.zeros(1, 3, 1, dtype=torch.float64)):
        X = orthonormal_block(Q, W)
        assert float((Q.mH @ X).abs().max()) < 1e-12
        assert abs(float(X[0, 2, 0])) == pytest.approx(1.0)


def test_rank_one_factors_in_a_lockstep_chain():
    """Four 3 x 3 factors of ranks 1, 2, 1, 1 (a fuzz draw), products of depth 1-4 in
    lockstep, k = 2: depth 3's left basis took e_1 twice (the case above) and came back 0.6%
    off, unconverged; the same product alone converged."""
    from spectral_hooks.linalg import ChainProducts

    Js = torch.tensor([
        [[-0.11451524017913754, -0.10012229749527664, -0.014659167119256612],
         [-6.374958742535913e-05, -5.573716779896139e-05, -8.160624336028333e-06],
         [-0.16215561758722813, -0.1417749546628165, -0.02075764146168642]],
        [[-0.2610581483477477, -0.11126580389812542, 0.22073477948490514],
         [0.18764269904017725, 0.1635835039506712, -0.04465290907566357],
         [0.5774259581605284, 1.1716881419182241, 0.7738687460027759]],
        [[-0.017728481799410934, -0.0030891863166121526, 0.011721950833785503],
         [-0.13401650685393582, -0.02335236394506682, 0.08861079713603627],
         [0.0761127521057534, 0.013262640026660307, -0.050325230784138]],
        [[-0.6234447734690797, 0.4446900895472156, -0.4710631154760508],
         [0.4088277035550507, -0.29160823193956026, 0.3089025041591962],
         [-0.14317551373422954, 0.10212409299570596, -0.10818071853300291]]],
        dtype=torch.float64)
    factors = [DenseOperator(J) for J in Js]
    chains = ChainProducts([factors[:depth] for depth in range(1, 5)])
    dense = [torch.linalg.multi_dot(list(Js[:depth].flip(0))) if depth > 1 else Js[0]
             for depth in range(1, 5)]
    for seed in range(10):
        res = svds(chains.members, 2, tol=1e-8, seed=seed)
        assert bool(res.converged.all()), seed
        for depth, P in enumerate(dense):
            s = torch.linalg.svdvals(P)[:2]
            assert float((res.S[depth] - s).abs().max()) <= 1e-8 * float(s[0]), (seed, depth)
