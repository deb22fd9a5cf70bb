"""Metric sinks for training loops: TensorBoard, Weights & Biases, JSON Lines, CSV.

    >>> import os, tempfile
    >>> import pandas as pd
    >>> power = pd.DataFrame({"layer": [0, 1], "gap_ratio": [0.5, 0.25]})  # report.power
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "spectral.jsonl")
    >>> with JSONLLogger(path) as logger:
    ...     logger.log(flatten_power(power, columns=["gap_ratio"]), step=100)
    >>> print(open(path).read(), end="")
    {"step": 100, "spectral/layer_00/gap_ratio": 0.5, "spectral/layer_01/gap_ratio": 0.25}
    >>> tmp.cleanup()

Every logger has ``log(metrics, step)`` and ``close()`` (the :class:`MetricsLogger` protocol)
and is a context manager. Optional dependencies (tensorboard, wandb) are imported when a
logger that needs them is created, with an ImportError that says what to install.

The JSONL and CSV loggers are crash-safe: each ``log`` call is written as whole lines in one
``write`` and then flushed and ``fsync``-ed, so a killed process leaves at most a torn last line,
and opening the file again with ``append=True`` truncates that torn line (with a warning) instead
of gluing the next record onto it.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import warnings
from typing import Any, Iterable, Mapping, Optional, Protocol, Union, runtime_checkable

POWER_COLUMNS = ("gap_ratio", "gamma", "lift", "abs_lambda1", "erank")
"""The power-table columns the training integrations log by default (``columns=``)."""


@runtime_checkable
class MetricsLogger(Protocol):
    """Anything with ``log(metrics, step)`` and ``close()``."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record ``metrics`` (name -> real number, NaN allowed) at training step ``step``."""
        ...

    def close(self) -> None:
        """Flush and release what the logger holds (a file, a writer, a run)."""
        ...


def flatten_power(report: Any, *, columns: Iterable[str] = POWER_COLUMNS,
                  prefix: str = "spectral") -> dict[str, float]:
    """``{"spectral/layer_03/gap_ratio": 0.91, ...}`` from a Report's power table.

    Missing columns raise KeyError; NaN values are skipped. When the table has several rows
    for one layer, the rows are told apart by their ``iterate`` value
    (``layer_03/I+F/gap_ratio``).

        >>> import pandas as pd
        >>> power = pd.DataFrame({"layer": [0, 3], "gap_ratio": [0.5, float("nan")]})
        >>> flatten_power(power, columns=["gap_ratio"])
        {'spectral/layer_00/gap_ratio': 0.5}

    Args:
        report: a :class:`~spectral_hooks.Report` (its ``.power`` is read) or the power
            DataFrame itself.
        columns: the power-table columns to take (default :data:`POWER_COLUMNS`).
        prefix: the first part of every name ("" for none).

    Returns:
        ``{f"{prefix}/layer_{layer:02d}/{column}": value}`` for every finite value.
    """
    table = report.power if hasattr(report, "power") else report
    columns = (columns,) if isinstance(columns, str) else tuple(columns)
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise KeyError(f"power table has no column(s) {missing}; available: {list(table.columns)}")
    refuse_text_columns(table, columns)
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


def is_scalar_column(values: Any) -> bool:
    """Whether a table column holds numbers a scalar logger can take (bool, int, float), not
    text or categories (a layer's ``mixer``, a ``token``).

        >>> import pandas as pd
        >>> is_scalar_column(pd.Series([0.5])), is_scalar_column(pd.Series(["mha"]))
        (True, False)
    """
    if len(values) == 0 and str(values.dtype) == "object":
        return True  # an empty table (a rank that only joins the collectives) holds no text
    return getattr(values.dtype, "kind", "O") in "biuf"


def refuse_text_columns(table: Any, columns: Iterable[str], what: str = "columns") -> None:
    """An :class:`~spectral_hooks.errors.OptionError` for the first of ``columns`` in
    ``table`` that holds no numbers: a training logger logs scalars only."""
    text = [c for c in columns if c in table.columns and not is_scalar_column(table[c])]
    if text:
        from ..errors import OptionError  # stdlib-only at import, see _refuse

        raise OptionError(what, text[0], "columns that hold numbers: a logger logs scalars",
                          hint=f"{text[0]!r} holds text; the layer kinds (mixer, mlp) are in "
                               "the report's tables and its metadata['layer_mixers']")


class _Base:
    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError


def _check(metrics: Mapping[str, float], step: int) -> None:
    if not isinstance(step, int) or isinstance(step, bool):
        _refuse("step", step, "an int")
    if not isinstance(metrics, Mapping):
        _refuse("metrics", metrics, "a mapping of name -> float")
    for name, value in metrics.items():
        if isinstance(value, (str, bytes, bool)) or not _is_number(value):
            _refuse(f"metrics[{name!r}]", value, "a real number (NaN allowed)")


def _refuse(name: str, value: Any, valid: str) -> None:
    # imported here: this file stays loadable alone, stdlib only (tests/reliability/
    # test_logger_kill.py runs it in a bare child process)
    from ..errors import OptionTypeError

    raise OptionTypeError(name, value, valid)


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


class TensorBoardLogger(_Base):
    """Scalars into TensorBoard event files (``torch.utils.tensorboard.SummaryWriter``).

        >>> import os, tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> log_dir = tmp.name
        >>> with TensorBoardLogger(log_dir) as logger:
        ...     logger.log({"spectral/layer_00/gap_ratio": 0.5}, step=100)
        >>> [f.split(".")[0] for f in os.listdir(log_dir)]
        ['events']
        >>> tmp.cleanup()

    ``writer_kwargs`` go to the ``SummaryWriter`` (``flush_secs``, ``max_queue`` ...).
    """

    def __init__(self, log_dir: Union[str, os.PathLike[str]], **writer_kwargs: Any) -> None:
        from ..errors import require  # here: the SIGKILL test loads this file alone
        require("tensorboard", feature="TensorBoardLogger")
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir: str = os.fspath(log_dir)
        self.writer: Any = SummaryWriter(log_dir=self.log_dir, **writer_kwargs)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """One scalar per metric name at ``global_step=step``."""
        _check(metrics, step)
        for name, value in metrics.items():
            self.writer.add_scalar(name, float(value), global_step=step)

    def flush(self) -> None:
        """Write the pending events to disk now."""
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()


class WandbLogger(_Base):
    """Scalars into a Weights & Biases run: a ``run`` you pass, or one made by
    ``wandb.init(**init_kwargs)`` (finished by ``close()`` only when this logger made it).

    Usage (needs the ``wandb`` extra)::

        logger = WandbLogger(project="spectral", mode="offline")   # a run of its own
        logger = WandbLogger(run=wandb.run)                         # or into a run you own

    It never takes over a run someone else started: with no ``run`` while a W&B run is active
    (e.g. the Trainer's ``report_to="wandb"``) it raises instead of calling ``wandb.init``. Into
    a passed run it logs without ``step=`` (the run's owner keeps its step counter) and adds
    the step as ``spectral/step``; with the Trainer, ``SpectralCallback(...).attach(trainer)``
    sends the metrics through the Trainer's own W&B integration instead.
    """

    run: Any  # a wandb Run, None once closed

    def __init__(self, run: Any = None, **init_kwargs: Any) -> None:
        from ..errors import require
        wandb = require("wandb", feature="WandbLogger")
        if run is None and getattr(wandb, "run", None) is not None:
            raise RuntimeError("a W&B run is already active (its owner, e.g. the Trainer's "
                               "report_to='wandb', logs to it): pass run=wandb.run to log "
                               "into it without finishing it, or use "
                               "SpectralCallback(...).attach(trainer)")
        self._owns = run is None
        self.run = wandb.init(**init_kwargs) if run is None else run

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Log ``metrics`` at ``step`` (into a passed run: as ``spectral/step``, see above)."""
        _check(metrics, step)
        values = {k: float(v) for k, v in metrics.items()}
        if self._owns:
            self.run.log(values, step=step)  # pyright: ignore[reportOptionalMemberAccess]  # set in __init__
        else:
            self.run.log({**values, "spectral/step": step})  # pyright: ignore[reportOptionalMemberAccess]

    def close(self) -> None:
        """Finish the run if this logger started it; a passed run is left running."""
        if self._owns and self.run is not None:
            self.run.finish()
        self.run = None


def _json_number(value: float) -> Optional[float]:
    value = float(value)
    return value if math.isfinite(value) else None


class TornLineWarning(UserWarning):
    """``append=True`` found a torn last line (a killed writer) and truncated it."""


def _repair_tail(path: str) -> bool:
    """Truncate an unterminated last line of ``path``; True when something was cut."""
    with open(path, "rb+") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size == 0:
            return False
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return False
        start = max(0, size - (1 << 16))
        while True:  # find the last newline, reading backwards in blocks
            fh.seek(start)
            block = fh.read(size - start)
            cut = block.rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
                break
            if start == 0:
                keep = 0
                break
            start = max(0, start - (1 << 16))
        fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())
    warnings.warn(f"{path}: the last line was torn (a writer was killed mid-line); truncated "
                  f"{size - keep} bytes before appending", TornLineWarning, stacklevel=4)
    return True


class _LineFile(_Base):
    """An append-only text file written in whole lines: one ``os.write`` + ``fsync`` per event."""

    def __init__(self, path: Union[str, os.PathLike[str]], *, append: bool, fsync: bool) -> None:
        self.path = os.fspath(path)
        self._fsync = bool(fsync)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        if append and os.path.exists(self.path):
            _repair_tail(self.path)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if append else os.O_TRUNC)
        self._fd: Optional[int] = os.open(self.path, flags, 0o644)
        self.fresh = os.fstat(self._fd).st_size == 0

    @property
    def closed(self) -> bool:
        return self._fd is None

    def _write_lines(self, text: str) -> None:
        if self._fd is None:
            raise ValueError(f"{type(self).__name__}({self.path!r}) is closed")
        data = memoryview(text.encode("utf-8"))
        while data:  # one write for a regular file; loop only on a short write
            data = data[os.write(self._fd, data):]
        if self._fsync:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class JSONLLogger(_LineFile):
    """One JSON object per ``log`` call: ``{"step": 100, "spectral/layer_00/gamma": 0.2, ...}``.

    Strict JSON: non-finite values are written as ``null``. ``append=True`` keeps an existing
    file (resuming a run; a torn last line is truncated with a :class:`TornLineWarning`); the
    default starts a new one. Each line is written whole, flushed and fsync-ed (``fsync=False``
    skips the fsync: faster, still never a torn line from a Python-level crash).
    """

    def __init__(self, path: Union[str, os.PathLike[str]], *, append: bool = False,
                 fsync: bool = True) -> None:
        super().__init__(path, append=append, fsync=fsync)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Append one line ``{"step": step, name: value, ...}`` (non-finite values: null)."""
        _check(metrics, step)
        record = {"step": step, **{k: _json_number(v) for k, v in metrics.items()}}
        self._write_lines(json.dumps(record, allow_nan=False) + "\n")


class CSVLogger(_LineFile):
    """Long ("tidy") CSV: one ``step,name,value`` row per metric, so the set of names may change
    between calls. ``pandas.read_csv(path).pivot(index="step", columns="name", values="value")``
    gives the wide table. ``append=True`` keeps an existing file (no second header; a torn last
    row is truncated with a :class:`TornLineWarning`). The rows of one ``log`` call are written
    in one write, then flushed and fsync-ed (``fsync=False`` skips the fsync).

        >>> import os, tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> path = os.path.join(tmp.name, "spectral.csv")
        >>> with CSVLogger(path) as logger:
        ...     logger.log({"spectral/layer_00/gap_ratio": 0.5}, step=100)
        >>> print(open(path).read(), end="")
        step,name,value
        100,spectral/layer_00/gap_ratio,0.5
        >>> tmp.cleanup()
    """

    HEADER = ("step", "name", "value")

    def __init__(self, path: Union[str, os.PathLike[str]], *, append: bool = False,
                 fsync: bool = True) -> None:
        super().__init__(path, append=append, fsync=fsync)
        if self.fresh:
            self._write_lines(self._rows([self.HEADER]))

    @staticmethod
    def _rows(rows: Iterable[tuple]) -> str:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rows)
        return buf.getvalue()

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Append one ``step,name,value`` row per metric, in one write."""
        _check(metrics, step)
        self._write_lines(self._rows((step, name, repr(float(value)))
                                     for name, value in metrics.items()))
