"""Every public entry point checks its arguments: one error from spectral_hooks itself (never a
traceback from deep inside torch) naming the argument, the bad value and what is valid.

One row per (entry point, bad argument): the exception type (OptionError / OptionTypeError /
LayerIndexError / ... from spectral_hooks.errors, all ValueError or TypeError subclasses) and the
text ``argument=value`` the message must contain.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.errors import (
    LayerIndexError,
    OptionError,
    OptionIndexError,
    OptionTypeError,
    RecordingKeyError,
    SpectralHooksError,
    UnknownNameError,
    UnknownOptionError,
)
from spectral_hooks.hooks.taps import count_hook_points as count_hooks
from spectral_hooks.integrations.hf_trainer import SpectralCallback
from spectral_hooks.integrations.loggers import CSVLogger, JSONLLogger
from tests.tiny_models import make_model

PACKAGE = str(Path(sh.__file__).parent)
META = torch.device("meta")


@pytest.fixture(scope="module")
def c(tmp_path_factory, one_torch_thread):
    model = make_model("gpt2", dtype=torch.float64)
    ids = torch.randint(1, 100, (2, 5), generator=torch.Generator().manual_seed(0))
    probe = sh.instrument(model)
    with torch.no_grad():
        model(ids)
    probe.remove()
    narrow = sh.instrument(model, capture="resid_post")
    with torch.no_grad():
        model(ids)
    narrow.remove()
    report = probe.analyze(power=True)
    tmp = tmp_path_factory.mktemp("argval")
    A = torch.randn(12, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    yield SimpleNamespace(model=model, probe=probe, rec=probe.recording, report=report, A=A,
                          narrow=narrow.recording,
                          tmp=tmp, csv=CSVLogger(tmp / "log.csv"),
                          jsonl=JSONLLogger(tmp / "log.jsonl"))


def _remove_with(model, **bad):
    edit = sh.steer(model, torch.ones(32), alpha=0.5)
    try:
        edit.remove(**bad)
    finally:
        edit.remove()


def row(entry, bad, call, exc, *shows):
    return pytest.param(call, exc, shows, id=f"{entry}:{bad}")


ROWS = [
    # instrument / Probe
    row("instrument", "model", lambda c: sh.instrument("gpt2"), OptionTypeError, "model='gpt2'"),
    row("instrument", "layers out of range", lambda c: sh.instrument(c.model, layers=[0, 5]),
        LayerIndexError, "layers=5"),
    row("instrument", "layers type", lambda c: sh.instrument(c.model, layers=["0"]),
        OptionError, "layers=['0']"),
    row("instrument", "layers empty", lambda c: sh.instrument(c.model, layers=[]), OptionError,
        "layers=[]"),
    row("instrument", "capture", lambda c: sh.instrument(c.model, capture=["resid"]),
        OptionError, "capture=['resid']"),
    row("instrument", "store", lambda c: sh.instrument(c.model, store="disk"), OptionError,
        "store='disk'"),
    row("instrument", "dtype int", lambda c: sh.instrument(c.model, dtype=torch.int64),
        OptionError, "dtype=torch.int64"),
    row("instrument", "dtype str", lambda c: sh.instrument(c.model, dtype="float32"),
        OptionError, "dtype='float32'"),
    row("Probe.clone_on", "model", lambda c: c.probe.clone_on(None), OptionTypeError,
        "model=None"),
    # Probe.analyze and its options
    row("analyze", "unknown keyword", lambda c: c.probe.analyze(jacobain=True),
        UnknownOptionError, "['jacobain']"),
    row("analyze", "options", lambda c: c.probe.analyze("power"), OptionError,
        "options='power'"),
    row("analyze", "iterate", lambda c: c.probe.analyze(iterate="F+I"), OptionError,
        "iterate='F+I'"),
    row("analyze", "power", lambda c: c.probe.analyze(power="yes"), OptionError, "power='yes'"),
    row("analyze", "jacobian", lambda c: c.probe.analyze(jacobian=8), OptionError,
        "jacobian=8"),
    row("analyze", "jacobian.k 0", lambda c: c.probe.analyze(jacobian={"k": 0}), OptionError,
        "jacobian.k=0"),
    row("analyze", "jacobian.k >= d", lambda c: c.probe.analyze(jacobian={"k": 32}),
        OptionError, "jacobian.k=32"),
    row("analyze", "jacobian.positions", lambda c: c.probe.analyze(
        jacobian={"positions": "first"}), OptionError, "jacobian.positions='first'"),
    row("analyze", "jacobian.positions rows", lambda c: c.probe.analyze(
        jacobian={"positions": [9]}).jacobian, OptionError, "jacobian.positions=[9]"),
    row("analyze", "jacobian.sample", lambda c: c.probe.analyze(jacobian={"sample": 7}),
        OptionError, "jacobian.sample=7"),
    row("analyze", "jacobian.tol", lambda c: c.probe.analyze(jacobian={"tol": 2.0}),
        OptionError, "jacobian.tol=2.0"),
    row("analyze", "jacobian.seed", lambda c: c.probe.analyze(jacobian={"seed": "0"}),
        OptionError, "jacobian.seed='0'"),
    row("analyze", "jacobian.ablations", lambda c: c.probe.analyze(
        jacobian={"ablations": ["lowrank"]}), OptionError, "jacobian.ablations=['lowrank']"),
    row("analyze", "jacobian option name", lambda c: c.probe.analyze(jacobian={"kk": 2}),
        UnknownOptionError, "['kk']"),
    # Probe.jacobian / jacobian_product / dense_jacobian
    row("Probe.jacobian", "layer out of range", lambda c: c.probe.jacobian(2), LayerIndexError,
        "layer=2"),
    row("Probe.jacobian", "layer type", lambda c: c.probe.jacobian("1"), OptionTypeError,
        "layer='1'"),
    row("Probe.jacobian", "position", lambda c: c.probe.jacobian(0, position=9), OptionError,
        "position=9"),
    row("Probe.jacobian", "sample", lambda c: c.probe.jacobian(0, sample=2), OptionIndexError,
        "sample=2"),
    row("Probe.jacobian", "kind", lambda c: c.probe.jacobian(0, kind="matrix"), OptionError,
        "kind='matrix'"),
    row("Probe.jacobian", "dtype", lambda c: c.probe.jacobian(0, dtype=torch.int32),
        OptionError, "dtype=torch.int32"),
    row("Probe.jacobian", "method", lambda c: c.probe.jacobian(0, method="exact"), OptionError,
        "method='exact'"),
    row("Probe.jacobian_product", "first > last", lambda c: c.probe.jacobian_product(1, 0),
        OptionError, "first=1"),
    row("Probe.dense_jacobian", "layer", lambda c: c.probe.dense_jacobian(-3), LayerIndexError,
        "layer=-3"),
    # Recording
    row("Recording.tensor", "capture", lambda c: c.rec.tensor("resid_mid", 0), UnknownNameError,
        "capture='resid_mid'"),
    row("Recording.tensor", "layer", lambda c: c.rec.tensor("resid_post", 2), LayerIndexError,
        "layer=2"),
    row("Recording.resid_post[]", "layer type", lambda c: c.rec.resid_post[1.0],
        OptionTypeError, "layer=1.0"),
    row("Recording.tokens", "capture", lambda c: c.rec.tokens(3, 0), OptionError, "capture=3"),
    row("Recording.stats", "layer", lambda c: c.rec.stats("resid_pre", -3), LayerIndexError,
        "layer=-3"),
    row("Recording.block_input", "sample", lambda c: c.rec.block_input(0, sample=2),
        OptionIndexError, "sample=2"),
    row("Recording.tensor", "capture not recorded", lambda c: c.narrow.tensor("attn_out", 0), RecordingKeyError,
        "capture='attn_out'"),
    row("Recording[]", "name", lambda c: c.rec["blocks.0.hook_mlp_out"], UnknownNameError,
        "name='blocks.0.hook_mlp_out'"),
    # Report
    row("Report.save", "format", lambda c: c.report.save(c.tmp / "r", format="xlsx"),
        OptionError, "format='xlsx'"),
    row("Report.load", "verify", lambda c: sh.Report.load(c.tmp, verify="no"), OptionError,
        "verify='no'"),
    row("Report.load", "directory", lambda c: sh.Report.load(c.tmp / "missing"),
        FileNotFoundError, "missing"),
    row("Report.compare", "other", lambda c: c.report.compare("before"), OptionTypeError,
        "other='before'"),
    row("Report.plot", "name", lambda c: c.report.plot("spectrum3d"), UnknownNameError,
        "name='spectrum3d'"),
    row("Report.schema", "name", lambda c: c.report.schema("powr"), UnknownNameError,
        "name='powr'"),
    # steer
    row("steer", "direction shape", lambda c: sh.steer(c.model, torch.ones(5)), OptionError,
        "direction="),
    row("steer", "direction type", lambda c: sh.steer(c.model, "up"), OptionTypeError,
        "direction='up'"),
    row("steer", "direction non-finite", lambda c: sh.steer(
        c.model, torch.full((32,), math.nan)), OptionError, "direction="),
    row("steer", "direction device", lambda c: sh.steer(
        c.model, torch.ones(32, device=META)), OptionError, "direction=", "meta"),
    row("steer", "layer", lambda c: sh.steer(c.model, torch.ones(32), layer=4), LayerIndexError,
        "layer=4"),
    row("steer", "gap", lambda c: sh.steer(c.model, torch.ones(32), gap=1.5), OptionError,
        "gap=1.5"),
    row("steer", "alpha", lambda c: sh.steer(c.model, torch.ones(32), alpha=-1.0),
        OptionError, "alpha=-1.0"),
    # layer_matrices, anatomy
    row("layer_matrices", "dtype", lambda c: sh.layer_matrices(c.model, dtype=torch.int64),
        OptionError, "dtype=torch.int64"),
    row("layer_matrices", "fold_norm", lambda c: sh.layer_matrices(c.model, fold_norm="yes"),
        OptionError, "fold_norm='yes'"),
    row("layer_biases", "model", lambda c: sh.layer_biases([1, 2]), OptionTypeError,
        "model=[1, 2]"),
    row("anatomy_of", "model", lambda c: sh.anatomy_of(3), OptionTypeError, "model=3"),
    row("register_anatomy", "builder", lambda c: sh.register_anatomy("mine", "builder"),
        OptionTypeError, "builder='builder'"),
    # linalg
    row("eigs", "op", lambda c: sh.eigs([[1.0, 2.0], [3.0, 4.0]], 1), OptionTypeError, "op="),
    row("eigs", "k", lambda c: sh.eigs(c.A, 0), OptionError, "k=0"),
    row("eigs", "k type", lambda c: sh.eigs(c.A, 2.0), OptionTypeError, "k=2.0"),
    row("eigs", "which", lambda c: sh.eigs(c.A, 2, which="LA"), OptionError, "which='LA'"),
    row("eigs", "tol", lambda c: sh.eigs(c.A, 2, tol=-1e-3), OptionError, "tol=-0.001"),
    row("eigs", "non-square", lambda c: sh.eigs(c.A[:, :10], 2), OptionError, "op="),
    row("eigs", "int tensor", lambda c: sh.eigs(torch.ones(12, 12, dtype=torch.int64), 2),
        OptionError, "op=", "torch.int64"),
    row("eigs", "v0 shape", lambda c: sh.eigs(c.A, 2, v0=torch.ones(5)), OptionError, "v0="),
    row("eigs", "v0 device", lambda c: sh.eigs(c.A, 2, v0=torch.ones(12, device=META)),
        OptionError, "v0=", "meta"),
    row("eigs", "ncv", lambda c: sh.eigs(c.A, 2, ncv=3), OptionError, "ncv=3"),
    row("eigs", "seed", lambda c: sh.eigs(c.A, 2, seed="s"), OptionTypeError, "seed='s'"),
    # found by fuzzing (bare TypeErrors / RuntimeErrors from inside, or silently accepted)
    row("eigs", "ncv float", lambda c: sh.eigs(c.A, 2, ncv=4.0), OptionTypeError, "ncv=4.0"),
    row("eigs", "tol str", lambda c: sh.eigs(c.A, 2, tol="1e-3"), OptionTypeError, "tol='1e-3'"),
    row("eigs", "tol None", lambda c: sh.eigs(c.A, 2, tol=None), OptionTypeError, "tol=None"),
    row("eigs", "v0 NaN", lambda c: sh.eigs(c.A, 2, v0=torch.full((12,), float("nan"))),
        OptionError, "NaN or Inf"),
    row("eigs", "v0 Inf", lambda c: sh.eigs(c.A, 2, v0=torch.full((12,), float("inf"))),
        OptionError, "NaN or Inf"),
    row("eigs", "v0 batch", lambda c: sh.eigs(torch.stack([c.A] * 3), 2, v0=torch.ones(2, 12)),
        OptionError, "broadcasts to the batch"),
    row("eigs", "seed range", lambda c: sh.eigs(c.A, 2, seed=2 ** 70), OptionError, "seed="),
    row("svds", "seed range", lambda c: sh.svds(c.A, 2, seed=2 ** 70), OptionError, "seed="),
    row("svds", "tol str", lambda c: sh.svds(c.A, 2, tol="1e-3"), OptionTypeError, "tol='1e-3'"),
    row("svds", "max_restarts", lambda c: sh.svds(c.A, 2, max_restarts=-1), OptionError,
        "max_restarts=-1"),
    row("svds", "max_restarts float", lambda c: sh.svds(c.A, 2, max_restarts=1.5),
        OptionTypeError, "max_restarts=1.5"),
    row("svds", "k", lambda c: sh.svds(c.A, 13), OptionError, "k=13"),
    row("svds", "method", lambda c: sh.svds(c.A, 2, method="qr"), OptionError,
        "method='qr'"),
    row("svds", "n_iter", lambda c: sh.svds(c.A, 2, method="randomized", n_iter=-1),
        OptionError, "n_iter=-1"),
    row("linalg.hutchinson_trace", "n_samples", lambda c: sh.linalg.hutchinson_trace(
        c.A, n_samples=0), OptionError, "n_samples=0"),
    row("linalg.effective_rank", "s", lambda c: sh.linalg.effective_rank("flat"),
        OptionTypeError, "s='flat'"),
    row("linalg.aslinearoperator", "obj", lambda c: sh.linalg.aslinearoperator("A"),
        OptionTypeError, "obj='A'"),
    row("Report[]", "name", lambda c: c.report["jacobian"], UnknownNameError,
        "name='jacobian'"),
    row("Steering.remove", "force", lambda c: _remove_with(c.model, force="yes"), OptionError,
        "force='yes'"),
    # loggers, callback
    row("CSVLogger.log", "step", lambda c: c.csv.log({"a": 1.0}, step="3"), OptionTypeError,
        "step='3'"),
    row("JSONLLogger.log", "metrics", lambda c: c.jsonl.log([1.0], step=1), OptionTypeError,
        "metrics=[1.0]"),
    row("JSONLLogger.log", "metric value", lambda c: c.jsonl.log({"a": "high"}, step=1),
        OptionTypeError, "metrics['a']='high'"),
    row("SpectralCallback", "every", lambda c: SpectralCallback(every=0), OptionError,
        "every=0"),
    row("SpectralCallback", "window", lambda c: SpectralCallback(window="epoch"), OptionError,
        "window='epoch'"),
    row("SpectralCallback", "store", lambda c: SpectralCallback(store="stats"), OptionError,
        "store='stats'"),
    row("SpectralCallback", "loggers", lambda c: SpectralCallback(loggers=[print]),
        OptionTypeError, "loggers="),
]


@pytest.mark.parametrize("call,exc,shows", ROWS)
def test_bad_argument_is_named_with_its_value(c, call, exc, shows):
    hooks = count_hooks(c.model)
    weights = {k: v.clone() for k, v in c.model.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(exc) as info:
            call(c)
    err, message = info.value, str(info.value)
    assert isinstance(err, (ValueError, TypeError, KeyError, OSError))
    assert isinstance(err, (SpectralHooksError, OSError)), type(err)
    for text in shows:
        assert text in message, f"{text!r} not in {message!r}"
    assert "\n" not in message
    assert str(info.traceback[-1].path).startswith(PACKAGE), "raised outside spectral_hooks"
    assert count_hooks(c.model) == hooks, "a refused call left hooks behind"
    assert all(torch.equal(v, weights[k]) for k, v in c.model.state_dict().items())


def test_there_are_at_least_40_rows_covering_the_public_api():
    entries = {p.id.split(":")[0].split(".")[0].split("[")[0] for p in ROWS}
    assert len(ROWS) >= 40
    public = {"instrument", "Probe", "analyze", "Recording", "Report", "steer", "eigs", "svds",
              "layer_matrices", "layer_biases", "anatomy_of", "register_anatomy",
              "CSVLogger", "JSONLLogger", "SpectralCallback"}
    assert public <= entries, public - entries
