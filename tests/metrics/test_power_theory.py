"""Theory checks of the power-method view on a synthetic shared-weight, FFN-free model.

The model. One attention layer with value/output map F = W_O W_V, applied L times (shared
weights), uniform attention (every token attends to all n tokens with weight 1/n), no FFN, and
an L2 normalisation of every token after the residual add:

    x_i  <-  N(x_i + F xbar),     xbar = (1/n) sum_j x_j,   N(y) = y / ||y||.

Derivation of what it predicts. Write x_i = xbar + delta_i (sum_i delta_i = 0). Before
normalisation y_i = (I + F) xbar + delta_i: the mean takes one power-iteration step on I + F,
the deviations are unchanged. Normalising token by token, to first order in delta,
N(a + delta_i) = (a + delta_i) / ||a|| - a (a . delta_i) / ||a||^3, whose mean over i is a / ||a||
(the first-order terms average to zero). Hence

    xbar <- (I + F) xbar / ||(I + F) xbar|| + O(|delta|^2)      (the power iteration on I + F),
    delta_i <- delta_i / ||(I + F) xbar|| + O(|delta|^2)        (shrinks by ~1/|mu_1| per layer).

So the mean direction converges to v_1 of I + F at rate |mu_2 / mu_1| and every token follows it
once the deviations have died out; the token angle to v_1 decays as |mu_2/mu_1|^t when that is the
slower of the two rates, i.e. when |mu_2| > 1 (the matrices below are built that way).
The variant x_i <- (x_i + F xbar) / ||(I + F) xbar|| (one common normaliser) makes the mean follow
the power iteration exactly; it is used to check the shared-weight table's bookkeeping.
A complex leading pair mu = r e^{+-i theta} (orthogonal similarity) makes the mean converge to the
pair's real plane, inside which it rotates by theta per layer. A bipolar start (half the tokens at
+v_1, half at -v_1) has xbar = 0, so it is a fixed point; a perturbation of the mean grows like the
next eigenvalue of I + F, so it is unstable and the tokens leave it and reach consensus.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from spectral_hooks.metrics.power import consensus
from spectral_hooks.metrics.shared_weights import shared_weight_table
from spectral_hooks.metrics.spectrum import spectrum
from spectral_hooks.metrics.steering_math import rank1_output_edit


def layer(X: torch.Tensor, F: torch.Tensor) -> torch.Tensor:
    """Uniform attention, residual add, per-token L2 normalisation. X: [n, d] (tokens as rows)."""
    Y = X + X.mean(0) @ F.T
    return Y / Y.norm(dim=1, keepdim=True)


def layer_common_norm(X: torch.Tensor, F: torch.Tensor) -> torch.Tensor:
    """The variant whose mean follows the power iteration exactly."""
    m = X.mean(0)
    return (X + m @ F.T) / (m + m @ F.T).norm()


def run(X: torch.Tensor, F: torch.Tensor, L: int, step=layer) -> list[torch.Tensor]:
    outs = []
    for _ in range(L):
        X = step(X, F)
        outs.append(X)
    return outs


def orthogonal(d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0]


def F_from_mu(D_mu: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
    """F = S (D_mu - I) S^{-1}: I + F has the (block) eigen-structure D_mu."""
    return S @ (D_mu - torch.eye(len(D_mu), dtype=torch.float64)) @ torch.linalg.inv(S)


def tokens(n: int, d: int, seed: int, spread: float = 0.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(d, generator=g, dtype=torch.float64) + spread * torch.randn(n, d, generator=g, dtype=torch.float64)
    return X / X.norm(dim=1, keepdim=True)


def line_angles(X: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    v = v / v.norm()
    c = X @ v
    return torch.atan2((X - c[:, None] * v).norm(dim=1), c.abs())


def real_case(seed: int = 0, normal: bool = False) -> tuple[torch.Tensor, np.ndarray]:
    d = 8
    mus = torch.tensor([4.0, 2.0, 1.2, -1.0, 0.8, 0.5, 0.3, 0.1], dtype=torch.float64)
    S = orthogonal(d, seed)
    if not normal:
        S = S @ torch.diag(torch.linspace(1.0, 1.5, d, dtype=torch.float64)) @ orthogonal(d, seed + 100)
    return F_from_mu(torch.diag(mus), S), S


def np_mu(F: torch.Tensor):
    """Independent oracle: eigenpairs of I + F sorted by modulus (numpy)."""
    vals, vecs = np.linalg.eig(np.eye(len(F)) + F.numpy())
    order = np.argsort(-np.abs(vals))
    return vals[order], vecs[:, order]


@pytest.mark.parametrize("normal", [True, False])
def test_tokens_converge_to_v1_at_predicted_rate(normal):
    F, _ = real_case(seed=0, normal=normal)
    mu, vecs = np_mu(F)
    rate = abs(mu[1] / mu[0])
    v1 = torch.from_numpy(np.real(vecs[:, 0]))
    outs = run(tokens(32, 8, seed=1), F, 30)
    worst = np.array([float(line_angles(X, v1).max()) for X in outs])
    slope = np.polyfit(np.arange(10, 30), np.log(worst[10:30]), 1)[0]
    assert slope == pytest.approx(math.log(rate), rel=0.05)
    assert worst[-1] < 1e-7
    assert spectrum(F, iterate="I+F").gap_ratio == pytest.approx(rate, rel=1e-10)


def test_complex_pair_plane_with_rotation():
    d, theta = 8, 0.6
    D = torch.diag(torch.tensor([0, 0, 1.2, -1.0, 0.8, 0.5, 0.3, 0.1], dtype=torch.float64))
    c, s = math.cos(theta), math.sin(theta)
    D[:2, :2] = 3.0 * torch.tensor([[c, -s], [s, c]], dtype=torch.float64)
    F = F_from_mu(D, orthogonal(d, 3))
    mu, vecs = np_mu(F)
    assert abs(mu[0].imag) > 0.1 and abs(abs(mu[2]) / abs(mu[0]) - 0.4) < 1e-9
    plane = torch.from_numpy(np.linalg.qr(np.stack([vecs[:, 0].real, vecs[:, 0].imag], 1))[0])
    B = spectrum(F, iterate="I+F").B
    assert torch.linalg.matrix_norm(B @ B.T - plane @ plane.T, 2) < 1e-9
    outs = run(tokens(32, d, seed=4), F, 40)
    out_of_plane = np.array([float((X - X @ plane @ plane.T).norm(dim=1).max()) for X in outs])
    assert out_of_plane[-1] < 1e-12 and out_of_plane[-1] < 1e-10 * out_of_plane[0]
    coords = torch.stack([X.mean(0) @ plane for X in outs])
    phase = torch.atan2(coords[:, 1], coords[:, 0]).numpy()
    steps = np.angle(np.exp(1j * np.diff(phase)))
    assert np.allclose(np.abs(steps[-15:]), theta, atol=1e-6)  # keeps rotating, by theta per layer
    assert consensus(outs[-1]).mean_cos > 1 - 1e-9  # tokens rotate together


def test_bipolar_start_is_unstable():
    F, S = real_case(seed=5, normal=True)
    v1 = S[:, 0]
    X0 = torch.cat([v1.expand(8, 8), -v1.expand(8, 8)])
    still = run(X0, F, 30)[-1]
    assert float((still - X0).abs().max()) < 1e-14  # exact fixed point
    g = torch.Generator().manual_seed(6)
    Xp = X0 + 1e-9 * torch.randn(16, 8, generator=g, dtype=torch.float64)
    outs = run(Xp / Xp.norm(dim=1, keepdim=True), F, 60)
    drift = np.array([float(X.mean(0).norm()) for X in outs])
    growth = math.exp(np.polyfit(np.arange(2, 18), np.log(drift[2:18]), 1)[0])
    assert growth == pytest.approx(2.0, rel=0.05)  # |mu_2|: the mean's perturbation grows
    assert consensus(X0).mean_cos == pytest.approx(-1 / 15)
    assert consensus(outs[-1]).mean_cos > 0.99  # tokens left the bipolar configuration


def test_shared_weight_table_exact_variant():
    F, _ = real_case(seed=7)
    X0 = tokens(24, 8, seed=8, spread=1.0)
    outs = run(X0, F, 20, step=layer_common_norm)
    table = shared_weight_table(F, outs, X0)
    mu, vecs = np_mu(F)
    assert len(table) == 20 and table["layer"].tolist() == list(range(20))
    assert (table["angle_pred_obs_deg"] < 1e-8).all()
    assert np.allclose(table["predicted_rate"], abs(mu[1] / mu[0]), rtol=1e-10)
    assert table["abs_mu1"].iloc[0] == pytest.approx(abs(mu[0]))
    v1 = torch.from_numpy(np.real(vecs[:, 0]))
    obs = [math.degrees(float(line_angles(X.mean(0)[None], v1)[0])) for X in outs]
    assert np.allclose(table["angle_obs_principal_deg"], obs, atol=1e-9)
    assert table["angle_obs_principal_deg"].iloc[-1] < 0.01


def test_shared_weight_table_normalised_model():
    F, _ = real_case(seed=9)
    X0 = tokens(24, 8, seed=10, spread=0.5)
    outs = run(X0, F, 15)
    table = shared_weight_table(F, outs, X0)
    assert (table["angle_pred_obs_deg"].iloc[3:] < 1.0).all()
    assert table["n_tokens"].eq(24).all() and not table["mu1_is_complex"].any()
    with pytest.raises(ValueError):
        shared_weight_table(F, outs, torch.zeros(4, 8, dtype=torch.float64))
    with pytest.raises(ValueError):
        shared_weight_table(F, [outs[0][:, :7]], X0)


def test_steered_shared_layer_aligns_tokens():
    g = torch.Generator().manual_seed(11)
    H, dh, d = 4, 2, 8
    W_V = torch.randn(H, dh, d, generator=g, dtype=torch.float64) / math.sqrt(d)
    W_O = torch.randn(H, d, dh, generator=g, dtype=torch.float64) / math.sqrt(dh)
    u = torch.randn(d, generator=g, dtype=torch.float64)
    u = u / u.norm()
    edit = rank1_output_edit(W_V, W_O, u, gap=0.01)
    F_steered = torch.einsum("hij,hjk->ik", W_O + edit.delta_W_O, W_V)
    X = run(tokens(16, d, seed=12), F_steered, 10)[-1]
    assert float((X @ u).abs().min()) >= 0.99
    X_plain = run(tokens(16, d, seed=12), torch.einsum("hij,hjk->ik", W_O, W_V), 10)[-1]
    assert float((X_plain @ u).abs().mean()) < 0.9
