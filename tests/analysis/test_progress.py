"""Progress that tells the truth: one display over the whole analysis (sections x layers),
shown when a section starts, a plain line per layer without a terminal, nothing with
progress=False or TQDM_DISABLE=1, and no warning printed per Jacobian."""

import io
import sys
import warnings

import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.analysis import progress as progress_module
from spectral_hooks.analysis.progress import Progress
from tests.tiny_models import make_model


@pytest.fixture(scope="module")
def probe():
    model = make_model("gpt2", dtype=torch.float32)
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.tensor([[1, 2, 3, 4, 5]]))
    return probe


def _read_all(report) -> None:
    for name in report.sections:
        report[name]


def test_plain_lines_per_layer_without_a_terminal(probe, capsys, monkeypatch):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    report = probe.analyze(jacobian={"k": 2, "dense": False})
    _read_all(report)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("spectral_hooks:")]
    stages = [ln.split(":")[1].strip() for ln in lines]
    assert stages[stages.index("jacobian Jacobian spectra (trained) layer 0") + 1] == \
        "jacobian Jacobian spectra (trained) layer 1"
    # a section without a per-layer loop says when it is done; the last line reads 8/8
    assert {"power done", "spectra done", "trends done"} <= set(stages)
    assert "/8 units" in lines[0]  # power, spectra, jacobian, trends x 2 layers
    assert lines[-1].split(": ")[-1].startswith("8/8 units")


def test_each_layer_of_a_stage_is_shown_once(probe, capsys, monkeypatch):
    # the bottleneck's variants (trained, symmetric, schur) share the dense chain: its layers
    # are computed and shown once per model, the trained one's and the re-initialised one's
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    report = probe.analyze(power=False, jacobian=False, bottleneck=True, reinit=True)
    report.bottleneck
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("spectral_hooks:")]
    assert [ln.split(":")[1].strip() for ln in lines] == [
        f"bottleneck dense Jacobians ({model}) layer {layer}"
        for model in ("trained", "init") for layer in (0, 1)]
    done = [int(ln.split(": ")[-1].split("/")[0]) for ln in lines]
    assert done == list(range(done[0], done[0] + 4))


@pytest.mark.parametrize("how", ["option", "jacobian_option", "env"])
def test_switched_off(probe, capsys, monkeypatch, how):
    options = {"jacobian": {"k": 2, "dense": False}}
    if how == "option":
        options["progress"] = False
    elif how == "jacobian_option":
        options["jacobian"]["progress"] = False
    else:
        monkeypatch.setenv("TQDM_DISABLE", "1")
    _read_all(probe.analyze(**options))
    assert capsys.readouterr().err == ""


def test_one_bar_from_the_start_and_no_stale_bar(monkeypatch):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setattr(progress_module, "_is_terminal", lambda: True)
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    p = Progress(["power", "jacobian"], n_layers=3, enabled=None, doubled=["jacobian"])
    assert p.total == 9
    with p.section("jacobian"):
        assert "spectral analysis: jacobian" in err.getvalue()  # drawn before any work
        assert "0/9" in err.getvalue()
        for _ in progress_module.layers([(0, 4), (1, 4), (2, 4)], "trained"):
            pass
        assert p.done == 3
    assert p.done == 6 and p._bar is None  # the section's units complete; the bar is closed
    with p.section("power"):
        with p.section("jacobian"):  # nested: counted in the outer section only
            pass
    assert p.done == p.total




def test_no_warning_per_jacobian():
    for family in ("gpt2", "llama"):
        model = make_model(family, dtype=torch.float32)
        with sh.instrument(model) as probe, torch.no_grad():
            model(torch.tensor([[1, 2, 3, 4]]))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _read_all(probe.analyze(power=False, progress=False,
                                    jacobian={"k": 2, "dense": False, "positions": "all"}))
        shown = [w for w in caught if not issubclass(w.category, DeprecationWarning)]
        assert not shown, [(w.category.__name__, str(w.message)[:80]) for w in shown]
