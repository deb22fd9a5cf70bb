"""Encoder-decoder models (T5, BART, Whisper): one ordinary probe per stack, attached together.

    >>> import torch
    >>> from transformers import T5Config, T5Model
    >>> import spectral_hooks as sh
    >>> model = T5Model(T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
    ...                          vocab_size=100)).eval()
    >>> with sh.instrument(model) as probe:                     # an EncoderDecoderProbe
    ...     _ = model(input_ids=torch.tensor([[1, 2, 3]]), decoder_input_ids=torch.tensor([[0, 4]]))
    >>> probe.encoder.recording.resid_post[1].shape, probe.recording["decoder"].resid_post[1].shape
    (torch.Size([1, 3, 32]), torch.Size([1, 2, 32]))
    >>> probe.n_handles
    0

``probe.encoder`` and ``probe.decoder`` are :class:`~spectral_hooks.probe.Probe` objects on the
stacks' anatomies (``anatomy_of(model).encoder`` / ``.decoder``): each records one forward call
per call of its stack, and a decoder block's recorded call holds the encoder output and the
cross-attention mask, so its Jacobian is taken with them fixed. ``probe.analyze(...)`` returns
one :class:`~spectral_hooks.report.Report` per stack, ``{"encoder": ..., "decoder": ...}``
(the stacks differ in depth, causality and inputs, so their tables are kept apart).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional, Sequence, Union, cast

import torch
from torch import nn

from .anatomy.stacks import STACKS, EncoderDecoderAnatomy
from .errors import OptionError, RecordingKeyError
from .recording import DEFAULT_CAPTURES, Recording
from .report import Report

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .analysis.keywords import AnalyzeKeywords

__all__ = ["EncoderDecoderProbe", "StackRecordings"]

Layers = Union[None, int, Iterable[int], Mapping[str, Optional[Iterable[int]]]]


class StackRecordings:
    """The recordings of both stacks: ``recordings["encoder"]``, ``recordings.decoder``, and
    ``recordings["decoder.blocks.1.hook_resid_post"]`` (a stack, then a recording name)."""

    def __init__(self, recordings: dict[str, Recording]) -> None:
        self._recordings = recordings

    @property
    def encoder(self) -> Recording:
        """The encoder stack's recording."""
        return self._recordings["encoder"]

    @property
    def decoder(self) -> Recording:
        """The decoder stack's recording."""
        return self._recordings["decoder"]

    def keys(self) -> tuple[str, ...]:
        """The stack names, in the order the model runs them."""
        return tuple(self._recordings)

    def __getitem__(self, name: str) -> Any:
        stack, _, rest = name.partition(".") if isinstance(name, str) else ("", "", "")
        if stack not in self._recordings:
            raise RecordingKeyError(f"unknown name {name!r}: use 'encoder' or 'decoder', or "
                                    "'<stack>.blocks.<l>.hook_resid_post' (or _pre, attn_out, "
                                    "mask)")
        recording = self._recordings[stack]
        return recording[rest] if rest else recording

    def clear(self) -> None:
        """Drop what both stacks recorded."""
        for recording in self._recordings.values():
            recording.clear()

    def __repr__(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self._recordings.items())


def _stack_layers(layers: Layers, stack: str) -> Optional[Iterable[int]]:
    """``instrument(layers=...)`` for one stack: None (all), the same indices for both, or a
    mapping ``{"encoder": [...], "decoder": [...]}`` (a missing stack: every layer)."""
    if isinstance(layers, Mapping):
        unknown = set(layers) - set(STACKS)
        if unknown:
            raise OptionError("layers", dict(layers), f"a mapping with keys from {STACKS}",
                              hint=f"unknown {sorted(unknown)}")
        return cast(Mapping[str, Optional[Iterable[int]]], layers).get(stack)
    return cast(Optional[Iterable[int]], layers)  # an int too: instrument takes one


class EncoderDecoderProbe:
    """Hooks on both stacks of an encoder-decoder model; see the module doc. Attached and
    removed together (context manager, :meth:`remove`), ``n_handles`` counts both.

    ``probe_type`` is :class:`~spectral_hooks.probe.Probe` (passed in by ``instrument``, which
    lives in probe.py: this module sits beside it and does not import it).

        >>> import torch
        >>> from transformers import T5Config, T5Model
        >>> import spectral_hooks as sh
        >>> t5 = T5Model(T5Config(d_model=32, d_ff=64, num_layers=2, num_heads=4, d_kv=8,
        ...                       vocab_size=100)).eval()
        >>> with sh.instrument(t5) as probe:
        ...     _ = t5(input_ids=torch.tensor([[1, 2, 3]]), decoder_input_ids=torch.tensor([[0, 1]]))
        >>> type(probe).__name__, sorted(probe.probes)
        ('EncoderDecoderProbe', ['decoder', 'encoder'])
    """

    def __init__(self, model: nn.Module, anatomy: EncoderDecoderAnatomy, *, probe_type: type,
                 layers: Layers = None, capture: Sequence[str] = DEFAULT_CAPTURES,
                 store: str = "device", dtype: Optional[torch.dtype] = None) -> None:
        self.model: nn.Module = model
        self.anatomy: EncoderDecoderAnatomy = anatomy
        self.probes: dict[str, Any] = {}  # stack -> Probe
        attached = False
        try:
            for name, stack in anatomy.stacks.items():
                self.probes[name] = probe_type(model, layers=_stack_layers(layers, name),
                                               capture=capture, store=store, dtype=dtype,
                                               anatomy=stack)
            attached = True
        finally:
            if not attached:  # a bad option for the second stack: leave no hook behind
                self.remove()

    @property
    def encoder(self) -> Any:
        """The encoder stack's :class:`~spectral_hooks.probe.Probe`."""
        return self.probes["encoder"]

    @property
    def decoder(self) -> Any:
        """The decoder stack's :class:`~spectral_hooks.probe.Probe`."""
        return self.probes["decoder"]

    @property
    def recording(self) -> StackRecordings:
        """Both stacks' recordings, by stack name."""
        return StackRecordings({name: p.recording for name, p in self.probes.items()})

    @property
    def attached(self) -> bool:
        """True while a stack's probe still has hooks on the model."""
        return any(p.attached for p in self.probes.values())

    @property
    def n_handles(self) -> int:
        """Hook handles held by both stacks' probes (0 once removed)."""
        return sum(p.n_handles for p in self.probes.values())

    def attach(self) -> "EncoderDecoderProbe":
        """Register both stacks' hooks again after :meth:`remove` (recordings kept)."""
        for probe in self.probes.values():
            probe.attach()
        return self

    def remove(self) -> None:
        """Remove exactly the hooks of both stacks' probes. Safe to call twice."""
        for probe in self.probes.values():
            probe.remove()

    def clear(self) -> None:
        """Forget both recordings, keep the hooks."""
        for probe in self.probes.values():
            probe.clear()

    def invalidate(self) -> None:
        """Forget every cached analysis result of both stacks (see :meth:`Probe.invalidate`)."""
        for probe in self.probes.values():
            probe.invalidate()

    def analyze(self, options: Any = None, **keywords: Unpack[AnalyzeKeywords]
                ) -> dict[str, Report]:
        """One lazy :class:`Report` per stack, ``{"encoder": ..., "decoder": ...}``; the
        arguments are those of :meth:`Probe.analyze` and apply to both stacks."""
        return {name: p.analyze(options, **keywords) for name, p in self.probes.items()}

    def __enter__(self) -> "EncoderDecoderProbe":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def __repr__(self) -> str:
        return (f"EncoderDecoderProbe({self.anatomy.family}, "
                + ", ".join(f"{k}={v!r}" for k, v in self.probes.items()) + ")")
