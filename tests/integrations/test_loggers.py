"""Loggers write real files that read back to the same values."""

import json
import math

import pandas as pd
import pytest

from spectral_hooks.integrations import (
    CSVLogger,
    JSONLLogger,
    MetricsLogger,
    TensorBoardLogger,
    flatten_power,
)

METRICS = {2: {"spectral/layer_00/gap_ratio": 0.5, "spectral/layer_01/gamma": 0.25},
           4: {"spectral/layer_00/gap_ratio": 0.75, "spectral/layer_01/gamma": -1.5}}


def test_protocol():
    assert isinstance(JSONLLogger.__new__(JSONLLogger), MetricsLogger)
    assert not isinstance(object(), MetricsLogger)


def read_tensorboard(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_roundtrip(tmp_path):
    with TensorBoardLogger(tmp_path / "tb") as logger:
        for step, metrics in METRICS.items():
            logger.log(metrics, step)
    scalars = read_tensorboard(tmp_path / "tb")
    assert set(scalars) == set(METRICS[2])
    for tag, events in scalars.items():
        assert [s for s, _ in events] == [2, 4]
        assert [v for _, v in events] == pytest.approx([METRICS[s][tag] for s in (2, 4)])


def test_jsonl_roundtrip(tmp_path):
    path = tmp_path / "sub" / "m.jsonl"
    with JSONLLogger(path) as logger:
        for step, metrics in METRICS.items():
            logger.log(metrics, step)
        logger.log({"x": float("nan")}, 6)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [{"step": 2, **METRICS[2]}, {"step": 4, **METRICS[4]}, {"step": 6, "x": None}]
    with JSONLLogger(path, append=True) as logger:
        logger.log({"y": 1.0}, 8)
    assert len(path.read_text().splitlines()) == 4
    with pytest.raises(TypeError):
        JSONLLogger(tmp_path / "n.jsonl").log({"x": 1.0}, step=1.5)


def test_csv_roundtrip(tmp_path):
    path = tmp_path / "m.csv"
    with CSVLogger(path) as logger:
        logger.log(METRICS[2], 2)
    with CSVLogger(path, append=True) as logger:  # resumed: no second header
        logger.log(METRICS[4], 4)
    wide = pd.read_csv(path).pivot(index="step", columns="name", values="value")
    assert list(wide.index) == [2, 4]
    for step, metrics in METRICS.items():
        for name, value in metrics.items():
            assert wide.loc[step, name] == value  # repr(float) round-trips exactly


def test_flatten_power():
    table = pd.DataFrame({"layer": [0, 3], "iterate": ["F", "F"], "gap_ratio": [0.5, math.nan],
                          "gamma": [0.1, 0.2], "other": [9.0, 9.0]})
    flat = flatten_power(table, columns=("gap_ratio", "gamma"))
    assert flat == {"spectral/layer_00/gap_ratio": 0.5, "spectral/layer_00/gamma": 0.1,
                    "spectral/layer_03/gamma": 0.2}  # NaN skipped
    assert flatten_power(table, columns="other", prefix="") == {"layer_00/other": 9.0,
                                                               "layer_03/other": 9.0}
    both = pd.concat([table, table.assign(iterate="I+F")])
    assert "spectral/layer_03/I+F/gamma" in flatten_power(both, columns=["gamma"])
    with pytest.raises(KeyError, match="nope"):
        flatten_power(table, columns=["nope"])


def test_flatten_real_report():
    import torch
    from transformers import GPT2Config, GPT2Model

    import spectral_hooks as sh

    torch.manual_seed(0)
    model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100,
                                 n_positions=64, bos_token_id=0, eos_token_id=0)).eval()
    with sh.instrument(model, capture=["resid_pre", "resid_post"]) as probe, torch.no_grad():
        model(torch.randint(0, 100, (2, 8)))
    report = probe.analyze(power=True)
    flat = flatten_power(report)
    power = report.power
    expected = float(power.set_index("layer").loc[1, "gap_ratio"])
    assert flat["spectral/layer_01/gap_ratio"] == expected
    assert len(flat) == 10 and all(isinstance(v, float) for v in flat.values())


def test_wandb_logger_disabled_run():
    pytest.importorskip("wandb")
    from spectral_hooks.integrations import WandbLogger

    with WandbLogger(mode="disabled") as logger:
        logger.log(METRICS[2], 2)


class _HostRun:
    """Stands for a run the host (the Trainer's WandbCallback) started."""

    def __init__(self):
        self.logged, self.finished = [], False

    def log(self, values, step=None, **kw):
        self.logged.append((values, step))

    def finish(self):
        self.finished = True


def test_wandb_logger_never_takes_over_a_host_run(monkeypatch):
    wandb = pytest.importorskip("wandb")
    from spectral_hooks.integrations import WandbLogger

    host = _HostRun()
    monkeypatch.setattr(wandb, "run", host)
    monkeypatch.setattr(wandb, "init", lambda **kw: pytest.fail("wandb.init called"))
    with pytest.raises(RuntimeError, match="already active"):
        WandbLogger(project="x")
    with WandbLogger(run=wandb.run) as logger:
        logger.log(METRICS[2], 2)
    assert not host.finished  # closing our logger leaves the host's run alone
    values, step = host.logged[0]
    assert step is None and values["spectral/step"] == 2  # the host keeps its step counter
