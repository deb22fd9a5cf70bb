"""Top-k (Krylov) path of the power-method spectra (d > dense_limit) vs numpy oracles and the dense path.

A small ``dense_limit`` forces the top-k path on d = 64..200 matrices whose full spectrum numpy can
still compute: the oracle below is np.linalg.eig in the test, never the implementation.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pandas as pd
import pytest
import torch

import spectral_hooks.metrics.power as power
import spectral_hooks.metrics.spectrum as spectrum_mod
from spectral_hooks.metrics.power import power_table, spectra_table
from spectral_hooks.metrics.spectrum import clear_spectrum_cache, spectrum
from spectral_hooks.report import Report

torch.set_num_threads(1)

LIMIT = 40  # below every d used here: the top-k path


def t64(a) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a), dtype=torch.float64)


def rot(modulus: float, angle: float) -> np.ndarray:
    c, s = modulus * math.cos(angle), modulus * math.sin(angle)
    return np.array([[c, -s], [s, c]])


def build(top: list, d: int, seed: int, bulk: float = 0.8) -> np.ndarray:
    """Real d x d matrix: eigenvalues `top` (scalars / 2x2 rotation-scalings) plus a random bulk of
    spectral radius ~bulk, under a random well-conditioned similarity."""
    rng = np.random.default_rng(seed)
    D = np.zeros((d, d))
    i = 0
    for b in top:
        if np.isscalar(b):
            D[i, i], i = b, i + 1
        else:
            D[i : i + 2, i : i + 2], i = b, i + 2
    m = d - i
    D[i:, i:] = bulk * rng.standard_normal((m, m)) / math.sqrt(m) / 1.15
    Q1 = np.linalg.qr(rng.standard_normal((d, d)))[0]
    Q2 = np.linalg.qr(rng.standard_normal((d, d)))[0]
    S = Q1 @ np.diag(rng.uniform(1.0, 2.0, d)) @ Q2
    return S @ D @ np.linalg.inv(S)


def projector(cols: list) -> np.ndarray:
    Q = np.linalg.qr(np.stack(cols, axis=1))[0]
    return Q @ Q.T


def np_oracle(F: np.ndarray, shift: float = 0.0):
    """lambda1, lambda2 (of F), gap |mu2|/|mu1|, projectors on P1 and on P1 + plane(lambda2)."""
    vals, vecs = np.linalg.eig(F)
    q = np.abs(vals + shift)
    top = np.flatnonzero(q >= q.max() * (1 - 1e-9))
    i1 = top[np.argmax(vals[top].imag)]
    rest = [i for i in range(len(vals)) if i != i1 and abs(vals[i] - np.conj(vals[i1])) > 1e-8]
    q_rest = q[rest]
    top2 = [rest[j] for j in np.flatnonzero(q_rest >= q_rest.max() * (1 - 1e-9))]
    i2 = max(top2, key=lambda i: vals[i].imag)

    def plane(i):
        v = vecs[:, i]
        if abs(vals[i].imag) > 1e-9:
            return [v.real, v.imag]
        return [(v * np.exp(-1j * np.angle(v[np.argmax(abs(v))]))).real]

    gap = abs(vals[i2] + shift) / abs(vals[i1] + shift)
    return vals[i1], vals[i2], gap, projector(plane(i1)), projector(plane(i1) + plane(i2))


def np_align(X: np.ndarray, P: np.ndarray) -> np.ndarray:
    return np.linalg.norm(X @ P, axis=1) / np.linalg.norm(X, axis=1)


# Leading structure of each case: (top eigenvalues, d); lambda2 / B2 widths vary.
CASES = {
    "real_then_pair": ([3.0, rot(2.0, 0.9)], 64),           # B 1-d, B2 3-d
    "pair_then_real": ([rot(3.0, 0.6), -2.2], 120),          # B 2-d, B2 3-d
    "pair_then_pair": ([rot(2.5, 2.2), rot(2.0, 0.4)], 200),  # B 2-d, B2 4-d
    "iterate_flips": ([-3.0, 2.5, rot(1.8, 0.3)], 90),       # "F": -3 leads; "I+F": 2.5 leads
}


def B_projector(B: torch.Tensor) -> np.ndarray:
    b = B.numpy()
    return b @ b.T


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_spectrum_cache()
    yield
    clear_spectrum_cache()


@pytest.mark.parametrize("iterate", ["F", "I+F"])
@pytest.mark.parametrize("case", list(CASES))
def test_topk_spectrum_matches_numpy(case, iterate):
    top, d = CASES[case]
    F = build(top, d, seed=list(CASES).index(case))
    shift = 1.0 if iterate == "I+F" else 0.0
    lam1, lam2, gap, P1, P2 = np_oracle(F, shift)
    s = spectrum(t64(F), iterate=iterate, dense_limit=LIMIT)
    assert s.truncated and s.converged and s.n_computed in (8, 9) and s.eigenvalues.shape == (s.n_computed,)
    assert s.eigenvectors.shape == (d, s.n_computed)
    assert abs(s.lambda1 - lam1) <= 1e-8 * abs(lam1) and abs(s.lambda2 - lam2) <= 1e-8 * abs(lam2)
    assert s.mu1 == pytest.approx(lam1 + shift, rel=1e-12) and s.gap_ratio == pytest.approx(gap, rel=1e-8)
    assert s.lambda1_is_complex == (abs(lam1.imag) > 1e-9) and s.lambda2_is_complex == (abs(lam2.imag) > 1e-9)
    assert np.abs(B_projector(s.B) - P1).max() <= 1e-8 and np.abs(B_projector(s.B2) - P2).max() <= 1e-8
    # the computed eigenvalues are the leading ones of numpy's full spectrum, in the iterate order
    ref = np.linalg.eigvals(F)
    ref = ref[np.argsort(-np.abs(ref + shift), kind="stable")][: s.n_computed]
    got = s.eigenvalues.numpy()
    assert np.allclose(np.sort_complex(got), np.sort_complex(ref), rtol=0, atol=1e-8)
    assert np.all(np.diff(np.abs(got + shift)) <= 1e-12)
    # and the dense path (default limit) agrees
    dense = spectrum(t64(F), iterate=iterate)
    assert not dense.truncated and dense.n_computed == d and dense.converged
    assert abs(dense.lambda1 - s.lambda1) <= 1e-8 * abs(lam1)
    assert dense.gap_ratio == pytest.approx(s.gap_ratio, rel=1e-8)


@pytest.mark.parametrize("iterate", ["F", "I+F"])
def test_topk_tables_match_dense_and_numpy(iterate):
    d, N = 96, 60
    cases = [CASES["real_then_pair"][0], CASES["pair_then_real"][0], CASES["pair_then_pair"][0],
             CASES["iterate_flips"][0]]
    Fs = np.stack([build(top, d, seed=20 + i) for i, top in enumerate(cases)])
    rng = np.random.default_rng(5)
    pre = [rng.standard_normal((N, d)) for _ in Fs]
    post = [x + 0.5 * x @ F.T for x, F in zip(pre, Fs)]
    args = (t64(Fs), [t64(x) for x in pre], [t64(x) for x in post])
    top = power_table(*args, iterate=iterate, dense_limit=LIMIT)
    dense = power_table(*args, iterate=iterate)
    assert top["truncated"].all() and top["converged"].all() and top["n_computed"].isin([8, 9]).all()
    assert not dense["truncated"].any() and dense["converged"].all() and (dense["n_computed"] == d).all()
    numeric = [c for c in power.POWER_TABLE_COLUMNS if c not in ("iterate", "truncated", "n_computed")]
    for col in numeric:
        np.testing.assert_allclose(top[col].to_numpy(float), dense[col].to_numpy(float), rtol=1e-8, atol=1e-10,
                                   err_msg=col)
    shift = 1.0 if iterate == "I+F" else 0.0
    for t, F in enumerate(Fs):
        lam1, lam2, gap, P1, P2 = np_oracle(F, shift)
        row = top.iloc[t]
        a_in, a_out = np_align(pre[t], P1), np_align(post[t], P1)
        assert row["lambda1_real"] == pytest.approx(lam1.real, abs=1e-8 * abs(lam1))
        assert row["lambda1_imag"] == pytest.approx(lam1.imag, abs=1e-8 * abs(lam1))
        assert row["abs_lambda2"] == pytest.approx(abs(lam2), rel=1e-8)
        assert row["gap_ratio"] == pytest.approx(gap, rel=1e-8)
        assert row["gamma_in"] == pytest.approx(a_in.mean(), rel=1e-8)
        assert row["gamma"] == pytest.approx(a_out.mean(), rel=1e-8)
        assert row["gamma2"] == pytest.approx(np_align(post[t], P2).mean(), rel=1e-8)
        assert row["rho"] == pytest.approx((a_out > a_in).mean(), abs=1e-12)
        assert row["subspace_dim"] == (2 if abs(lam1.imag) > 1e-9 else 1)


def test_spectra_table_truncated_rows():
    Fs = t64(np.stack([build(CASES["pair_then_real"][0], 70, seed=s) for s in (1, 2)]))
    top = spectra_table(Fs, dense_limit=LIMIT, top_k=5)
    dense = spectra_table(Fs)
    assert top.columns.tolist() == dense.columns.tolist()
    assert top["truncated"].all() and top["converged"].all()
    assert not dense["truncated"].any() and dense["converged"].all() and len(dense) == 140
    for t in range(2):
        sub, ref = top[top["layer"] == t], dense[dense["layer"] == t]
        n = len(sub)
        assert n in (5, 6) and sub["index"].tolist() == list(range(n))
        for col in ("real", "imag", "abs"):
            np.testing.assert_allclose(sub[col].to_numpy(), ref[col].to_numpy()[:n], atol=1e-8, err_msg=col)


def test_small_top_k_still_gives_lambda2_and_tiny_d_stays_dense():
    F = build(CASES["pair_then_pair"][0], 50, seed=3)
    lam1, lam2, gap, _, _ = np_oracle(F)
    s = spectrum(t64(F), dense_limit=LIMIT, top_k=1)  # uses at least 3: the pair and lambda2
    assert s.truncated and s.n_computed >= 3 and abs(s.lambda2 - lam2) <= 1e-8 * abs(lam2)
    small = spectrum(t64(build([2.0], 5, seed=1)), dense_limit=2)  # eigs needs k <= d - 2
    assert not small.truncated and small.n_computed == 5
    with pytest.raises(ValueError):
        spectrum(t64(F), dense_limit=-1)
    with pytest.raises(ValueError):
        power_table(t64(F)[None], top_k=0)
    with pytest.raises(ValueError):
        spectra_table(t64(F), top_k=2.5)


def test_non_convergence_is_reported_not_raised(monkeypatch, caplog):
    # a narrow space (the default ncv spans all 80 dimensions: exact in one cycle) and no restart
    monkeypatch.setattr(spectrum_mod, "_EIGS_KW", {"tol": 1e-10, "max_restarts": 0, "seed": 0,
                                                   "ncv": 20})
    F = t64(np.stack([build(CASES["real_then_pair"][0], 80, seed=9)]))
    X = torch.randn(20, 80, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with caplog.at_level(logging.WARNING):
        table = power_table(F, [X], [X @ F[0].T], dense_limit=LIMIT)
        spec = spectra_table(F, dense_limit=LIMIT)
    assert table["converged"].tolist() == [False] and table["truncated"].tolist() == [True]
    assert not spec["converged"].any() and spec["truncated"].all()
    assert any("did not converge" in r.getMessage() and r.name == power.__name__ for r in caplog.records)
    assert np.isfinite(table[["abs_lambda1", "gamma", "gamma_null"]].to_numpy(float)).all()
    assert spectrum(F[0], dense_limit=LIMIT).converged is False


def test_spectra_shared_between_tables(monkeypatch):
    calls = []
    inner = spectrum_mod.layer_spectrum

    def counting(F, iterate, *a, **kw):
        calls.append(iterate)
        return inner(F, iterate, *a, **kw)

    monkeypatch.setattr(spectrum_mod, "layer_spectrum", counting)
    Fs = t64(np.stack([build(CASES["real_then_pair"][0], 64, seed=s) for s in range(3)]))
    power_table(Fs, layers=[2, 0], dense_limit=LIMIT)
    assert len(calls) == 2
    spec = spectra_table(Fs, dense_limit=LIMIT)  # only layer 1 is new
    assert len(calls) == 3 and spec["truncated"].all()
    power_table(Fs, dense_limit=LIMIT)
    assert len(calls) == 3
    power_table(Fs, dense_limit=LIMIT, iterate="I+F")  # other options: computed
    power_table(Fs)  # dense path: computed
    assert len(calls) == 9
    Fs.mul_(2.0)  # in-place edit: the cached spectra are stale
    table = power_table(Fs, dense_limit=LIMIT)
    assert len(calls) == 12 and table.loc[0, "abs_lambda1"] == pytest.approx(6.0, rel=1e-8)
    power_table(Fs.clone(), dense_limit=LIMIT)  # another tensor with the same values
    assert len(calls) == 15
    clear_spectrum_cache()
    power_table(Fs, dense_limit=LIMIT)
    assert len(calls) == 18


def test_report_roundtrip_with_new_columns(tmp_path):
    Fs = t64(np.stack([build(CASES["pair_then_real"][0], 48, seed=4)]))
    X = torch.randn(10, 48, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    jac = pd.DataFrame({"source": "jacobian", "layer": 0, "position": 0, "index": [0, 1],
                        "real": [1.0, 0.5], "imag": 0.0, "abs": [1.0, 0.5]})  # rows without the new columns
    spectra = pd.concat([spectra_table(Fs, dense_limit=LIMIT), jac], ignore_index=True)
    report = Report({"power": power_table(Fs, [X], [X], dense_limit=LIMIT), "spectra": spectra})
    back = Report.load(report.save(tmp_path / "r", format="csv"))
    pd.testing.assert_frame_equal(back["power"], report["power"])
    pd.testing.assert_frame_equal(back["spectra"], report["spectra"])
    assert "truncated" in report.to_html(figures=False)
