"""Spectral metrics from a plain training loop: one call per optimizer step.

    >>> import tempfile, torch
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> from spectral_hooks.integrations import JSONLLogger, SpectralTracker
    >>> model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100))
    >>> optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    >>> log = JSONLLogger(tempfile.mkdtemp() + "/spectral.jsonl")
    >>> tracker = SpectralTracker(model, every=2, loggers=[log])
    >>> gen = torch.Generator().manual_seed(0)
    >>> for step in range(1, 5):
    ...     batch = torch.randint(0, 100, (2, 8), generator=gen)
    ...     model(batch, labels=batch).loss.backward()
    ...     metrics = tracker.step(step)          # before optimizer.step(): the weights that ran
    ...     optimizer.step(); optimizer.zero_grad()
    >>> metrics["spectral/layer_01/gap_ratio"] > 0, tracker.probe.n_handles  # no hooks at step 5
    (True, 0)
    >>> tracker.close()

``step(step)`` computes the power metrics of what the model ran since the previous call (every
``every`` steps; other calls only clear the recording, so memory stays flat), sends them to the
``loggers`` under ``spectral/layer_03/gap_ratio``-style names and returns them (None when not
due). The hooks are on the model only during the steps that are logged: ``step(s)`` attaches
them when step ``s + 1`` is due and removes them otherwise (:meth:`SpectralTracker.start_step`
says it explicitly, e.g. to resume at another step), so the forwards of every other step run
with none of our hooks and cost nothing; the first step is ``first_step`` (1).
Call it after ``backward()`` and before ``optimizer.step()``, so the weights analysed are
the ones that produced the recorded activations. The analysis runs under ``torch.no_grad()``
and a forked RNG state: training is unchanged. Under torch.distributed call ``step`` on every
rank at the same steps (it is a collective at due steps): only rank 0 computes and logs (other
ranks get None), every rank sends it its recorded tokens (and, with FSDP2-sharded weights, joins
the gather of each layer), so the data-dependent columns (alignment, consensus, erank, rho ...)
describe the global batch: the concatenation of every rank's tokens, the same values one
process computes from it. Weight-only columns (F's spectrum) need no communication. A rank
that recorded nothing contributes no token; when no rank recorded anything the event is None
everywhere (see :class:`Event`). Each logged event carries its own cost as
``spectral/seconds``.

The power metrics are the cheap ones (:mod:`~spectral_hooks.integrations.power_log`: F's
spectrum on the route of ``analyze()``, ``metrics.spectrum.power_route``; alignment, consensus).
``jacobian_every=N`` adds the block-Jacobian spectra (``probe.analyze(jacobian=...)``'s
``jacobian`` table, ``spectral/layer_03/jacobian/top_eig_abs``) every N steps; off by default:
one event costs seconds to minutes.

Nothing here raises inside the training loop (:class:`Guard`): a metric that cannot be computed
(a layer the package cannot read, a solver that fails, a logger that cannot write) is left out
of that event's metrics (logged as missing) with one warning per cause, and training goes on;
``event.failures`` lists what was skipped. Under torch.distributed errors are raised as before
(a rank that stopped partway through a collective would leave the others waiting forever).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Optional, Sequence, TypeVar

import torch

from ..anatomy.wrappers import is_sharded, unwrap_model
from ..errors import OptionError
from .distributed import any_rank, world_size
from .loggers import POWER_COLUMNS, MetricsLogger
from .power_log import (
    JACOBIAN_COLUMNS,
    POWER_CAPTURES,
    check_power_options,
    jacobian_metrics,
    power_metrics,
    timed_event,
)

log: logging.Logger = logging.getLogger(__name__)
T = TypeVar("T")


class Guard:
    """Runs the parts of a training event so that none raises into the user's training loop: a
    failure is recorded in :attr:`failures` as (what, why), warned once per (what, exception
    type) on the ``spectral_hooks.integrations`` logger, and the part's ``default`` returned.

        >>> guard = Guard()
        >>> guard.run("power metrics", lambda: 1 / 0, default={})
        {}
        >>> guard.failures
        [('power metrics', 'ZeroDivisionError: division by zero')]
    """

    def __init__(self) -> None:
        self.failures: list[tuple[str, str]] = []
        self._warned: set[tuple[str, type]] = set()

    def run(self, what: str, fn: Callable[[], T], *, default: T) -> T:
        """``fn()``, or ``default`` when it raises (an ``Exception``; an interrupt goes through)."""
        try:
            return fn()
        except Exception as err:  # noqa: BLE001 - never raise inside the user's training loop
            self.failed(what, err)
            return default

    def failed(self, what: str, err: Exception) -> None:
        """Record ``err`` from ``what``; warn the first time this (what, type) fails."""
        text = str(err).strip().splitlines()
        why = f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
        self.failures.append((what, why))
        if (what, type(err)) not in self._warned:
            self._warned.add((what, type(err)))
            log.warning("spectral_hooks: %s skipped, logged as missing (training goes on; "
                        "later failures of this kind are not warned again): %s", what, why)


def is_rank_zero() -> bool:
    """True outside torch.distributed or on its rank 0."""
    dist = torch.distributed
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def cuda_devices(model: torch.nn.Module) -> list[int]:
    """The CUDA devices of ``model``'s parameters (whose RNG an event forks)."""
    return sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})


class Event:
    """What one logging event computes (shared by SpectralTracker and SpectralCallback)."""

    every: int
    columns: tuple[str, ...]
    prefix: str
    power_options: dict[str, Any]
    jacobian_every: Optional[int]
    jacobian_columns: tuple[str, ...]
    jacobian_options: dict[str, Any]

    def __init__(self, *, every: int, columns: Sequence[str], prefix: str,
                 analyze_options: Optional[dict[str, Any]], jacobian_every: Optional[int],
                 jacobian_options: Optional[dict[str, Any]], jacobian_columns: Sequence[str]) -> None:
        from ..checks import check_int

        check_int("every", every, minimum=1)
        if jacobian_every is not None:
            check_int("jacobian_every", jacobian_every, minimum=1)
        self.every, self.columns, self.prefix = every, tuple(columns), prefix
        self.power_options = check_power_options(dict(analyze_options or {}))
        self.jacobian_every, self.jacobian_columns = jacobian_every, tuple(jacobian_columns)
        self.jacobian_options = dict(jacobian_options or {"k": 8})
        self.guard: Guard = Guard()

    @property
    def failures(self) -> list[tuple[str, str]]:
        """(what, why) of every part of an event that could not be computed (:class:`Guard`)."""
        return self.guard.failures

    def due(self, step: int) -> bool:
        """True when step ``step`` (> 0) logs: a multiple of ``every`` or of ``jacobian_every``."""
        return step > 0 and (step % self.every == 0 or self._jacobian_due(step))

    def _jacobian_due(self, step: int) -> bool:
        return self.jacobian_every is not None and step % self.jacobian_every == 0

    def __call__(self, probe: Any, step: int, *, compute: Optional[bool] = None
                 ) -> Optional[dict[str, Any]]:
        """The metrics due at ``step``, or None: not due, nothing recorded (on any rank), or
        this rank does not compute.

        Outside torch.distributed (or with one rank) this process computes from its own
        recording. Under torch.distributed with several ranks the call is a collective that
        every rank makes at the same steps (the training integrations do): first whether any
        rank recorded anything (if none did, every rank returns None and nothing else is
        exchanged), then, per logged layer, the gathers of FSDP2-sharded weights and of every
        rank's recorded tokens to rank 0 (only when a data-dependent column is logged, see
        :data:`~spectral_hooks.integrations.power_log.DATA_COLUMNS`). Rank 0 computes and
        returns the metrics; the data-dependent ones describe the global batch (the
        concatenation of every rank's tokens, exactly as one process would compute them from
        it; a rank that recorded nothing contributes no token), the weight-only ones need no
        communication. The Jacobian spectra (``jacobian_every``) are linearised at rank 0's
        recorded inputs (one input, not a batch statistic). ``compute``: None (default) means
        "rank 0 only" (every process outside torch.distributed); True on another rank of a
        distributed run is refused, the tokens go to rank 0.
        """
        if probe is None or not self.due(step):
            return None
        model = probe.model
        distributed = world_size() > 1
        if compute is None:
            compute = is_rank_zero()
        if distributed:
            if compute and not is_rank_zero():
                raise OptionError("compute", compute, "False on every rank but 0 under "
                                  "torch.distributed", hint="rank 0 gathers the tokens and "
                                  "computes")
            if not any_rank(bool(probe.recording.steps)):  # collective
                return None
        elif not probe.recording.steps:
            return None
        if not compute:
            if step % self.every == 0 and (distributed or is_sharded(model)):
                with torch.no_grad():
                    power_metrics(probe, columns=self.columns, compute=False,
                                  across_ranks=distributed, **self.power_options)
            return None
        probe.invalidate()  # the weights changed since the last event

        def guarded(what: str, fn: Callable[[], dict]) -> dict:
            if distributed:  # see the module docstring: a half-done collective would hang
                return fn()
            return self.guard.run(what, fn, default={})

        def run() -> dict:
            out: dict = {}
            if step % self.every == 0:
                out.update(guarded("power metrics", lambda: power_metrics(
                    probe, columns=self.columns, prefix=self.prefix, across_ranks=distributed,
                    **self.power_options)))
            if self._jacobian_due(step):
                out.update(guarded("Jacobian metrics", lambda: jacobian_metrics(
                    probe, options=self.jacobian_options, columns=self.jacobian_columns,
                    prefix=self.prefix)))
            return out
        return timed_event(run, devices=cuda_devices(model),
                           key=f"{self.prefix}/seconds" if self.prefix else "seconds")


class SpectralTracker:
    """Hooks on ``model`` and power metrics every ``every`` steps (see the module docstring).

    Args:
        every: compute at steps ``every, 2 * every, ...``.
        layers, capture, store: passed to :func:`spectral_hooks.instrument`.
        columns: power-table columns to log; prefix: name prefix ("spectral").
        loggers: :class:`MetricsLogger` objects, written on rank 0 (closed by ``close()``).
        analyze_options: ``iterate``, ``fold_norm``, ``full``, ``k``, ``reference_layer`` (as
            in ``probe.analyze(iterate=, fold_norm=, power={...})``).
        jacobian_every: also log block-Jacobian spectra every this many steps (None: never).
        jacobian_options: ``probe.analyze(jacobian=...)``'s options (default ``{"k": 8}``);
        jacobian_columns: columns of its ``jacobian`` table ("frac_complex_top*" allowed).
        first_step: the step of the first forwards (hooks attached only if it is due); None:
            unknown, the hooks stay on until the first ``step()`` call.
    """

    def __init__(self, model: torch.nn.Module, *, every: int = 50,
                 layers: Optional[Iterable[int]] = None, columns: Sequence[str] = POWER_COLUMNS,
                 capture: Sequence[str] = POWER_CAPTURES, store: str = "device",
                 prefix: str = "spectral", loggers: Sequence[MetricsLogger] = (),
                 analyze_options: Optional[dict[str, Any]] = None, jacobian_every: Optional[int] = None,
                 jacobian_options: Optional[dict[str, Any]] = None,
                 jacobian_columns: Sequence[str] = JACOBIAN_COLUMNS,
                 first_step: Optional[int] = 1) -> None:
        from .. import instrument

        self.event: Event = Event(every=every, columns=columns, prefix=prefix,
                           analyze_options=analyze_options, jacobian_every=jacobian_every,
                           jacobian_options=jacobian_options, jacobian_columns=jacobian_columns)
        self.every: int = every
        self.columns: tuple[str, ...] = tuple(columns)
        self.prefix: str = prefix
        self.loggers: list[MetricsLogger] = list(loggers)
        self.probe: Any = instrument(unwrap_model(model), layers=layers, capture=capture, store=store)
        if first_step is not None:
            self.start_step(first_step)

    def due(self, step: int) -> bool:
        """Whether ``step`` logs (power metrics every ``every``, Jacobians every
        ``jacobian_every`` steps)."""
        return self.event.due(step)

    def start_step(self, step: int) -> bool:
        """The forwards that follow belong to optimizer step ``step``: clear the recording and
        attach the hooks if ``step`` is due, remove them if not. Returns whether it records.
        ``step()`` calls it for the next step; call it yourself where steps are not counted
        from ``first_step`` one by one."""
        if self.probe is None:
            return False
        self.probe.clear()
        recording = self.due(step)
        if recording:
            self.probe.attach()
        else:
            self.probe.remove()
        return recording

    def metrics(self, step: Optional[int] = None) -> Optional[dict[str, Any]]:
        """The metrics of what is recorded now (None when nothing is), with their cost:
        the power metrics, and the Jacobian ones when ``step`` is a ``jacobian_every`` step
        (``step=None``: the power metrics only). Under torch.distributed a collective: call it
        on every rank; rank 0 gets the metrics of every rank's tokens, the others None."""
        return self.event(self.probe, self.every if step is None else int(step))

    def step(self, step: int) -> Optional[dict[str, Any]]:
        """Compute and log when ``step`` is due (rank 0); always clear the recording, then
        attach the hooks for step ``step + 1`` only if it is due (:meth:`start_step`)."""
        metrics = None
        if self.due(step):
            metrics = self.event(self.probe, int(step))  # collective under torch.distributed
        if metrics:
            for logger in self.loggers:
                self.event.guard.run(f"writing to {type(logger).__name__}",
                                     lambda: logger.log(metrics, int(step)), default=None)
        self.start_step(int(step) + 1)
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
