"""Metric sinks for training loops: TensorBoard, Weights & Biases, JSON Lines, CSV.

    >>> logger = JSONLLogger("metrics.jsonl")                      # doctest: +SKIP
    >>> logger.log(flatten_power(probe.analyze(power=True)), step=100)  # doctest: +SKIP
    >>> logger.close()                                             # doctest: +SKIP

Every logger has ``log(metrics, step)`` and ``close()`` (the :class:`MetricsLogger` protocol)
and is a context manager. Optional dependencies (tensorboard, wandb) are imported when a
logger that needs them is created, with an ImportError that says what to install.
"""

from __future__ import annotations

import csv
import json
import math
import os
from typing import Any, Iterable, Mapping, Optional, Protocol, Union, runtime_checkable

POWER_COLUMNS = ("gap_ratio", "gamma", "lift", "abs_lambda1", "erank")


@runtime_checkable
class MetricsLogger(Protocol):
    """Anything with ``log(metrics, step)`` and ``close()``."""

    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def flatten_power(report: Any, *, columns: Iterable[str] = POWER_COLUMNS,
                  prefix: str = "spectral") -> dict[str, float]:
    """``{"spectral/layer_03/gap_ratio": 0.91, ...}`` from a Report's power table.

    ``report``: a :class:`~spectral_hooks.Report` (its ``.power`` is read) or the power
    DataFrame itself. Missing columns raise KeyError; NaN values are skipped. When the table has
    several rows for one layer, the rows are told apart by their ``iterate`` value
    (``layer_03/I+F/gap_ratio``).
    """
    table = report.power if hasattr(report, "power") else report
    columns = (columns,) if isinstance(columns, str) else tuple(columns)
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise KeyError(f"power table has no column(s) {missing}; available: {list(table.columns)}")
    duplicated = bool(table["layer"].duplicated().any())
    if duplicated and "iterate" not in table.columns:
        raise ValueError("power table has several rows per layer and no 'iterate' column")
    out: dict[str, float] = {}
    for _, row in table.iterrows():
        name = f"layer_{int(row['layer']):02d}"
        if duplicated:
            name += f"/{row['iterate']}"
        for column in columns:
            value = float(row[column])
            if not math.isnan(value):
                out[f"{prefix}/{name}/{column}" if prefix else f"{name}/{column}"] = value
    return out


class _Base:
    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _check(metrics: Mapping[str, float], step: int) -> None:
    if not isinstance(step, int) or isinstance(step, bool):
        raise TypeError(f"step must be an int, got {type(step).__name__}")
    if not isinstance(metrics, Mapping):
        raise TypeError(f"metrics must be a mapping of name -> float, got {type(metrics).__name__}")


class TensorBoardLogger(_Base):
    """Scalars into TensorBoard event files (``torch.utils.tensorboard.SummaryWriter``)."""

    def __init__(self, log_dir: Union[str, os.PathLike], **writer_kwargs: Any) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:  # torch.utils.tensorboard needs the tensorboard package
            raise ImportError("TensorBoardLogger needs the 'tensorboard' package: "
                              "pip install tensorboard") from err
        self.log_dir = os.fspath(log_dir)
        self.writer = SummaryWriter(log_dir=self.log_dir, **writer_kwargs)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        _check(metrics, step)
        for name, value in metrics.items():
            self.writer.add_scalar(name, float(value), global_step=step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger(_Base):
    """Scalars into a Weights & Biases run: an existing ``run`` or one made by
    ``wandb.init(**init_kwargs)`` (finished by ``close()`` only when this logger made it)."""

    def __init__(self, run: Any = None, **init_kwargs: Any) -> None:
        try:
            import wandb
        except ImportError as err:
            raise ImportError("WandbLogger needs the 'wandb' package: pip install wandb") from err
        self._owns = run is None
        self.run = wandb.init(**init_kwargs) if run is None else run

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        _check(metrics, step)
        self.run.log({k: float(v) for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        if self._owns and self.run is not None:
            self.run.finish()
        self.run = None


def _json_number(value: float) -> Optional[float]:
    value = float(value)
    return value if math.isfinite(value) else None


class JSONLLogger(_Base):
    """One JSON object per ``log`` call: ``{"step": 100, "spectral/layer_00/gamma": 0.2, ...}``.

    Strict JSON: non-finite values are written as ``null``. ``append=True`` keeps an existing
    file (resuming a run); the default starts a new one. Each line is flushed when written.
    """

    def __init__(self, path: Union[str, os.PathLike], *, append: bool = False) -> None:
        self.path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._file = open(self.path, "a" if append else "w", encoding="utf-8")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        _check(metrics, step)
        record = {"step": step, **{k: _json_number(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


class CSVLogger(_Base):
    """Long ("tidy") CSV: one ``step,name,value`` row per metric, so the set of names may change
    between calls. ``pandas.read_csv(path).pivot(index="step", columns="name", values="value")``
    gives the wide table. ``append=True`` keeps an existing file (no second header)."""

    HEADER = ("step", "name", "value")

    def __init__(self, path: Union[str, os.PathLike], *, append: bool = False) -> None:
        self.path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        fresh = not append or not os.path.exists(self.path) or os.path.getsize(self.path) == 0
        self._file = open(self.path, "a" if append else "w", encoding="utf-8", newline="")
        self._writer = csv.writer(self._file)
        if fresh:
            self._writer.writerow(self.HEADER)
            self._file.flush()

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        _check(metrics, step)
        for name, value in metrics.items():
            self._writer.writerow((step, name, repr(float(value))))
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
