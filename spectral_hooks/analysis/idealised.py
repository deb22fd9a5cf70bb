"""Section ``idealised`` (``analyze(idealised=True)``): paper 1's idealised dynamics, FFN-free,
L2-normalised, driven by the model's own layer matrices F_t (uniform attention, the default) or
by each head's own weights and its recorded attention pattern
(``idealised={"attention": "recorded"}``, capture point ``attn_pattern``), from the tokens that
entered the first recorded layer; per layer, predicted against observed (alignment with B_t,
consensus direction and rate, bipolar consensus, rotation), every spectral column in one ordering
(``idealised={"iterate": ...}``, default "I+F": the matrix the dynamics iterates).

    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> import spectral_hooks as sh
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
    >>> with sh.instrument(model) as probe, torch.no_grad():
    ...     _ = model(input_ids=torch.arange(16).reshape(2, 8))
    >>> table = probe.analyze(idealised=True).idealised      # idealised_section
    >>> table[["layer", "attention", "iterate"]].values.tolist()
    [[0, 'uniform', 'I+F'], [1, 'uniform', 'I+F']]
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch
from torch import Tensor

from ..anatomy.weights import head_weights
from ..errors import RecordingError
from ..metrics.idealised_table import idealised_table
from .options import AnalyzeOptions
from .power import layer_matrices_of
from .subject import Subject


def idealised_unavailable(subject: Subject) -> str | None:
    """Why the section cannot be computed from this recording (None: it can)."""
    rec = subject.recording
    if not subject.keeps_tokens or "resid_pre" not in rec.capture:
        return "it needs the tokens of resid_pre (store='device' or 'cpu', capture resid_pre)"
    anatomy = subject.anatomy
    if len(anatomy.ov_layers) < anatomy.n_layers:
        return (f"the idealised dynamics apply F through every layer, and there are "
                f"{anatomy.power_coverage()}")
    return None


def check_idealised_request(subject: Subject, options: AnalyzeOptions) -> None:
    """RecordingError when recorded attention is asked for and the recording cannot give it."""
    if options.idealised_options.attention != "recorded":
        return
    rec = subject.recording
    if "attn_pattern" not in rec.capture:
        raise RecordingError(
            "idealised={'attention': 'recorded'} needs the attention patterns, capture point "
            "attn_pattern (blocks.<l>.attn.hook_pattern), which was not captured: "
            "instrument(model, capture=['resid_pre', 'resid_post', 'attn_pattern']) on a model "
            "loaded with attn_implementation='eager'")
    first = min(subject.layers)
    missing = [t for t in range(first, subject.anatomy.n_layers) if t not in rec.layers]
    if missing:
        raise RecordingError(
            f"idealised={{'attention': 'recorded'}} runs the dynamics through every layer from "
            f"{first} on, and layers {missing} were not recorded: instrument with layers=None")


def _real(mask_row):
    return (mask_row != 0).nonzero().flatten()


def start_tokens(subject: Subject, layer: int) -> list[Tensor]:
    """Per recorded sequence, its real tokens entering ``layer`` (in recording order)."""
    rec = subject.recording
    X, mask = subject.anatomy.ov_tokens(rec.tensor("resid_pre", layer)), rec.mask.to("cpu")
    X = X.detach().to("cpu")
    return [X[b][mask[b] != 0] for b in range(X.shape[0]) if bool((mask[b] != 0).any())]


def recorded_patterns(subject: Subject, first: int) -> list[Any]:
    """patterns[t - first][s]: layer t's recorded attention [H, n_s, n_s] of sequence s,
    restricted to its real tokens (queries and keys), float64 on the CPU."""
    rec = subject.recording
    mask = rec.mask.to("cpu")
    rows = [b for b in range(mask.shape[0]) if bool((mask[b] != 0).any())]
    out = []
    for t in range(first, subject.anatomy.n_layers):
        P = rec.attn_pattern[t].detach().to("cpu", torch.float64)
        out.append([P[b][:, _real(mask[b])][:, :, _real(mask[b])] for b in rows])
    return out


def idealised_section(subject: Subject, options: AnalyzeOptions) -> pd.DataFrame:
    """The ``idealised`` table: one row per recorded layer, predicted against observed.

    Raises RecordingError (one line) when the recording cannot drive the dynamics (see
    :func:`idealised_unavailable`) or ``attention="recorded"`` lacks the patterns. Memoised on
    ``subject`` by (iterate, fold_norm, attention).
    """
    attention = options.idealised_options.attention
    iterate = options.idealised_options.iterate  # one ordering for the table (not options.iterate)

    def compute() -> pd.DataFrame:
        reason = idealised_unavailable(subject)
        if reason is not None:
            raise RecordingError(f"section idealised: {reason}")
        check_idealised_request(subject, options)
        F = layer_matrices_of(subject, fold_norm=options.fold_norm)
        first = min(subject.layers)
        heads = patterns = None
        if attention == "recorded":
            heads = [None] * first + head_weights(subject.anatomy, fold_norm=options.fold_norm
                                                  )[first:]
            patterns = [None] * first + recorded_patterns(subject, first)
        return idealised_table(
            F, start_tokens(subject, first), subject.tokens("resid_pre"),
            subject.tokens("resid_post"), first=first, layers=list(subject.layers),
            iterate=iterate, causal=bool(subject.anatomy.causal),
            heads=heads,  # pyright: ignore[reportArgumentType]  # None below `first`: unused
            patterns=patterns)  # pyright: ignore[reportArgumentType]  # likewise
    return subject.memo(("idealised", iterate, options.fold_norm, attention), compute)
