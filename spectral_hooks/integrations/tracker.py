"""Spectral metrics from a plain training loop: one call per optimizer step.

    >>> from spectral_hooks.integrations import JSONLLogger, SpectralTracker
    >>> tracker = SpectralTracker(model, every=50, loggers=[JSONLLogger("spectral.jsonl")])  # doctest: +SKIP
    >>> for step, batch in enumerate(loader, start=1):                 # doctest: +SKIP
    ...     loss = model(**batch).loss
    ...     loss.backward()
    ...     tracker.step(step)          # before optimizer.step(): the weights that ran
    ...     optimizer.step(); optimizer.zero_grad()
    >>> tracker.close()                                                # doctest: +SKIP

``step(step)`` computes the power metrics of what the model ran since the previous call (every
``every`` steps; other calls only clear the recording, so memory stays flat), sends them to the
``loggers`` under ``spectral/layer_03/gap_ratio``-style names and returns them (None when not
due). Call it after ``backward()`` and before ``optimizer.step()``, so the weights analysed are
the ones that produced the recorded activations. The analysis runs under ``torch.no_grad()``
and a forked RNG state: training is unchanged. Under torch.distributed only rank 0 computes and
logs (other ranks get None); the metrics describe rank 0's batch. Each logged event carries its
own cost as ``spectral/seconds``.
"""

from __future__ import annotations

import time
from typing import Any, Iterable, Optional, Sequence

import torch

from .loggers import POWER_COLUMNS, MetricsLogger, flatten_power


def is_rank_zero() -> bool:
    """True outside torch.distributed or on its rank 0."""
    dist = torch.distributed
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside DistributedDataParallel / DataParallel / accelerate wrappers."""
    while isinstance(getattr(model, "module", None), torch.nn.Module):
        model = model.module
    return model


class SpectralTracker:
    """Hooks on ``model`` and power metrics every ``every`` steps (see the module docstring).

    Args:
        every: compute at steps ``every, 2 * every, ...``.
        layers, capture, store: passed to :func:`spectral_hooks.instrument`.
        columns: power-table columns to log; prefix: name prefix ("spectral").
        loggers: :class:`MetricsLogger` objects, written on rank 0 (closed by ``close()``).
        analyze_options: extra keywords for ``probe.analyze(power=True, ...)``.
    """

    def __init__(self, model: torch.nn.Module, *, every: int = 50,
                 layers: Optional[Iterable[int]] = None, columns: Sequence[str] = POWER_COLUMNS,
                 capture: Sequence[str] = ("resid_pre", "resid_post"), store: str = "device",
                 prefix: str = "spectral", loggers: Sequence[MetricsLogger] = (),
                 analyze_options: Optional[dict] = None) -> None:
        from .. import instrument

        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"every must be a positive int, got {every!r}")
        self.every, self.columns, self.prefix = every, tuple(columns), prefix
        self.loggers = list(loggers)
        self.analyze_options = dict(analyze_options or {})
        self.probe = instrument(unwrap(model), layers=layers, capture=capture, store=store)

    def due(self, step: int) -> bool:
        return step > 0 and step % self.every == 0

    def metrics(self) -> Optional[dict]:
        """The power metrics of what is recorded now (None when nothing is), with their cost."""
        if self.probe is None or not self.probe.recording.steps:
            return None
        start = time.perf_counter()
        model = self.probe.model
        devices = sorted({p.device.index or 0 for p in model.parameters()
                          if p.device.type == "cuda"})
        self.probe.invalidate()  # the weights changed since the last event
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            report = self.probe.analyze(power=True, **{"progress": False,
                                                       **self.analyze_options})
            out = flatten_power(report.power, columns=self.columns, prefix=self.prefix)
        out[f"{self.prefix}/seconds" if self.prefix else "seconds"] = time.perf_counter() - start
        return out

    def step(self, step: int) -> Optional[dict]:
        """Compute and log when ``step`` is due (rank 0); always clear the recording."""
        metrics = self.metrics() if self.due(step) and is_rank_zero() else None
        if metrics:
            for logger in self.loggers:
                logger.log(metrics, int(step))
        if self.probe is not None:
            self.probe.clear()
        return metrics

    def close(self) -> None:
        """Remove the hooks and close the loggers (safe to call twice)."""
        if self.probe is not None:
            self.probe.remove()
            self.probe = None
        for logger in self.loggers:
            logger.close()
        self.loggers = []

    def __enter__(self) -> "SpectralTracker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
