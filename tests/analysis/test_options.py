"""Options are frozen, keyword-only, validated on construction, and stored resolved."""

import dataclasses

import pytest
import torch

import spectral_hooks as sh
from spectral_hooks import AnalyzeOptions, JacobianOptions
from spectral_hooks.errors import OptionError, SpectralHooksError
from tests.tiny_models import make_model


def test_dict_and_dataclass_give_the_same_options():
    assert AnalyzeOptions.resolve(jacobian={"k": 8}) == AnalyzeOptions(
        jacobian=JacobianOptions(k=8))
    assert AnalyzeOptions.resolve(jacobian=True).jacobian == JacobianOptions()
    assert AnalyzeOptions.resolve(jacobian=False).jacobian is None


def test_options_are_frozen_and_keyword_only():
    options = JacobianOptions(k=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.k = 5
    with pytest.raises(TypeError):
        JacobianOptions(4)  # noqa


@pytest.mark.parametrize("bad, option", [
    (dict(k=0), "jacobian.k"), (dict(k=2.5), "jacobian.k"), (dict(k=True), "jacobian.k"),
    (dict(positions="first"), "jacobian.positions"), (dict(positions=[]), "jacobian.positions"),
    (dict(positions=[1.5]), "jacobian.positions"), (dict(dense="yes"), "jacobian.dense"),
    (dict(sample=-1), "jacobian.sample"), (dict(tol=0.0), "jacobian.tol"),
    (dict(tol=2), "jacobian.tol"), (dict(ablations=("cubic",)), "jacobian.ablations"),
    (dict(n_samples=0), "jacobian.n_samples"), (dict(seed=1.0), "jacobian.seed"),
    (dict(progress="no"), "jacobian.progress"),
])
def test_every_bad_jacobian_option_is_named(bad, option):
    with pytest.raises(OptionError) as info:
        JacobianOptions(**bad)
    message = str(info.value)
    assert message.startswith(f"{option}=") and "expected" in message
    assert isinstance(info.value, ValueError) and isinstance(info.value, SpectralHooksError)


def test_progress_is_one_switch_and_jacobian_progress_forwards_with_a_warning():
    """``analyze(progress=...)`` is the switch; ``jacobian.progress`` (deprecated) warns at the
    caller's line and is moved there for this release (an explicit ``progress`` wins)."""
    with pytest.warns(DeprecationWarning, match=r"analyze\(progress=\.\.\.\)") as caught:
        options = AnalyzeOptions.resolve(jacobian={"k": 4, "progress": False})
    assert caught[0].filename == __file__
    assert options.progress is False and options.show_progress is False
    assert options.jacobian is not None and options.jacobian.progress is None
    assert options == AnalyzeOptions.resolve(jacobian={"k": 4}, progress=False)
    assert "progress" not in options.jacobian.to_dict()
    with pytest.warns(DeprecationWarning):
        assert AnalyzeOptions.resolve(jacobian={"progress": False}, progress=True).progress
    with pytest.warns(DeprecationWarning):
        JacobianOptions(progress=True)


@pytest.mark.parametrize("bad, option", [
    (dict(iterate="F+I"), "iterate"), (dict(power=1), "power"), (dict(reinit="yes"), "reinit"),
    (dict(jacobian=5), "jacobian"),
])
def test_every_bad_analyze_option_is_named(bad, option):
    with pytest.raises(OptionError, match=f"^{option}="):
        AnalyzeOptions(**bad)


def test_unknown_names_are_type_errors_listing_the_valid_ones():
    with pytest.raises(TypeError, match=r"unknown jacobian option\(s\) \['kk'\].*'k'"):
        AnalyzeOptions.resolve(jacobian={"kk": 3})
    with pytest.raises(TypeError, match=r"unknown analyze\(\) option\(s\) \['colour'\]"):
        AnalyzeOptions.resolve(colour="red")


def test_report_metadata_stores_the_resolved_options():
    model = make_model("gpt2")
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.randint(0, 100, (1, 5)))
    report = probe.analyze(jacobian={"k": 4, "positions": [1, 2]}, iterate="I+F")
    options = report.metadata["options"]
    assert options["iterate"] == "I+F" and options["jacobian"]["k"] == 4
    assert options["jacobian"]["positions"] == [1, 2] and options["jacobian"]["tol"] is None
    assert options["jacobian"]["dense"] is None  # automatic: the computation used is below
    assert report.metadata["jacobian"]["tol"] == 1e-8  # float64 operator
    assert report.metadata["jacobian"]["computation"] == "exact"  # d = 32 <= the threshold
    assert report.metadata["fallbacks"] == [] and report.metadata["timings_s"] == {}
    again = probe.analyze(AnalyzeOptions(jacobian=JacobianOptions(k=4, positions=[1, 2]),
                                         iterate="I+F"))
    assert again.metadata["options"] == options


def test_positions_out_of_range_or_on_padding_are_refused():
    model = make_model("gpt2")
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.randint(0, 100, (1, 5)), attention_mask=mask)
    for positions in ([4], [9], [-5]):
        with pytest.raises(OptionError, match="jacobian.positions"):
            probe.analyze(jacobian={"k": 2, "positions": positions}).jacobian
    with pytest.raises(OptionError, match="jacobian.sample"):
        probe.analyze(jacobian={"k": 2, "positions": "all", "sample": 3}).jacobian


def test_a_position_list_on_a_stats_recording_is_refused():
    model = make_model("gpt2")
    with sh.instrument(model, store="stats") as probe, torch.no_grad():
        model(torch.randint(0, 100, (1, 5)))
    with pytest.raises(ValueError, match="stats"):
        probe.analyze(power=False, jacobian={"k": 2, "positions": [1]}).jacobian


def test_jacobian_spectra_survive_power_false():
    model = make_model("gpt2")
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.randint(0, 100, (1, 5)))
    report = probe.analyze(power=False, jacobian={"k": 3, "dense": False})
    assert "power" not in report.sections
    assert set(report.spectra.source) == {"jacobian"}
    assert len(report.spectra) == report.jacobian.n_eigenvalues.sum()  # 3, or 4 for a pair
    assert set(report.jacobian.n_eigenvalues) <= {3, 4}
    exact = probe.analyze(power=False, jacobian={"k": 3})  # automatic: exact, all d of them
    assert len(exact.spectra) == 2 * model.config.n_embd


def test_dense_none_is_a_fixed_width_threshold_documented_in_metrics_md():
    from pathlib import Path

    from spectral_hooks.analysis.jacobian import DENSE_AUTO_MAX_D, resolve_dense

    assert resolve_dense(None, DENSE_AUTO_MAX_D) and not resolve_dense(None, DENSE_AUTO_MAX_D + 1)
    assert resolve_dense(True, 10 ** 5) and not resolve_dense(False, 8)
    docs = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    assert f"d_model <= {DENSE_AUTO_MAX_D}" in docs and "benchmarks/dense_threshold.py" in docs
    with pytest.raises(OptionError, match="jacobian.dense"):
        JacobianOptions(dense="auto")
