"""Spectral metrics while training with Lightning (``pip install 'spectral_hooks[lightning]'``).

    >>> import lightning.pytorch as pl, torch
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> from spectral_hooks.integrations.lightning import SpectralLightningCallback
    >>> class LM(pl.LightningModule):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4,
    ...                                                 vocab_size=100))
    ...     def training_step(self, batch, batch_idx):
    ...         return self.model(input_ids=batch, labels=batch).loss
    ...     def configure_optimizers(self):
    ...         return torch.optim.AdamW(self.parameters(), lr=1e-3)
    >>> callback = SpectralLightningCallback(every=2)
    >>> trainer = pl.Trainer(max_steps=2, accelerator="cpu", logger=False, callbacks=[callback],
    ...                      enable_progress_bar=False, enable_checkpointing=False,
    ...                      enable_model_summary=False)
    >>> trainer.fit(LM(), torch.utils.data.DataLoader(torch.randint(0, 100, (8, 8)), batch_size=4))
    >>> [step for step, _ in callback.history]   # and in every logger of the trainer
    [2]

The transformer is found inside the LightningModule: ``model=`` (an attribute name or a
function of the module) says where; by default the module itself, else its first child that
:func:`spectral_hooks.anatomy_of` understands. Every ``every`` optimizer steps the power metrics
are computed before the optimizer step (the weights that ran) on rank 0, from every rank's
recorded tokens under torch.distributed (see :class:`~.tracker.Event`), and written with
``log_metrics`` to every logger of the trainer at its ``global_step`` -- directly, so that
``log_every_n_steps`` cannot drop them. Training is unchanged (``torch.no_grad()``, forked RNG).
The hooks are on the model only during the optimizer steps that log: attached when such a step
begins (its first micro-batch), removed once its metrics are computed, so every other step and
every validation runs with none of our hooks. The recording is cleared when each optimizer step
begins and after validation batches. Nothing raises inside the training run: a module it cannot
read or a metric it cannot compute is logged as missing with one warning (``callback.guard``).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

from torch import nn

from ..anatomy.wrappers import unwrap_model
from ..checks import check_int
from ..errors import UnsupportedModelError, require
from .tracker import Guard, SpectralTracker

_pl = require("lightning.pytorch", feature="SpectralLightningCallback")


def find_transformer(module: nn.Module,
                     model: Union[None, str, Callable[[nn.Module], nn.Module]] = None
                     ) -> nn.Module:
    """The transformer inside a LightningModule (see the module docstring)."""
    from ..anatomy import anatomy_of

    if callable(model):
        return model(module)
    if isinstance(model, str):
        return getattr(module, model)
    for candidate in (module, *module.children()):
        try:
            anatomy_of(unwrap_model(candidate, quiet=True))
        except UnsupportedModelError:
            continue
        return candidate
    raise UnsupportedModelError(f"no transformer found in {type(module).__name__} or its "
                                "children: pass model='attribute_name'")


class SpectralLightningCallback(_pl.Callback):
    """Power metrics into the Lightning trainer's loggers (see the module docstring).

    Args:
        every: log at global steps ``every, 2 * every, ...``.
        model: where the transformer is in the LightningModule (attribute name or function).
        tracker_options: keywords of :class:`~spectral_hooks.integrations.SpectralTracker`
            (``layers``, ``columns``, ``capture``, ``store``, ``prefix``, ``analyze_options``,
            ``jacobian_every``, ``jacobian_options``, ``jacobian_columns``).
    """

    def __init__(self, *, every: int = 50,
                 model: Union[None, str, Callable[[nn.Module], nn.Module]] = None,
                 **tracker_options: Any) -> None:
        check_int("every", every, minimum=1)
        self.every: int = every
        self.model: Union[None, str, Callable[[nn.Module], nn.Module]] = model
        self.tracker_options: dict[str, Any] = tracker_options
        self.tracker: Optional[SpectralTracker] = None
        self.guard: Guard = Guard()  # what could not be computed: guard.failures
        self.history: list[tuple[int, dict[str, Any]]] = []
        self._pending: Optional[dict[str, Any]] = None

    def on_fit_start(self, trainer, pl_module) -> None:
        """Find the transformer in the LightningModule and start tracking it."""
        self.teardown(trainer, pl_module, "fit")
        # never raise into the training run: a module the package cannot read logs no
        # spectral metrics (one warning), training goes on
        self.tracker = self.guard.run("instrumenting the model", lambda: SpectralTracker(
            find_transformer(pl_module, self.model), every=self.every, first_step=None,
            **self.tracker_options), default=None)
        if self.tracker is not None:
            self.tracker.event.guard = self.guard  # one record of failures, one warning each
            self.tracker.probe.remove()  # pyright: ignore[reportOptionalMemberAccess]  # attached per step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        """At an optimizer step's first micro-batch: clear the previous step's recording and
        attach the hooks only if this step logs."""
        if self.tracker is not None and batch_idx % trainer.accumulate_grad_batches == 0:
            self.tracker.start_step(trainer.global_step + 1)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        """Compute a due event before the weights change, then remove the hooks."""
        step = trainer.global_step + 1  # every rank: tokens and FSDP2 shards go to rank 0
        if self.tracker is not None and self.tracker.due(step):
            self._pending = self.tracker.event(self.tracker.probe, step)
            self.tracker.probe.remove()  # pyright: ignore[reportOptionalMemberAccess]  # attached

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """Log a due event through the trainer's loggers."""
        metrics, self._pending = self._pending, None
        if not metrics:
            return
        step = int(trainer.global_step)
        self.history.append((step, metrics))
        for logger in trainer.loggers:
            self.guard.run(f"writing to {type(logger).__name__}",
                           lambda: logger.log_metrics(metrics, step=step), default=None)

    def on_validation_batch_end(self, trainer, pl_module, *args: Any, **kwargs: Any) -> None:
        """Validation batches are not part of the training window."""
        if self.tracker is not None:
            self.tracker.probe.clear()  # pyright: ignore[reportOptionalMemberAccess]  # not training steps

    def teardown(self, trainer, pl_module, stage: str) -> None:
        """Remove the hooks."""
        if self.tracker is not None:
            self.tracker.close()
            self.tracker = None
        self._pending = None
