"""Spectral metrics while training with the Hugging Face ``Trainer``.

    >>> import tempfile, torch
    >>> from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    >>> from spectral_hooks.integrations import SpectralCallback
    >>> model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100))
    >>> data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 100, (8, 8))]
    >>> args = TrainingArguments(tempfile.mkdtemp(), max_steps=2, per_device_train_batch_size=4,
    ...                          report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
    >>> trainer = Trainer(model, args, train_dataset=data)  # report_to=["tensorboard", ...]
    >>> callback = SpectralCallback(every=2).attach(trainer)
    >>> _ = trainer.train()      # spectral/layer_01/gap_ratio ... in every report_to logger
    {...}
    >>> [step for step, _ in callback.history], "spectral/layer_01/gap_ratio" in callback.history[0][1]
    ([2], True)

Why ``attach`` and not ``callbacks=[callback]``: the Trainer builds its callback list as its own
flow callback, then the ``report_to`` integrations (TensorBoard, W&B, MLflow, CSV ...), then the
user's callbacks, and calls ``on_log`` in that order. A callback passed in ``callbacks=[...]``
sees ``logs`` after every integration has already written them: adding metrics there is too
late. ``attach`` inserts the callback ahead of the integrations; at each due step it asks the
Trainer to log (``control.should_log``, on every rank, so the loss gather of a DDP run cannot
hang) and adds its scalars to that step's ``logs`` (and ``state.log_history``) in ``on_log``, so
every integration receives them under the same names. Passed in ``callbacks=[...]`` instead,
the callback still works: it appends its own ``state.log_history`` entry and writes its
``loggers`` (TensorBoard/JSONL/CSV/W&B, for plain loops), but the report_to integrations miss it.

What happens: ``on_train_begin`` instruments the trainer's model; every ``every`` optimizer steps
the power metrics of what was recorded are computed (the cheap path of
:mod:`~spectral_hooks.integrations.power_log`, with their cost as ``spectral/seconds``; Jacobian
spectra too every ``jacobian_every`` steps, off by default), sent to ``loggers`` and appended to
``state.log_history`` (in the format ``Trainer.log`` uses); ``on_train_end`` removes the hooks.

The metrics are computed before the optimizer step (``on_pre_optimizer_step``), so the weights
analysed are the ones that produced the recorded activations, and logged at ``on_step_end``
under the new ``state.global_step``. The analysis runs under ``torch.no_grad()`` and a forked
RNG state: training (dropout masks included) is bit-identical with and without the callback.

``window="step"`` (default) keeps only the forwards of the current optimizer step (all its
gradient-accumulation micro-batches): the hooks are attached when a step that logs begins
(``on_step_begin``) and removed once its metrics are computed, so every other step (and every
evaluation) runs with none of our hooks and costs nothing; the recording is cleared when each
step begins and after each evaluation batch, so memory stays flat. ``window="interval"`` keeps
everything recorded since the last logged step (evaluation forwards inside the interval
included), so its hooks stay on for every forward of the run: each costs what recording costs
(``benchmarks/recording_cost.py``; a few percent of a host-bound forward), memory grows with
``every``: use it with ``store="cpu"`` on large models.

Under DDP (torch.distributed) the callback runs on every rank and each event is a collective
(:class:`~.tracker.Event`): every rank sends rank 0 its recorded tokens, rank 0 computes (the
data-dependent columns describe the global batch, every rank's tokens) and only rank 0 logs.

If training raises, the Trainer does not call ``on_train_end``: call ``callback.remove()``.

The callback itself never raises inside the training run (:class:`~.tracker.Guard`): a model it
cannot instrument, a metric it cannot compute (a layer it cannot read), a logger that cannot
write: each is logged as missing with one warning, listed in ``callback.event.failures``, and
training goes on. Quantized and QLoRA models (bitsandbytes nf4 + LoRA) are read through their
dequantized weights plus the adapters' delta (``anatomy.effective``).
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Optional, Sequence

from ..anatomy.wrappers import unwrap_model
from ..checks import check_int
from ..errors import OptionError, OptionTypeError
from .loggers import POWER_COLUMNS, MetricsLogger
from .power_log import JACOBIAN_COLUMNS, POWER_CAPTURES
from .tracker import Event

try:
    from transformers import TrainerCallback
except ImportError as err:  # pragma: no cover - transformers is a core dependency
    raise ImportError("SpectralCallback needs the 'transformers' package: "
                      "pip install transformers") from err

log: logging.Logger = logging.getLogger(__name__)

WINDOWS = ("step", "interval")


def _integration_types() -> tuple:
    """The TrainerCallback classes of every report_to integration transformers knows."""
    from transformers.integrations import integration_utils

    return tuple(set(integration_utils.INTEGRATION_TO_CALLBACK.values()))


class SpectralCallback(TrainerCallback):
    """Log per-layer power metrics every ``every`` optimizer steps (see the module docstring).

    Args:
        every: log at global steps ``every, 2 * every, ...``.
        layers, capture, store: passed to :func:`spectral_hooks.instrument`.
        columns: power-table columns to log (see docs/metrics.md).
        loggers: :class:`MetricsLogger` objects (closed by ``on_train_end`` only if
            ``close_loggers=True``). Written on the main process only.
        report_to_trainer: also append the metrics to ``state.log_history``.
        window: "step" or "interval" (what the metrics are computed from).
        prefix: metric-name prefix (``spectral/layer_03/gap_ratio``).
        analyze_options: ``iterate``, ``fold_norm``, ``full``, ``k``, ``reference_layer`` (as
            in ``probe.analyze(iterate=, fold_norm=, power={...})``), e.g. ``{"iterate": "I+F"}``.
        jacobian_every: also log block-Jacobian spectra every this many steps (None: never);
            jacobian_options, jacobian_columns: see :class:`~.tracker.SpectralTracker`.
    """

    def __init__(self, *, every: int = 50, layers: Optional[Iterable[int]] = None,
                 columns: Sequence[str] = POWER_COLUMNS,
                 loggers: Optional[Sequence[MetricsLogger]] = None,
                 report_to_trainer: bool = True,
                 capture: Sequence[str] = POWER_CAPTURES, store: str = "device",
                 window: str = "step", prefix: str = "spectral",
                 analyze_options: Optional[dict[str, Any]] = None, close_loggers: bool = False,
                 jacobian_every: Optional[int] = None,
                 jacobian_options: Optional[dict[str, Any]] = None,
                 jacobian_columns: Sequence[str] = JACOBIAN_COLUMNS) -> None:
        check_int("every", every, minimum=1)
        self.event: Event = Event(
            every=every, columns=columns, prefix=prefix, analyze_options=analyze_options,
            jacobian_every=jacobian_every, jacobian_options=jacobian_options,
            jacobian_columns=jacobian_columns)
        if window not in WINDOWS:
            raise OptionError("window", window, f"one of {WINDOWS}")
        if store == "stats":
            raise OptionError("store", store, "'device' or 'cpu'", hint="store='stats' keeps "
                              "no token states: the power metrics need them")
        for logger in loggers or ():
            if not isinstance(logger, MetricsLogger):
                raise OptionTypeError("loggers", logger, "MetricsLogger objects, with "
                                      "log(metrics, step) and close()")
        self.every: int = every
        self.layers: Optional[Iterable[int]] = layers
        self.columns: tuple[str, ...] = tuple(columns)
        self.loggers: list[MetricsLogger] = list(loggers or ())
        self.report_to_trainer: bool = report_to_trainer
        self.capture: Sequence[str] = capture
        self.store: str = store
        self.window: str = window
        self.prefix: str = prefix
        self.close_loggers: bool = close_loggers
        self.probe: Any = None
        self.history: list[tuple[int, dict[str, Any]]] = []  # (step, metrics) logged by this callback
        self._pending: Optional[dict[str, Any]] = None
        self._event_step: Optional[int] = None  # the step on_pre_optimizer_step computed
        self._for_log: Optional[tuple[int, dict]] = None  # attached: (step, metrics) for on_log
        self.attached: bool = False

    def attach(self, trainer: Any) -> "SpectralCallback":
        """Insert this callback into ``trainer`` ahead of its report_to integrations (see the
        module docstring) and return it. Calling it again moves it; nothing else changes."""
        callbacks = trainer.callback_handler.callbacks
        if self in callbacks:
            callbacks.remove(self)
        integrations = _integration_types()
        first = next((i for i, cb in enumerate(callbacks) if isinstance(cb, integrations)),
                     len(callbacks))
        callbacks.insert(first, self)
        self.attached = True
        return self

    # ---------------------------------------------------------------- helpers
    def remove(self) -> None:
        """Remove the probe's hooks (safe to call twice)."""
        if self.probe is not None:
            self.probe.remove()
            self.probe = None
        self._pending = self._event_step = None

    def _due(self, step: int) -> bool:
        return self.event.due(step)

    # ---------------------------------------------------------------- Trainer events
    def on_train_begin(self, args, state, control, model=None, **kwargs: Any):
        """Instrument the model the Trainer trains (unwrapped: DDP, compile, PEFT)."""
        from .. import instrument

        self.remove()
        if model is None:
            self.event.guard.failed("instrumenting the model", ValueError(
                "the Trainer passed no model to on_train_begin"))
            return
        # never raise into the training run: a model the package cannot instrument logs no
        # spectral metrics (one warning), the run goes on
        self.probe = self.event.guard.run(
            "instrumenting the model", lambda: instrument(
                unwrap_model(model), layers=self.layers, capture=self.capture,
                store=self.store), default=None)
        if self.probe is not None and self.window == "step":
            self.probe.remove()  # attached again by on_step_begin, for the steps that log

    def on_step_begin(self, args, state, control, **kwargs: Any):
        """``window="step"``: clear the recording; attach the hooks if this step logs, else
        leave the model without them."""
        if self.probe is not None and self.window == "step":
            self.probe.clear()
            if self._due(state.global_step + 1):
                self.probe.attach()
            else:
                self.probe.remove()

    def on_pre_optimizer_step(self, args, state, control, **kwargs: Any):
        """Compute a due event before the weights change (a collective under DDP)."""
        # the weights that produced this step's activations: analyse before they change
        # (every rank: tokens and sharded FSDP2 weights are gathered to rank 0, which computes)
        step = state.global_step + 1
        if self.probe is not None and self._due(step):
            self._pending = self.event(self.probe, step)  # collective under torch.distributed
            self._event_step = step
            if self.window == "step":
                self.probe.remove()  # the step's forwards are done: no hooks until the next

    def on_step_end(self, args, state, control, **kwargs: Any):
        """At a due step: ask the Trainer to log, or log through our own loggers."""
        if self.probe is None or not self._due(state.global_step):
            return
        if self.attached:
            control.should_log = True  # every rank: the Trainer's log gathers the loss
        metrics, self._pending = self._pending, None
        if self._event_step != state.global_step:
            # no on_pre_optimizer_step event (older transformers): every rank, a collective
            metrics = self.event(self.probe, int(state.global_step))
        self._event_step = None
        self.probe.clear()
        if self.window == "step":
            self.probe.remove()
        if not metrics:
            return
        step = int(state.global_step)
        self.history.append((step, metrics))
        for logger in self.loggers:
            self.event.guard.run(f"writing to {type(logger).__name__}",
                                 lambda: logger.log(metrics, step), default=None)
        if self.attached:  # the Trainer logs this step now; on_log adds the metrics
            self._for_log = (step, metrics)
        elif self.report_to_trainer:
            # the entry Trainer.log() would write: the values, the epoch, then the step
            entry = dict(metrics)
            if state.epoch is not None:
                entry["epoch"] = state.epoch
            entry["step"] = step
            state.log_history.append(entry)

    def on_log(self, args, state, control, logs=None, **kwargs: Any):
        """Add the due step's metrics to the Trainer's logs (``attach``: its report_to sees them)."""
        pending, self._for_log = self._for_log, None
        if pending is None or logs is None or pending[0] != state.global_step:
            return
        logs.update(pending[1])  # the integrations after this callback receive them
        last = state.log_history[-1] if state.log_history else None
        if self.report_to_trainer and last is not None and last.get("step") == pending[0]:
            last.update(pending[1])  # Trainer.log appended this step's entry before on_log

    def on_prediction_step(self, args, state, control, **kwargs: Any):
        """With ``window="step"``, drop what evaluation forwards recorded (memory stays flat)."""
        if self.probe is not None and self.window == "step":
            self.probe.clear()  # evaluation forwards are not training steps: keep memory flat

    def on_train_end(self, args, state, control, **kwargs: Any):
        """Remove the hooks (and close our loggers when asked)."""
        self.remove()
        if self.close_loggers:
            for logger in self.loggers:
                logger.close()
