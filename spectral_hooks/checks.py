"""Argument checks shared by the public entry points: each raises one error naming the
argument, the bad value and what is valid (spectral_hooks.errors.OptionError and kin).

    >>> check_int("k", 0, minimum=1)
    Traceback (most recent call last):
    ...
    spectral_hooks.errors.OptionError: k=0 is not valid: expected an int >= 1
    >>> check_int("k", "2", minimum=1)
    Traceback (most recent call last):
    ...
    spectral_hooks.errors.OptionTypeError: k='2' is not valid: expected an int >= 1

Imports nothing of the package but its errors (any module may use it, linalg included).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from .errors import LayerIndexError, OptionError, OptionTypeError


def check_int(name: str, value: Any, *, minimum: Optional[int] = None) -> int:
    """An int (not a bool), at least ``minimum`` when given."""
    want = "an int" if minimum is None else f"an int >= {minimum}"
    if not isinstance(value, int) or isinstance(value, bool):
        raise OptionTypeError(name, value, want)
    if minimum is not None and value < minimum:
        raise OptionError(name, value, want)
    return value


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise OptionTypeError(name, value, "True or False")
    return value


def check_float_dtype(name: str, value: Any, *, allow_none: bool = False) -> None:
    """A floating-point torch.dtype (or None when ``allow_none``)."""
    if value is None and allow_none:
        return
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise OptionError(name, value, "a floating torch.dtype (e.g. torch.float64)"
                          + (" or None" if allow_none else ""))


def check_has_data(name: str, tensor: Tensor) -> None:
    """Not a meta tensor (shape only, no values to compute with)."""
    if tensor.is_meta:
        raise OptionError(name, f"a tensor on device {tensor.device}",
                          "a tensor holding data (on the CPU or an accelerator)")


def real_vector(name: str, value: Any, *, length: int) -> Tensor:
    """``value`` as a finite, non-zero real vector of ``length`` (tensor, list or array)."""
    if not isinstance(value, Tensor):
        try:
            value = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError):
            raise OptionTypeError(name, value, f"a real vector of length {length} (a tensor)") \
                from None
    check_has_data(name, value)
    if value.ndim != 1 or value.shape[0] != length or not (
            value.is_floating_point() or value.dtype in (torch.int32, torch.int64)):
        raise OptionError(name, f"a {value.dtype} tensor of shape {tuple(value.shape)}",
                          f"a real vector of length d_model={length}")
    if not bool(torch.isfinite(value.double()).all()) or float(value.double().norm()) == 0:
        raise OptionError(name, "a zero or non-finite vector", "a finite, non-zero vector")
    return value


def checked_layer(layer: Any, n_layers: int, *, argument: str = "layer",
                  model: str = "") -> int:
    """``layer`` in [-n_layers, n_layers) as 0..n_layers-1: an OptionTypeError for a non-int, a
    LayerIndexError (an IndexError and a ValueError) naming ``argument=layer`` otherwise."""
    if not isinstance(layer, int) or isinstance(layer, bool):
        raise OptionTypeError(argument, layer, "an int layer index")
    if not -n_layers <= layer < n_layers:
        raise LayerIndexError(f"{argument}={layer!r} is out of range: this {model + ' ' if model else ''}"
                              f"model has {n_layers} layers (valid: 0..{n_layers - 1}, or "
                              f"-{n_layers}..-1 from the end)")
    return layer % n_layers
