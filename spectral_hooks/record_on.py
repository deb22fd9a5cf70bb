"""The same inputs recorded on another model: how a probe supplies the re-initialised control.

    >>> anatomy, recording = probe.record_on(fresh_model(model, seed=1))   # doctest: +SKIP

A mixin of :class:`~spectral_hooks.probe.Probe` (it needs ``anatomy``, ``layers`` and
``recording``): :meth:`RecordsOn.clone_on` attaches a like probe to another model of the same
architecture, :meth:`RecordsOn.record_on` replays the recorded model inputs through it.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from .anatomy import Anatomy, anatomy_of, stack_of
from .errors import RecordingError
from .recording import Recording, map_tensors


class RecordsOn:
    """Mixin: needs ``self.anatomy``, ``self.layers`` and ``self.recording``."""

    anatomy: Anatomy
    layers: tuple[int, ...]
    recording: Recording

    def clone_on(self, model: nn.Module) -> Any:
        """A new probe with the same layers, captures, store and stack on another model (e.g.
        a re-initialised copy of this one)."""
        rec = self.recording
        return cast(Any, type(self))(model, layers=self.layers, capture=rec.capture, store=rec.store,
                          dtype=rec.dtype,
                          anatomy=stack_of(anatomy_of(model), self.anatomy.stack))

    def record_on(self, model: nn.Module) -> tuple[Anatomy, Recording]:
        """Run the recorded model inputs through ``model`` (same architecture) and return its
        anatomy and recording (used for the re-initialised control). A stack of an
        encoder-decoder model runs its own stack (a decoder: on the recorded encoder output)."""
        inputs = self.recording.model_inputs
        if not inputs or any(i is None for i in inputs):
            raise RecordingError("reinit needs the model inputs of every recorded run; they "
                                 "are missing (the model's forward was bypassed, e.g. TL3 "
                                 "generate())")
        device = next(model.parameters()).device
        with self.clone_on(model) as other, torch.no_grad():
            run = model if other.anatomy.stack is None else other.anatomy.call_root
            for args, kwargs in map_tensors(inputs, lambda t: t.to(device)):
                run(*args, **kwargs)
        return other.anatomy, other.recording
