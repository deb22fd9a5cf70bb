"""Paper 1's idealised dynamics (metrics/idealised.py, idealised_table.py) against direct
float64 numpy computations, and the theory it predicts (see tests/metrics/test_power_theory.py
for the derivation): the mean token follows the power iteration on I + F at |mu_2/mu_1|, a
token's angle to v_1 contracts at max(|mu_2|, 1)/|mu_1|, a complex leading pair turns the mean by
arg(mu_1) per layer, and an even +-v_1 split is a (bipolar) fixed point."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from spectral_hooks.metrics.idealised import (
    idealised_run,
    idealised_step,
    oriented,
    plane_angle_deg,
    pole_stats,
    tan_ratio,
    token_rate,
    uniform_attention,
)
from spectral_hooks.metrics.idealised_table import IDEALISED_COLUMNS, idealised_table
from spectral_hooks.metrics.power import power_table


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def numpy_step(X: np.ndarray, W_V: np.ndarray, W_O: np.ndarray, A: np.ndarray) -> np.ndarray:
    """The paper's form, tokens as columns: X_c + sum_h W_O^h W_V^h X_c A_h^T, columns normalised."""
    Xc = X.T
    Y = Xc + sum(W_O[h] @ W_V[h] @ Xc @ A[h].T for h in range(len(W_V)))
    return (Y / np.linalg.norm(Y, axis=0, keepdims=True)).T


def heads(seed: int, H: int = 3, dh: int = 2, d: int = 6):
    g = rng(seed)
    return g.standard_normal((H, dh, d)), g.standard_normal((H, d, dh))


def stochastic(g: np.random.Generator, H: int, n: int) -> np.ndarray:
    A = g.random((H, n, n))
    return A / A.sum(-1, keepdims=True)


def test_step_with_per_head_patterns_matches_numpy():
    W_V, W_O = heads(0)
    g = rng(1)
    X, A = g.standard_normal((5, 6)), stochastic(g, 3, 5)
    ours = idealised_step(torch.tensor(X), heads=(torch.tensor(W_V), torch.tensor(W_O)),
                          A=torch.tensor(A))
    np.testing.assert_allclose(ours.numpy(), numpy_step(X, W_V, W_O, A), rtol=1e-12, atol=1e-14)
    assert ours.dtype == torch.float64


@pytest.mark.parametrize("causal", [False, True])
def test_uniform_step_through_F_equals_the_per_head_form(causal):
    W_V, W_O = heads(2)
    X = rng(3).standard_normal((4, 6))
    n = 4
    A = np.tril(np.ones((n, n))) if causal else np.ones((n, n))
    A = A / A.sum(1, keepdims=True)
    expected = numpy_step(X, W_V, W_O, np.broadcast_to(A, (3, n, n)))
    F = torch.tensor(np.einsum("hdk,hkm->dm", W_O, W_V))
    via_F = idealised_step(torch.tensor(X), F, causal=causal)
    via_heads = idealised_step(torch.tensor(X), heads=(torch.tensor(W_V), torch.tensor(W_O)),
                               causal=causal)
    np.testing.assert_allclose(via_F.numpy(), expected, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(via_heads.numpy(), expected, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(uniform_attention(n, causal=causal).numpy(), A)


def test_step_rejects_bad_input():
    F = torch.eye(3)
    with pytest.raises(ValueError, match="zero"):  # a zero start token has no direction
        idealised_run(torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]), [F])
    with pytest.raises(ValueError, match="zero"):  # F = -I with one token: x + (-x) = 0
        idealised_step(torch.tensor([[1.0, 0.0, 0.0]]), -F)
    with pytest.raises(ValueError, match="exactly one"):
        idealised_step(torch.ones(2, 3), None)
    with pytest.raises(ValueError, match="need heads"):
        idealised_step(torch.ones(2, 3), F, A=torch.ones(4, 2, 2) / 2)
    with pytest.raises(ValueError, match="patterns"):
        idealised_step(torch.ones(2, 3), F, A=torch.ones(3, 3) / 3)


def orthogonal(d: int, seed: int) -> np.ndarray:
    return np.linalg.qr(rng(seed).standard_normal((d, d)))[0]


def F_with_mu(mu_block: np.ndarray, S: np.ndarray) -> np.ndarray:
    """F with I + F = S mu_block S^T (S orthogonal)."""
    return S @ (mu_block - np.eye(len(mu_block))) @ S.T


def clustered_tokens(n: int, d: int, seed: int) -> np.ndarray:
    g = rng(seed)
    return g.standard_normal(d) + 0.3 * g.standard_normal((n, d))


@pytest.mark.parametrize("mu, rows", [((3.0, 1.5), slice(13, 16)), ((4.0, 0.5), slice(10, 12))])
def test_mean_and_tokens_contract_at_the_predicted_rates(mu, rows):
    """Mean: |mu_2/mu_1|; token angle: max(|mu_2|, 1)/|mu_1| (0.5, 0.5 and 0.125, 0.25)."""
    d, n, L = 8, 10, 16
    S = orthogonal(d, 4)
    D = np.diag([mu[0], mu[1]] + [0.3] * (d - 2))
    F = F_with_mu(D, S)
    X0 = clustered_tokens(n, d, 5)
    table = idealised_table(torch.tensor(F)[None].repeat(L, 1, 1), [torch.tensor(X0)],
                            iterate="I+F")
    assert table.predicted_rate.to_numpy() == pytest.approx(mu[1] / mu[0], rel=1e-9)
    assert table.token_rate.to_numpy() == pytest.approx(max(mu[1], 1) / mu[0], rel=1e-9)
    # the mean's tan ratio reaches |mu2/mu1| once the deviations have died out
    # (the O(delta^2) correction fades at token_rate / predicted_rate per layer; rows chosen
    # before the tan of the mean falls to rounding noise, where rate_pred is NaN)
    assert table.rate_pred.iloc[rows].to_numpy() == pytest.approx(mu[1] / mu[0], rel=3e-2)
    # one token, by numpy: tan of its angle to v_1 = S[:, 0]
    v = S[:, 0]
    X, tans = X0 / np.linalg.norm(X0, axis=1, keepdims=True), []
    for _ in range(L):
        Y = X + X.mean(0) @ F.T
        X = Y / np.linalg.norm(Y, axis=1, keepdims=True)
        c = X[0] @ v
        tans.append(np.linalg.norm(X[0] - c * v) / abs(c))
    ratios = np.array(tans[1:]) / np.array(tans[:-1])  # -> token_rate (transient (2/3)^t at worst)
    assert ratios[11:14] == pytest.approx(max(mu[1], 1) / mu[0], rel=3e-2)
    assert table.gamma_pred.iloc[-1] > 0.999 and table.mean_cos_pred.iloc[-1] > 0.999


def test_complex_leading_pair_turns_the_mean_by_arg_mu1():
    d, theta, r = 6, 0.4, 3.0
    S = orthogonal(d, 6)
    D = np.eye(d) * 0.5
    D[:2, :2] = r * np.array([[math.cos(theta), -math.sin(theta)],
                              [math.sin(theta), math.cos(theta)]])
    F = torch.tensor(F_with_mu(D, S))
    table = idealised_table(F[None].repeat(10, 1, 1), [torch.tensor(clustered_tokens(7, d, 7))],
                            iterate="I+F")
    assert table.lambda1_is_complex.all()
    assert table.rotation_theory_deg.to_numpy() == pytest.approx(math.degrees(theta), rel=1e-9)
    assert table.rotation_pred_deg.iloc[-4:].to_numpy() == pytest.approx(math.degrees(theta),
                                                                          rel=1e-3)
    assert table.frac_plus_pred.isna().all() and table.bipolarity_pred.isna().all()
    assert table.angle_pred_principal_deg.iloc[-1] < 1e-3  # converged to the pair's plane


def test_an_even_split_between_plus_and_minus_v1_is_a_bipolar_fixed_point():
    d = 5
    S = orthogonal(d, 8)
    F = F_with_mu(np.diag([3.0, 1.2, 0.5, 0.5, 0.5]), S)
    v = S[:, 0]
    g = rng(9)
    Y = v + 0.05 * g.standard_normal((3, d))
    Y /= np.linalg.norm(Y, axis=1, keepdims=True)
    X0 = np.concatenate([Y, -Y])  # unit tokens, mean exactly zero: the uniform update vanishes
    out = idealised_run(torch.tensor(X0), [torch.tensor(F)] * 3)
    np.testing.assert_allclose(out[-1].numpy(), X0 / np.linalg.norm(X0, axis=1, keepdims=True),
                               atol=1e-12)
    frac, bip = pole_stats(out[-1], torch.tensor(v))
    c = out[-1].numpy() @ v
    assert frac == pytest.approx(0.5) and bip == pytest.approx(1 - abs(c.mean()) / abs(c).mean())
    assert bip > 0.99


def test_pole_stats_and_orientation_match_numpy():
    g = rng(10)
    X, v = g.standard_normal((9, 4)), g.standard_normal(4)
    c = X @ v / (np.linalg.norm(X, axis=1) * np.linalg.norm(v))
    frac, bip = pole_stats(torch.tensor(X), torch.tensor(v))
    assert frac == pytest.approx((c > 0).mean()) and bip == pytest.approx(
        1 - abs(c.mean()) / abs(c).mean(), rel=1e-12)
    assert pole_stats(torch.tensor(np.abs(X)), torch.tensor(np.abs(v)))[1] == pytest.approx(0)
    w = oriented(torch.tensor([0.1, -2.0, 1.0]))
    assert float(w[1]) > 0 and float(w.norm()) == pytest.approx(1)


def test_plane_angle_and_tan_ratio_match_numpy():
    g = rng(11)
    B = np.linalg.qr(g.standard_normal((5, 2)))[0]
    a, b = g.standard_normal(5), g.standard_normal(5)
    pa, pb = B.T @ a, B.T @ b
    expected = math.degrees(math.acos(pa @ pb / (np.linalg.norm(pa) * np.linalg.norm(pb))))
    ours = plane_angle_deg(torch.tensor(a), torch.tensor(b), torch.tensor(B))
    assert ours == pytest.approx(expected, rel=1e-10)

    def tan(x):
        inside = np.linalg.norm(B.T @ x)
        return np.linalg.norm(x - B @ (B.T @ x)) / inside

    assert tan_ratio(torch.tensor(a), torch.tensor(b), torch.tensor(B)) == pytest.approx(
        tan(b) / tan(a), rel=1e-10)
    assert math.isnan(tan_ratio(torch.tensor(B[:, 0]), torch.tensor(b), torch.tensor(B)))
    assert token_rate(4.0, 0.5) == 0.25 and token_rate(4.0, 2.0) == 0.5


def test_table_matches_the_power_table_and_a_numpy_run():
    """gamma_obs is power's gamma; gamma_pred / mean directions from a numpy run; two
    sequences evolve separately; rows filter, first skips layers."""
    d, L = 6, 3
    g = rng(12)
    F = g.standard_normal((L, d, d)) * 0.7
    seqs = [g.standard_normal((4, d)), g.standard_normal((3, d))]
    pre = [g.standard_normal((7, d)) for _ in range(L)]
    post = [g.standard_normal((7, d)) for _ in range(L)]
    T = lambda xs: [torch.tensor(x) for x in xs]  # noqa: E731
    table = idealised_table(torch.tensor(F), T(seqs), T(pre), T(post), iterate="F")
    assert list(table.columns) == list(IDEALISED_COLUMNS)
    power = power_table(torch.tensor(F), T(pre), T(post))
    np.testing.assert_allclose(table.gamma_obs, power.gamma, rtol=1e-13)
    np.testing.assert_allclose(table.mean_cos_obs, power.mean_cos, rtol=1e-13)
    Xs = [x / np.linalg.norm(x, axis=1, keepdims=True) for x in seqs]
    for t in range(L):
        Xs = [numpy_step(x, F[t][None], np.eye(d)[None], np.full((1, len(x), len(x)), 1 / len(x)))
              for x in Xs]
        pred = np.concatenate(Xs)
        vals, vecs = np.linalg.eig(F[t])
        i = np.argmax(np.abs(vals))
        if abs(vals[i].imag) > 1e-9:
            B = np.linalg.qr(np.stack([vecs[:, i].real, vecs[:, i].imag], 1))[0]
        else:
            B = vecs[:, i].real[:, None] / np.linalg.norm(vecs[:, i].real)
        gamma = (np.linalg.norm(pred @ B, axis=1) / np.linalg.norm(pred, axis=1)).mean()
        assert table.gamma_pred[t] == pytest.approx(gamma, rel=1e-10)
    late = idealised_table(torch.tensor(F), T(seqs), first=1, layers=[2])
    assert late.layer.tolist() == [2] and late.gamma_obs.isna().all()
    with pytest.raises(ValueError, match="resid_post"):
        idealised_table(torch.tensor(F), T(seqs), None, T([x[:5] for x in post]))
    with pytest.raises(ValueError, match="heads"):
        idealised_table(torch.tensor(F), T(seqs), patterns=[[None, None]] * L)


def leading_mode(F: np.ndarray, iterate: str):
    """Dense float64 oracle: (lambda_1, lambda_2, B) of F in one ordering (|lambda| or
    |1 + lambda|); lambda_2 = the first eigenvalue that is not lambda_1's conjugate."""
    vals, vecs = np.linalg.eig(F)
    key = np.abs(vals + (1.0 if iterate == "I+F" else 0.0))
    order = np.argsort(-key, kind="stable")
    i = order[0]
    lam1 = vals[i]
    lam2 = next(vals[j] for j in order[1:] if not np.isclose(vals[j], np.conj(lam1))
                and not np.isclose(vals[j], lam1))
    v = vecs[:, i]
    B = (np.linalg.qr(np.stack([v.real, v.imag], 1))[0] if abs(lam1.imag) > 1e-9
         else (v.real / np.linalg.norm(v.real))[:, None])
    return lam1, lam2, B


def test_one_ordering_per_table_when_F_and_I_plus_F_lead_with_different_modes():
    """F's leading pair -1.9 +- 0.4i has |1 + lambda| = 0.98 (as on MiniLM's layers 1, 3, 4), so
    I + F leads with the real lambda = 1.3 (mu = 2.3): every spectral column of a table must come
    from the one ordering named in its ``iterate`` column (the old table took B_t and the angle
    from F but the rates from I + F: predicted_rate 0.73 on an "F" row whose B_t is the pair)."""
    d, L = 7, 3
    blocks = np.zeros((d, d))
    blocks[:2, :2] = [[-1.9, -0.4], [0.4, -1.9]]  # lambda = -1.9 +- 0.4i
    blocks[2, 2] = 1.3
    blocks[3:5, 3:5] = [[0.6, -0.5], [0.5, 0.6]]  # lambda = 0.6 +- 0.5i
    blocks[5, 5], blocks[6, 6] = 0.2, -0.1
    S = np.eye(d) + 0.3 * rng(20).standard_normal((d, d))  # not orthogonal: F non-normal
    F = S @ blocks @ np.linalg.inv(S)
    X0 = clustered_tokens(9, d, 21)
    Fs = torch.tensor(F)[None].repeat(L, 1, 1)
    default = idealised_table(Fs, [torch.tensor(X0)])
    assert (default.iterate == "I+F").all()
    pred = [x.numpy() for x in idealised_run(torch.tensor(X0), [torch.tensor(F)] * L)]
    for iterate in ("F", "I+F"):
        table = idealised_table(Fs, [torch.tensor(X0)], iterate=iterate)
        lam1, lam2, B = leading_mode(F, iterate)
        mu1, mu2 = 1 + lam1, 1 + lam2
        assert (table.iterate == iterate).all()
        assert table.predicted_rate.to_numpy() == pytest.approx(abs(mu2) / abs(mu1), rel=1e-9)
        assert table.token_rate.to_numpy() == pytest.approx(max(abs(mu2), 1) / abs(mu1),
                                                            rel=1e-9)
        complex1 = abs(lam1.imag) > 1e-9
        assert table.lambda1_is_complex.tolist() == [complex1] * L
        theory = table.rotation_theory_deg.to_numpy()
        if complex1:
            assert theory == pytest.approx(math.degrees(abs(np.angle(mu1))), rel=1e-9)
        else:
            assert np.isnan(theory).all()
        for t in range(L):
            gamma = (np.linalg.norm(pred[t] @ B, axis=1) / np.linalg.norm(pred[t], axis=1)).mean()
            assert table.gamma_pred[t] == pytest.approx(gamma, rel=1e-9)
        if iterate == "F":  # the pair leads: ~156 deg, a rate above 1 (not I + F's leading mode)
            assert complex1 and table.predicted_rate.iloc[0] > 1
        else:
            assert not complex1 and abs(mu1) == pytest.approx(2.3, rel=1e-9)
            np.testing.assert_allclose(table.gamma_pred, default.gamma_pred, rtol=1e-12)
