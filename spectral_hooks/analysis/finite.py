"""NaN and Inf: found once, before anything is computed, and named where they are.

    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> import spectral_hooks as sh
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
    >>> with sh.instrument(model) as probe, torch.no_grad():
    ...     _ = model(input_ids=torch.arange(16).reshape(2, 8))
    >>> probe.recording.resid_post[1][0, 3] = float("nan")   # as an overflow would leave it
    >>> check_recording_finite(probe.recording)
    Traceback (most recent call last):
    ...
    spectral_hooks.errors.NonFiniteError: NaN in the recording at layer 1, sample 0, token 3
    (capture point: resid_post, ...

The recording is scanned in forward order (layer by layer; within a layer the block input,
resid_pre, attn_out, resid_post), real tokens only (padding never counts downstream), so the
error names the first place a non-finite value appeared. Values that arise later, inside a
computation from finite inputs, are named where they arise: F = W_O W_V here, block replays in
``linearize.finite``.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import torch
from torch import Tensor

from ..errors import NonFiniteComputationError, NonFiniteError, RecordingError
from ..recording import Recording
from ..recording.points import BLOCK_INPUT, PER_TOKEN, RUN_ORDER, describe

#: forward order within a layer: the block's input, then its token-vector points as it runs them
ORDER = (BLOCK_INPUT,) + tuple(point for point in RUN_ORDER if point in PER_TOKEN)


def _value(x: Tensor) -> str:
    return "NaN" if bool(torch.isnan(x).any()) else "Inf"


def _block_input(recording: Recording, layer: int, sample: int) -> Optional[tuple]:
    """(hidden [P, d], real prefill mask [P]) of the block input, or None if not kept."""
    try:
        hidden = recording.block_input(layer, sample).hidden[0]
    except (RecordingError, IndexError):
        return None  # not replayable: the Jacobian view says so itself
    real = (recording.mask[sample] != 0) & (recording.position_step[sample] == 0)
    return hidden, real[: hidden.shape[0]].to(hidden.device)


def _tensors(recording: Recording, layer: int, sample: Optional[int]) -> Iterator[tuple]:
    """(capture, tensor [B, P, d], mask [B, P], first sample) in forward order."""
    for capture in ORDER:
        if capture == BLOCK_INPUT:
            found = None if sample is None else _block_input(recording, layer, sample)
            if found is not None:
                yield capture, found[0][None], found[1][None], sample
        elif recording.has(capture, layer):
            x = recording.tensor(capture, layer)
            yield capture, x, recording.mask.to(x.device) != 0, 0


def _host_values(values: list[Tensor]) -> list[Any]:
    """0-dim tensors as Python numbers, one read a device (not one a tensor)."""
    out: list[Any] = [None] * len(values)
    by_device: dict[torch.device, list[int]] = {}
    for i, v in enumerate(values):
        by_device.setdefault(v.device, []).append(i)
    for index in by_device.values():
        for i, value in zip(index, torch.stack([values[i] for i in index]).tolist()):
            out[i] = value
    return out


def _check_stats(recording: Recording) -> None:
    found = [(layer, capture, recording.stats(capture, layer)) for layer in recording.layers
             for capture in ORDER[1:] if capture in recording.capture]
    finite = _host_values([torch.isfinite(stats.mean).all() & torch.isfinite(stats.cov).all()
                           for _, _, stats in found])
    for (layer, capture, stats), ok in zip(found, finite):
        if not ok:
            raise NonFiniteError.at(layer=layer, capture=capture,
                                    description=describe(capture),
                                    value=_value(stats.mean))


def check_recording_finite(recording: Recording, *, sample: Optional[int] = None) -> None:
    """Raise one :class:`NonFiniteError` naming the first non-finite recorded value (layer,
    sample, token, capture point); ``sample``: also check that row's replayable block inputs."""
    if recording.store == "stats":
        _check_stats(recording)
        return
    first: Optional[dict[str, Any]] = None
    found = [(layer, capture, x, offset, ~torch.isfinite(x).all(dim=-1) & real)
             for layer in recording.layers
             for capture, x, real, offset in _tensors(recording, layer, sample)]
    n_bad = _host_values([bad.sum() for *_, bad in found])  # one read, not one a tensor
    for (layer, capture, x, offset, bad), n in zip(found, n_bad):
        if n and first is None:
            s, t = (int(i) for i in bad.nonzero()[0])
            first = dict(layer=layer, capture=capture, description=describe(capture),
                         sample=s + offset, position=t, value=_value(x[s, t]))
    count = sum(n_bad)
    if first is not None:
        more = "" if count == 1 else (f"; {count} (capture point, token) pairs are non-finite "
                                      "in all, this is the first in forward order")
        raise NonFiniteError.at(**first, more=more)


def check_layer_matrices_finite(F: Tensor, layers: tuple[int, ...]) -> None:
    """F_t = W_O W_V of every analysed layer is finite, else name the first layer that is not."""
    finite = _host_values([torch.isfinite(F[layer]).all() for layer in layers])
    for layer, ok in zip(layers, finite):
        if not ok:
            raise NonFiniteComputationError(
                f"F = W_O W_V of layer {layer} holds {_value(F[layer])}: layer {layer}'s value "
                "or output projection weights are not finite or so large that their product "
                f"overflows (check p.abs().max() of layer {layer}'s attention parameters, e.g. "
                "after a diverged optimizer step); restore finite weights, then analyse again",
                layer=layer)
