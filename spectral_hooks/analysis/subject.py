"""The subject of an analysis: what was recorded, and the model to replay blocks on.

    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> import spectral_hooks as sh
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
    >>> with sh.instrument(model) as probe, torch.no_grad():
    ...     _ = model(input_ids=torch.arange(16).reshape(2, 8))
    >>> subject = probe.subject   # what probe.analyze() hands to each section
    >>> subject.layers, subject.tokens("resid_post")[1].shape   # 2 x 8 real tokens of layer 1
    ((0, 1), torch.Size([16, 32]))

A frozen, typed view handed down to every section of ``analysis/``: sections read it and never
reach back up to the probe. ``record_on(model, seed)`` is how a section gets the same inputs
recorded on a freshly initialised model (the probe supplies it; analysis never hooks a model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Optional, cast

from torch import Tensor, nn

from ..anatomy import Anatomy
from ..errors import OptionError, RecordingError
from ..recording import Recording
from .cache import AnalysisCache


@dataclass(frozen=True, eq=False)
class Subject:
    """Anatomy + recording (+ how to record the same inputs on another model)."""

    anatomy: Anatomy
    recording: Recording
    cache: AnalysisCache
    record_on: Optional[Callable[[nn.Module], tuple[Anatomy, Recording]]] = None
    label: str = "trained"
    namespace: Hashable = "trained"  # keeps memo entries of different subjects apart
    #: (rank, world): analyse only this rank's share of the layers, every world-th one from
    #: rank (distributed analysis); give such a subject a namespace of its own, since tables
    #: are memoised without their layers
    share: Optional[tuple[int, int]] = None

    def memo(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per state of the weights and recording (see cache.py)."""
        return self.cache.get((self.namespace, key), compute)

    def working(self, key: Hashable, compute: Callable[[], Any], *, keep: int) -> Any:
        """A large working object: only the ``keep`` latest are cached (cache.get_working)."""
        return self.cache.get_working((self.namespace, key), compute, keep=keep)

    @property
    def model(self) -> nn.Module:
        """The model the anatomy describes."""
        return self.anatomy.model

    @property
    def layers(self) -> tuple[int, ...]:
        """The recorded layers (this rank's share of them in a distributed analysis)."""
        return self.share_of(self.recording.layers)

    @property
    def power_layers(self) -> tuple[int, ...]:
        """The recorded layers (this rank's share) that have an OV map: the power view's
        layers (a hybrid stack's Mamba or linear-attention layers have none)."""
        ov = set(self.anatomy.ov_layers)
        return tuple(layer for layer in self.layers if layer in ov)

    def share_of(self, layers: Iterable[int]) -> tuple[int, ...]:
        """``layers`` (all, or this rank's share of them: every world-th from rank)."""
        layers = tuple(layers)
        return layers if self.share is None else layers[self.share[0]::self.share[1]]

    @property
    def keeps_tokens(self) -> bool:
        """True when per-token activations are kept (not ``store="stats"``) and at least one
        forward was recorded.
        """
        rec = self.recording
        return rec.store != "stats" and bool(rec.steps)

    def tokens(self, capture: str) -> list[Optional[Tensor]]:
        """Per layer (all of the model's), the real tokens [n, d] of ``capture`` that the
        layers' F acts on (``anatomy.ov_tokens``: a multi-stream model's active stream), or
        None where the layer or capture was not recorded or only statistics were kept."""
        rec, anatomy = self.recording, self.anatomy
        if not self.keeps_tokens or capture not in rec.capture:
            return [None] * anatomy.n_layers
        return [anatomy.ov_tokens(rec.tokens(capture, layer)) if rec.has(capture, layer)
                else None for layer in range(anatomy.n_layers)]

    def shared_groups(self) -> list[tuple[int, ...]]:
        """Shared-weight groups the recording supports: resid_pre of the first application
        and resid_post of every application recorded, tokens kept."""
        rec = self.recording
        if rec.store == "stats" or not {"resid_pre", "resid_post"} <= set(rec.capture):
            return []
        return [g for g in self.anatomy.shared_groups if set(g) <= set(rec.layers)]

    def positions(self, spec: str | tuple[int, ...], sample: int) -> list[int]:
        """Recording rows to linearise at: "default" -> the anatomy's default position (the
        last real token of a text model, -1; a vision tower's CLS token, 0), "last" -> [-1]
        (the last real token), "all" -> every real prefill position of ``sample`` (decode
        steps cannot be replayed)."""
        if spec == "default":
            return [self.anatomy.default_position]
        if spec == "last":
            return [-1]
        rec = self.recording
        if rec.store == "stats":
            raise RecordingError("jacobian.positions: a stats-only recording (store='stats') "
                                 "keeps no positions; use positions='last' or record with "
                                 "store='device'")
        if not 0 <= sample < rec.n_samples:
            raise OptionError("jacobian.sample", sample,
                              f"a recorded batch row, 0..{rec.n_samples - 1}")
        real = (rec.mask[sample] != 0) & (rec.position_step[sample] == 0)
        if spec == "all":
            return real.nonzero().flatten().tolist()
        rows = real.nonzero().flatten().tolist()
        spec = cast("tuple[int, ...]", spec)  # the named specs are handled above
        bad = [p for p in spec if (p >= 0 and p not in rows) or (p < 0 and -p > len(rows))]
        if bad:
            raise OptionError("jacobian.positions", list(spec),
                              f"rows of real prefill tokens of sample {sample} ({rows}), or "
                              f"negative indices counting its {len(rows)} real tokens from "
                              "the end", hint=f"{bad} are out of range, padding or decode steps")
        return list(spec)
