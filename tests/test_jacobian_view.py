"""probe.analyze(jacobian=..., bottleneck=..., reinit=...) against the dense float64 oracles
of tests/oracles.py: block Jacobians by torch.func.jacfwd on the block module, metrics by
numpy/scipy."""

import numpy as np
import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.errors import OptionError
from tests.oracles import jacobian_metrics_oracle, last_real_position, token_jacobian
from tests.tiny_models import make_model

K = 6


def _token_jacobian(probe, layer, sample=0):
    """d f(H)[p] / d H[p] at the last real token p, by jacfwd on the block itself."""
    p = last_real_position(probe, sample)
    return token_jacobian(probe, layer, position=p, sample=sample).numpy(), p


def _oracle(J):
    return jacobian_metrics_oracle(J, K)


@pytest.fixture(scope="module", params=["gpt2", "bert"])
def recorded(request):
    model = make_model(request.param)
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.randint(0, 100, (1, 6)))
    return probe


def test_dense_mode_is_exact(recorded):
    report = recorded.analyze(jacobian={"k": K, "dense": True}, progress=False)
    table = report.jacobian
    for layer in range(recorded.anatomy.n_layers):
        J, p = _token_jacobian(recorded, layer)
        want = _oracle(J)
        row = table[(table.layer == layer) & (table.variant == "trained")].iloc[0]
        assert row.position == p and row.dense
        for name in ("frac_complex", "mean_abs_angle", "frac_negative", f"frac_complex_top{K}",
                     f"mean_abs_angle_top{K}", f"frac_negative_top{K}", "sym_energy",
                     "commutator", f"self_alignment_top{K}", "top_eig_abs"):
            assert row[name] == pytest.approx(want[name], rel=1e-8, abs=1e-10, nan_ok=True), name
        assert row.departure == pytest.approx(want["departure"], abs=1e-6)
        assert row.departure_rel == pytest.approx(want["departure_rel"], abs=1e-6)
        spectra = report.spectra
        got = spectra[(spectra.source == "jacobian") & (spectra.layer == layer)]
        np.testing.assert_allclose(np.sort(got["abs"].to_numpy()),
                                   np.sort(np.abs(want["lam"])), rtol=1e-9, atol=1e-12)


def test_matrix_free_matches_dense_within_tolerance(recorded):
    report = recorded.analyze(jacobian={"k": K, "n_samples": 256, "dense": False},
                              progress=False)
    table = report.jacobian
    assert "departure" not in table and "frac_complex" not in table  # exact-only columns
    assert "departure" in report.metadata["jacobian"]["absent_columns"]
    for layer in range(recorded.anatomy.n_layers):
        J, _ = _token_jacobian(recorded, layer)
        want = _oracle(J)
        row = table[table.layer == layer].iloc[0]
        assert row.converged and not row.dense
        assert row.top_eig_abs == pytest.approx(want["top_eig_abs"], rel=1e-8)
        for name in (f"frac_complex_top{K}", f"frac_negative_top{K}"):
            assert row[name] == want[name], name
        assert row[f"mean_abs_angle_top{K}"] == pytest.approx(want[f"mean_abs_angle_top{K}"],
                                                              rel=1e-6, nan_ok=True)
        for name in ("sym_energy", "commutator"):
            assert abs(row[name] - want[name]) < 4 * row[f"{name}_se"], name
        assert row[f"self_alignment_top{K}"] == pytest.approx(want[f"self_alignment_top{K}"],
                                                              abs=1e-6)


@pytest.fixture(scope="module")
def gpt2_recorded():
    model = make_model("gpt2")
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.randint(0, 100, (1, 6)))
    return probe


def test_bottleneck_and_reinit_match_dense_products(gpt2_recorded):
    recorded = gpt2_recorded
    report = recorded.analyze(jacobian={"k": K, "bottleneck_k": 8}, progress=False,
                              bottleneck=True, reinit=True)
    table = report.bottleneck
    assert set(table.variant) == {"trained", "symmetric", "schur", "init"}
    Js = [_token_jacobian(recorded, layer)[0] for layer in range(recorded.anatomy.n_layers)]
    P = np.eye(Js[0].shape[0])
    for depth, J in enumerate(Js, start=1):
        P = J @ P
        s = np.linalg.svd(P, compute_uv=False)
        row = table[(table.variant == "trained") & (table.depth == depth)].iloc[0]
        top = s[: int(row.n_singular)]
        p = top / top.sum()
        assert row.erank == pytest.approx(np.exp(-np.sum(p * np.log(p))), rel=1e-6)
        assert row.stable_rank == pytest.approx(np.sum(top ** 2) / top[0] ** 2, rel=1e-6)
    init = report.jacobian[report.jacobian.variant == "init"]
    trained = report.jacobian[report.jacobian.variant == "trained"]
    assert len(init) == len(trained) and not np.allclose(init.top_eig_abs, trained.top_eig_abs)
    assert report.propagation is not None and len(report.propagation) == len(Js)


def test_materialised_rows_equal_the_oracle_and_the_operators(recorded):
    # materialize=True: J formed from its columns, eigs / svds on the matrix (pairs checked
    # with fresh products), the same probes: the operator route's values, to tol
    common = {"k": K, "n_samples": 256, "dense": False}
    formed = recorded.analyze(jacobian={**common, "materialize": True}, progress=False)
    krylov = recorded.analyze(jacobian={**common, "materialize": False, "group_layers": False},
                              progress=False)
    a, b = formed.jacobian, krylov.jacobian
    d = recorded.anatomy.d_model
    assert a.converged.all() and (a.n_matvecs >= d).all()
    for layer in range(recorded.anatomy.n_layers):
        want = _oracle(_token_jacobian(recorded, layer)[0])
        row = a[a.layer == layer].iloc[0]
        assert row.top_eig_abs == pytest.approx(want["top_eig_abs"], rel=1e-8)
        assert row[f"frac_complex_top{K}"] == want[f"frac_complex_top{K}"]
        assert row[f"self_alignment_top{K}"] == pytest.approx(want[f"self_alignment_top{K}"],
                                                              abs=1e-6)
    for name in ("sym_energy", "sym_energy_se", "commutator", "commutator_se",
                 "departure_rel_lower", "departure_rel_lower_se"):
        np.testing.assert_allclose(a[name], b[name], rtol=1e-9, atol=1e-12, err_msg=name)
    said = formed.metadata["jacobian"]
    assert said["materialized"] is True and "jacobian.materialize=True" in said["materialized_why"]
    assert krylov.metadata["jacobian"]["materialized"] is False


def test_the_metadata_states_the_cost_rules_choice():
    from transformers import GPT2Config, GPT2Model

    from spectral_hooks.analysis.jacobian import SECTION_KRYLOV_MIN, resolve_materialize
    from spectral_hooks.linalg.materialize import COLUMN_COST

    # d = 512 on the CPU: an application costs FLOPs, 512 columns cost ~61 single ones
    model = GPT2Model(GPT2Config(n_layer=1, n_embd=512, n_head=4)).eval()
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.randint(0, 100, (1, 5)))
    report = probe.analyze(jacobian={"k": 2, "dense": False}, power=False, progress=False)
    said = report.metadata["jacobian"]
    assert said["computation"] == "matrix-free" and said["materialized"] is True
    assert "Chosen by the cost rule" in said["materialized_why"]
    assert bool(report.jacobian.converged.all()) and (report.jacobian.n_matvecs >= 512).all()
    small = make_model("gpt2")  # d = 32: an application costs dispatch, Krylov
    with sh.instrument(small) as probe, torch.no_grad():
        small(torch.randint(0, 100, (1, 5)))
    said = probe.analyze(jacobian={"k": 2, "dense": False}).metadata["jacobian"]
    assert said["materialized"] is False and "dispatch" in said["materialized_why"]
    edge = int(SECTION_KRYLOV_MIN / COLUMN_COST)  # where d columns cost the Krylov runs
    assert resolve_materialize(None, edge - 8, "cpu") and not resolve_materialize(
        None, edge + 8, "cpu")
    assert not resolve_materialize(None, 2048, "cuda") and resolve_materialize(True, 64, "cuda")
    with pytest.raises(OptionError, match="materialize"):
        sh.JacobianOptions(materialize=True, group_layers=True)


def test_jacobian_option_errors(recorded):
    with pytest.raises(ValueError, match="jacobian.k=40 .*below d_model=32"):
        recorded.analyze(jacobian={"k": 40}).jacobian
    with pytest.raises(TypeError, match="unknown jacobian option"):
        recorded.analyze(jacobian={"kk": 3})


def test_positions_all_skips_generate_decode_steps():
    model = make_model("gpt2", wrapper=True)
    ids = torch.randint(0, 100, (1, 4))
    with sh.instrument(model) as probe, torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3,
                       do_sample=False, pad_token_id=0)
    table = probe.analyze(jacobian={"k": 4, "positions": "all", "dense": True},
                          progress=False).jacobian
    assert sorted(set(table.position)) == [0, 1, 2, 3]


def test_samples_all_rows_and_summary_match_the_jacfwd_oracle():
    """jacobian={"samples": "all"}: rows for every batch row (each against torch.func.jacfwd of
    the recorded block, dense float64), and jacobian_summary = the numpy mean over samples x
    positions and the sd / se across the per-sample means."""
    model = make_model("gpt2", dtype=torch.float64)
    ids = torch.randint(0, 100, (3, 5), generator=torch.Generator().manual_seed(11))
    with sh.instrument(model) as probe, torch.no_grad():
        model(input_ids=ids)
    positions = (2, 4)
    report = probe.analyze(power=False, jacobian={"samples": "all", "positions": positions,
                                                   "k": 4, "dense": True, "ablations": ()})
    table, summary = report.jacobian, report.jacobian_summary
    assert sorted(set(table["sample"])) == [0, 1, 2] and len(table) == 3 * 2 * len(positions)
    oracle = {}
    for s in range(3):
        for layer in range(2):
            for p in positions:
                o = jacobian_metrics_oracle(token_jacobian(probe, layer, position=p, sample=s), 4)
                oracle[s, layer, p] = o
                row = table[(table["sample"] == s) & (table.layer == layer)
                            & (table.position == p)].iloc[0]
                for name in ("sym_energy", "departure_rel", "frac_complex"):
                    assert row[name] == pytest.approx(o[name], rel=1e-8, abs=1e-12)
    for layer in range(2):
        for name in ("sym_energy", "departure_rel", "frac_complex", "commutator"):
            per_sample = np.array([np.mean([oracle[s, layer, p][name] for p in positions])
                                   for s in range(3)])
            got = summary[(summary.layer == layer) & (summary.metric == name)].iloc[0]
            assert got["mean"] == pytest.approx(per_sample.mean(), rel=1e-8)
            assert got["sd_samples"] == pytest.approx(per_sample.std(ddof=1), rel=1e-6, abs=1e-12)
            assert got["se_samples"] == pytest.approx(per_sample.std(ddof=1) / np.sqrt(3),
                                                      rel=1e-6, abs=1e-12)
            assert got["n_samples"] == 3 and got["n_rows"] == 3 * len(positions)
    assert "sym_energy_se" not in set(summary.metric) and "jacobian_summary" not in \
        probe.analyze(power=False, jacobian={"k": 4}).sections
    with pytest.raises(OptionError, match="jacobian.samples"):
        probe.analyze(power=False, jacobian={"samples": [0, 7]})
    with pytest.raises(OptionError, match="jacobian.samples"):
        sh.AnalyzeOptions(jacobian={"samples": "some"})
