"""Progress that tells the truth: per-layer lines while a section works (read from their
timestamps during a slow section), units weighted by expected cost and shared work counted
once whichever table is read first, each line with the section's own elapsed time and an
estimate of what is left; a tqdm bar on a terminal, plain lines in logs; nothing with
progress=False or TQDM_DISABLE=1; no warning printed per Jacobian."""

import io
import re
import sys
import time
import types
import warnings
from typing import Any, cast

import pandas as pd
import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.analysis import jacobian as jacobian_module
from spectral_hooks.analysis import progress as progress_module
from spectral_hooks.analysis.options import AnalyzeOptions, JacobianOptions
from spectral_hooks.analysis.progress import Progress, Work
from spectral_hooks.analysis.progress_plan import progress_plan
from tests.tiny_models import make_model

SLEEP = 0.3  # seconds each layer of the slow section takes
LINE = re.compile(r"^spectral_hooks: (?P<section>\w+): (?P<what>.+?) \((?P<i>\d+)/(?P<n>\d+)\): "
                  r"(?P<elapsed>[\d.]+) s, (?P<left>about [\d.]+ s left|nearly done) "
                  r"\((?P<percent>\d+)% of the analysis\)$")


class TimedStderr(io.StringIO):
    """stderr that notes when each line was written."""

    def __init__(self) -> None:
        super().__init__()
        self.stamped: list[tuple[float, str]] = []

    def write(self, text: str) -> int:
        now = time.perf_counter()
        self.stamped += [(now, line) for line in text.splitlines() if line]
        return super().write(text)

    def isatty(self) -> bool:
        return False


@pytest.fixture()
def stderr(monkeypatch):
    """A TimedStderr that the test's progress lines go to (set on the progress module's view
    of sys: pytest's capture sets sys.stderr again when the test starts)."""
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    err = TimedStderr()
    monkeypatch.setattr(progress_module, "sys", types.SimpleNamespace(stderr=err))
    return err


def _probe(n_layer: int = 4, d: int = 32):
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    model = GPT2Model(GPT2Config(n_layer=n_layer, n_embd=d, n_head=4)).eval()
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.arange(12).reshape(2, 6))
    return probe


@pytest.fixture(scope="module")
def probe():
    model = make_model("gpt2", dtype=torch.float32)
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.tensor([[1, 2, 3, 4, 5]]))
    return probe


def _analyze(probe, **options: Any) -> sh.Report:
    report = probe.analyze(**options)
    assert isinstance(report, sh.Report)
    return report


def _slow_jacobian_metrics(monkeypatch) -> None:
    """Each layer's Jacobian metrics take SLEEP seconds more (the real computation runs)."""
    real = jacobian_module.jacobian_metrics

    def slow(*args, **kwargs):
        time.sleep(SLEEP)
        return real(*args, **kwargs)
    monkeypatch.setattr(jacobian_module, "jacobian_metrics", slow)


def _layer_lines(err: TimedStderr, section: str | None) -> list[tuple[float, re.Match]]:
    """The layer lines of ``section`` (of any section: None), with when they were written."""
    out = []
    for stamp, line in err.stamped:
        match = LINE.match(line)
        if match and section in (None, match["section"]):
            out.append((stamp, match))
    return out


@pytest.mark.parametrize("read", ["jacobian", "spectra", "save"])
def test_lines_arrive_during_a_slow_section(read, stderr, monkeypatch, tmp_path):
    # whichever table is read first (or save() reading them all), each layer's line is written
    # when that layer is done: the lines are SLEEP apart, not printed together at the end
    _slow_jacobian_metrics(monkeypatch)
    probe = _probe(n_layer=4)
    report = _analyze(probe, power=False, jacobian={"k": 2, "group_layers": False})
    start = time.perf_counter()
    if read == "save":
        report.save(tmp_path / "rep")
    else:
        report[read]
    end = time.perf_counter()
    section = None if read == "save" else read  # save() reads spectra first, as it happens
    lines = [(stamp, m) for stamp, m in _layer_lines(stderr, section)
             if m["what"].startswith("Jacobian spectra (trained) layer")]
    assert [m["what"] for _, m in lines] == [f"Jacobian spectra (trained) layer {i}"
                                            for i in range(4)], stderr.getvalue()
    stamps = [stamp for stamp, _ in lines]
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    assert min(gaps) > 0.8 * SLEEP, gaps  # one line per finished layer, as it finishes
    assert stamps[0] - start > 0.8 * SLEEP and end - stamps[0] > 2.5 * SLEEP
    for stamp, m in lines:  # the section's own elapsed time, as printed, is the true one
        assert float(m["elapsed"]) == pytest.approx(stamp - start, abs=0.15 + 0.1 * SLEEP)
    assert [int(m["i"]) for _, m in lines] == [1, 2, 3, 4] and lines[0][1]["n"] == "4"
    assert all("left" in m["left"] or m["left"] == "nearly done" for _, m in lines)


def test_estimate_of_time_left(stderr, monkeypatch):
    _slow_jacobian_metrics(monkeypatch)
    probe = _probe(n_layer=4)
    _analyze(probe, power=False, jacobian={"k": 2, "group_layers": False}).jacobian
    lines = _layer_lines(stderr, "jacobian")
    left = [float(m["left"].split()[1]) for _, m in lines[:3]]
    per_layer = (lines[3][0] - lines[0][0]) / 3  # what a layer took, from the lines' stamps
    # after layer i of 4, 4 - i layers are left: the estimate says about that much (the first
    # one also carries the section's setup)
    for i, value in enumerate(left[1:], start=2):
        assert value == pytest.approx((4 - i) * per_layer, rel=0.5), (i, left, per_layer)
    assert left == sorted(left, reverse=True)
    assert lines[3][1]["left"] == "nearly done"


def test_section_time_is_its_own(stderr, monkeypatch):
    # a section read after a slow one prints its own time, not the time since analysis began
    _slow_jacobian_metrics(monkeypatch)
    probe = _probe(n_layer=4)
    report = _analyze(probe, jacobian={"k": 2, "group_layers": False})
    report.jacobian
    report.power
    power = _layer_lines(stderr, "power")
    assert [m["what"] for _, m in power] == [f"F spectra layer {i}" for i in range(4)]
    assert all(float(m["elapsed"]) < 0.8 * 4 * SLEEP for _, m in power)
    done = [line for _, line in stderr.stamped if line.startswith("spectral_hooks: power done")]
    assert len(done) == 1 and float(done[0].split(" in ")[1].split()[0]) < 4 * SLEEP


def test_shared_work_counted_once_whichever_table_is_read_first(stderr):
    # spectra and power share F's eigen-decompositions: the one read first shows them per
    # layer; the other then has nothing to show and the analysis is complete
    for first, second in (("spectra", "power"), ("power", "spectra")):
        stderr.stamped.clear()
        report = _analyze(_probe(n_layer=3, d=256))
        report[first]
        first_lines = _layer_lines(stderr, first)
        assert [m["what"] for _, m in first_lines] == [f"F spectra layer {i}" for i in range(3)]
        assert int(first_lines[-1][1]["percent"]) >= 90  # the eigs are nearly all the cost
        report[second]
        assert _layer_lines(stderr, second) == []
        assert stderr.stamped[-1][1].endswith("(100% of the analysis)")


def test_values_do_not_depend_on_the_display():
    # the power view computes F's spectra one layer at a time when the display is on: the
    # tables are the same as with it off
    on = _analyze(_probe(n_layer=3, d=64), progress=True)
    off = _analyze(_probe(n_layer=3, d=64), progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pd.testing.assert_frame_equal(on["power"], off["power"])
        pd.testing.assert_frame_equal(on["spectra"], off["spectra"])


def test_spectra_by_layer_computes_each_spectrum_once(monkeypatch):
    # the layer-by-layer spectra go into the cache power_table and spectra_table read: with
    # the display on, each layer's spectrum is still computed once for both tables
    from spectral_hooks.metrics import spectrum as spectrum_module

    calls = []
    real = spectrum_module.layer_spectrum

    def counted(F, *args, **kwargs):
        calls.append(kwargs.get("layer"))
        return real(F, *args, **kwargs)
    monkeypatch.setattr(spectrum_module, "layer_spectrum", counted)
    report = _analyze(_probe(n_layer=3, d=64), progress=True)
    report.power
    report.spectra
    assert sorted(calls) == [0, 1, 2]


def test_units_weighted_by_cost():
    p = Progress({"power": ["power", "F"], "spectra": ["spectra", "F"]},
                 {"F": Work(4, 100.0), "power": Work(4, 1.0), "spectra": Work(1, 0.1)},
                 enabled=False)
    with p.section("power"):
        for _ in p.layers(range(4), "F spectra", work="F"):
            pass
        assert p.fraction == pytest.approx(400 / 404.1)
    with p.section("spectra"):
        pass
    assert p.fraction == 1.0 and p.done == pytest.approx(p.total)


def test_plan_weights_work_by_its_cost():
    # default analyze(): F's eigs are nearly all the work; spectra's own table next to nothing
    subject = cast(Any, _probe(n_layer=3, d=256)).subject
    sections, pools = progress_plan(subject, AnalyzeOptions(), ["power", "spectra"])
    total = sum(w.units * w.cost for w in pools.values())
    assert pools["F"].units * pools["F"].cost > 0.9 * total
    assert pools["spectra"].units * pools["spectra"].cost < 0.01 * total
    # with the Jacobian view, a Jacobian costs more than F's eig at the same width
    sections, pools = progress_plan(subject, AnalyzeOptions(jacobian=JacobianOptions(k=4), reinit=True),
                                    ["power", "spectra", "jacobian", "trends"])
    assert pools["jacobian:trained"].cost > pools["F"].cost
    assert sections["jacobian"] == ["jacobian", "jacobian:trained", "jacobian:init"]
    assert sections["trends"] == ["trends", "jacobian:trained", "F", "power"]


def test_cached_repeats_show_nothing(stderr):
    p = Progress({"a": ["a", "J"], "b": ["b", "J"]}, {"J": Work(2, 1.0)}, enabled=True)
    with p.section("a"):
        for _ in p.layers([0, 1], "J", work="J"):
            pass
    with p.section("b"):
        for _ in p.layers([0, 1], "J", work="J"):  # read from a cache: already counted
            pass
    lines = [line for _, line in stderr.stamped]
    assert [line.split(": ")[2] for line in lines if "layer" in line] == \
        ["J layer 0 (1/2)", "J layer 1 (2/2)"]
    assert lines[-1].startswith("spectral_hooks: b done in")


def test_each_layer_of_a_stage_is_shown_once(probe, stderr):
    # the bottleneck's variants (trained, symmetric, schur) share the dense chain: its layers
    # are computed and shown once per model, the trained one's and the re-initialised one's
    report = _analyze(probe, power=False, jacobian=False, bottleneck=True, reinit=True)
    report.bottleneck
    whats = [m["what"] for _, m in _layer_lines(stderr, "bottleneck")]
    dense = [w for w in whats if w.startswith("dense Jacobians")]
    assert dense == [f"dense Jacobians ({model}) layer {layer}"
                     for model in ("trained", "init") for layer in (0, 1)]
    assert [w for w in whats if w.startswith("variant")] == [
        "variant trained", "variant symmetric", "variant schur", "variant init"]


def test_topology_reports_per_layer(probe, stderr):
    _analyze(probe, power=False, jacobian={"dense": False, "k": 2}, topology=True).topology
    whats = [m["what"] for _, m in _layer_lines(stderr, "topology")]
    assert [w for w in whats if w.startswith("amplification")] == [
        "amplification (trained) layer 0", "amplification (trained) layer 1"]


def test_trends_reports_the_work_it_does(probe, stderr):
    _analyze(_probe(n_layer=2), jacobian={"k": 2}).trends
    whats = [m["what"] for _, m in _layer_lines(stderr, "trends")]
    assert whats[:2] == ["Jacobian spectra (trained) layer 0",
                         "Jacobian spectra (trained) layer 1"]
    assert "F spectra layer 0" in whats


@pytest.mark.parametrize("how", ["option", "jacobian_option", "env"])
def test_switched_off(probe, capsys, monkeypatch, how):
    options: dict[str, Any] = {"jacobian": {"k": 2, "dense": False}}
    if how == "option":
        options["progress"] = False
    elif how == "jacobian_option":
        options["jacobian"]["progress"] = False
    else:
        monkeypatch.setenv("TQDM_DISABLE", "1")
    report = _analyze(probe, **options)
    for name in report.sections:
        report[name]
    assert capsys.readouterr().err == ""


def test_a_bar_on_a_terminal_and_no_stale_bar(monkeypatch):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setattr(progress_module, "_is_terminal", lambda: True)
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    p = Progress({"power": ["power", "F"], "jacobian": ["jacobian", "J"]},
                 {"F": Work(3, 1.0), "J": Work(3, 3.0)}, enabled=None)
    with p.section("jacobian"):
        assert "spectral analysis: jacobian" in err.getvalue()  # drawn before any work
        assert "0%" in err.getvalue()
        for _ in progress_module.layers([(0, 4), (1, 4), (2, 4)], "Jacobian", work="J"):
            time.sleep(0.01)
        assert p.steps["J"] == 3
        shown = err.getvalue()
        assert "Jacobian layer 2 (3/3)" in shown and "s, " in shown  # postfix: time, estimate
        assert "spectral_hooks:" not in shown  # a bar, not log lines
    assert p._bar is None  # closed with its section
    with p.section("power"):
        with p.section("jacobian"):  # nested: counted in the outer section only
            pass
    assert p.fraction == 1.0


def test_no_warning_per_jacobian():
    for family in ("gpt2", "llama"):
        model = make_model(family, dtype=torch.float32)
        with sh.instrument(model) as probe, torch.no_grad():
            model(torch.tensor([[1, 2, 3, 4]]))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report = _analyze(probe, power=False, progress=False,
                                   jacobian={"k": 2, "dense": False, "positions": "all"})
            for name in report.sections:
                report[name]
        shown = [w for w in caught if not issubclass(w.category, DeprecationWarning)]
        assert not shown, [(w.category.__name__, str(w.message)[:80]) for w in shown]
