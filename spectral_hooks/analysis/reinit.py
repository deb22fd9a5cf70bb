"""The control: the same inputs recorded on a freshly initialised model of the same config.

    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> import spectral_hooks as sh
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
    >>> with sh.instrument(model) as probe, torch.no_grad():
    ...     _ = model(input_ids=torch.arange(16).reshape(2, 8))
    >>> subject = probe.subject   # what probe.analyze() hands to each section
    >>> init = init_subject(subject, seed=1)          # the same inputs, a fresh GPT2Model
    >>> init.label, init.recording.resid_post[1].shape
    ('init', torch.Size([2, 8, 32]))
"""

from __future__ import annotations

from typing import Callable

from torch import nn

from ..anatomy import Anatomy
from ..anatomy.base import fresh_model
from ..errors import RecordingError
from ..recording import Recording
from .cache import AnalysisCache
from .subject import Subject


def _check(subject: Subject) -> Callable[[nn.Module], tuple[Anatomy, Recording]]:
    if subject.record_on is None:
        raise RecordingError("reinit needs a way to record the inputs on a fresh model; this "
                             "subject has none (analyse through probe.analyze)")
    return subject.record_on


def init_subject(subject: Subject, *, seed: int) -> Subject:
    """``subject``'s inputs recorded on a fresh model (``seed``), computed once per state."""
    record_on = _check(subject)

    def compute() -> Subject:
        anatomy, recording = record_on(fresh_model(subject.model, seed=seed))
        return Subject(anatomy=anatomy, recording=recording, cache=subject.cache,
                       label="init", namespace=("init", seed))
    return subject.memo(("init_subject", seed), compute)


def transient_init_subject(subject: Subject, *, seed: int) -> Subject:
    """Like :func:`init_subject`, but neither it nor what is computed on it is kept in the
    trained subject's cache (its own cache goes with it): many seeds, one model in memory."""
    record_on = _check(subject)
    anatomy, recording = record_on(fresh_model(subject.model, seed=seed))
    return Subject(anatomy=anatomy, recording=recording,
                   cache=AnalysisCache(anatomy.model, recording), label="init",
                   namespace=("init", seed))
