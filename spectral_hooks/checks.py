"""The one home of argument checks: every public entry point validates its arguments here.

Each check returns the (normalised) value or raises one error of :mod:`spectral_hooks.errors`,
one line, ``argument=value is not valid: expected ...``, by the kind of bad input:

- the wrong type: :class:`~spectral_hooks.errors.OptionTypeError` (a TypeError and a ValueError);
- the right type, a value out of range or not among the choices:
  :class:`~spectral_hooks.errors.OptionError` (a ValueError);
- a layer index out of range: :class:`~spectral_hooks.errors.LayerIndexError` (an IndexError
  and a ValueError).

A model, module, tensor or array in a message is named by its type and shape, never its repr.

    >>> check_int("k", 0, minimum=1)
    Traceback (most recent call last):
    ...
    spectral_hooks.errors.OptionError: k=0 is not valid: expected an int >= 1
    >>> check_int("k", "2", minimum=1)
    Traceback (most recent call last):
    ...
    spectral_hooks.errors.OptionTypeError: k='2' is not valid: expected an int >= 1
    >>> check_float("gap", 0.1, above=0, below=1)
    0.1

Imports nothing of the package but its errors (any module may use it, linalg included).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection
from typing import Any, Literal, Optional, Union, overload

import torch
from torch import Tensor

from .errors import LayerIndexError, OptionError, OptionTypeError


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer (a Python or NumPy int), not a bool.

    >>> is_int(3), is_int(True), is_int(3.0)
    (True, False, False)
    """
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) \
        and type(value).__name__ != "bool_"


def _int_range(minimum: Optional[int], maximum: Optional[int]) -> str:
    if minimum is not None and maximum is not None:
        return f"an int in [{minimum}, {maximum}]"
    if minimum is not None:
        return f"an int >= {minimum}"
    return "an int" if maximum is None else f"an int <= {maximum}"


@overload
def check_int(name: str, value: Any, *, minimum: Optional[int] = None,
              maximum: Optional[int] = None, allow_none: Literal[False] = False,
              accepted: str = "", hint: str = "") -> int: ...


@overload
def check_int(name: str, value: Any, *, minimum: Optional[int] = None,
              maximum: Optional[int] = None, allow_none: bool,
              accepted: str = "", hint: str = "") -> Optional[int]: ...


def check_int(name: str, value: Any, *, minimum: Optional[int] = None,
              maximum: Optional[int] = None, allow_none: bool = False,
              accepted: str = "", hint: str = "") -> Optional[int]:
    """``value`` as an int (not a bool) in [minimum, maximum] (bounds that are given), or None
    when ``allow_none``. ``accepted`` replaces the generated "an int >= ..." in the message;
    ``hint`` (e.g. the function's name) ends it in parentheses.

    >>> check_int("top_k", 3, minimum=1, maximum=5), check_int("seed", None, allow_none=True)
    (3, None)
    """
    if value is None and allow_none:
        return None
    want = accepted or _int_range(minimum, maximum) + (" or None" if allow_none else "")
    if value is None or not is_int(value):
        raise OptionTypeError(name, value, want, hint=hint)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise OptionError(name, value, want, hint=hint)
    return int(value)


@overload
def check_float(name: str, value: Any, *, minimum: Optional[float] = None,
                maximum: Optional[float] = None, above: Optional[float] = None,
                below: Optional[float] = None, allow_none: Literal[False] = False,
                accepted: str = "", hint: str = "") -> float: ...


@overload
def check_float(name: str, value: Any, *, minimum: Optional[float] = None,
                maximum: Optional[float] = None, above: Optional[float] = None,
                below: Optional[float] = None, allow_none: bool,
                accepted: str = "", hint: str = "") -> Optional[float]: ...


def check_float(name: str, value: Any, *, minimum: Optional[float] = None,
                maximum: Optional[float] = None, above: Optional[float] = None,
                below: Optional[float] = None, allow_none: bool = False,
                accepted: str = "", hint: str = "") -> Optional[float]:
    """``value`` as a finite float (an int is accepted, a bool is not) with ``minimum <= value
    <= maximum`` and ``above < value < below`` for the bounds given, or None when
    ``allow_none``. ``accepted`` replaces the generated description in the message.

    >>> check_float("min_cos", 1, minimum=0, maximum=1)
    1.0
    >>> check_float("tol", 2.0, above=0, below=1)
    Traceback (most recent call last):
    ...
    spectral_hooks.errors.OptionError: tol=2.0 is not valid: expected a float in (0, 1)
    """
    if value is None and allow_none:
        return None
    want = accepted or _float_range(minimum, maximum, above, below) \
        + (" or None" if allow_none else "")
    if not isinstance(value, numbers.Real) or isinstance(value, bool) \
            or type(value).__name__ == "bool_":
        raise OptionTypeError(name, value, want, hint=hint)
    x = float(value)
    if not math.isfinite(x) or (minimum is not None and x < minimum) \
            or (maximum is not None and x > maximum) or (above is not None and x <= above) \
            or (below is not None and x >= below):
        raise OptionError(name, value, want, hint=hint)
    return x


def _float_range(minimum: Optional[float], maximum: Optional[float], above: Optional[float],
                 below: Optional[float]) -> str:
    low = f"[{minimum}" if minimum is not None else (f"({above}" if above is not None else "")
    high = f"{maximum}]" if maximum is not None else (f"{below})" if below is not None else "")
    if low and high:
        return f"a float in {low}, {high}"
    if low:
        return f"a float >= {minimum}" if minimum is not None else f"a float > {above}"
    if high:
        return f"a float <= {maximum}" if maximum is not None else f"a float < {below}"
    return "a finite float"


def check_bool(name: str, value: Any, *, allow_none: bool = False) -> Any:
    """``value`` if it is True or False (or None when ``allow_none``).

    >>> check_bool("dense", None, allow_none=True) is None
    True
    """
    if value is None and allow_none:
        return None
    if not isinstance(value, bool):
        raise OptionTypeError(name, value, "True, False or None" if allow_none
                              else "True or False")
    return value


def check_choice(name: str, value: Any, choices: Collection[Any], *, accepted: str = "",
                 hint: str = "") -> Any:
    """``value`` if it is one of ``choices`` (an OptionError otherwise).

    >>> check_choice("format", "csv", ("parquet", "csv"))
    'csv'
    """
    try:
        known = value in choices
    except TypeError:  # an unhashable value against a set
        known = False
    if not known:
        raise OptionError(name, value, accepted or f"one of {tuple(choices)}", hint=hint)
    return value


def check_type(name: str, value: Any, types: Union[type, tuple[type, ...]], accepted: str, *,
               hint: str = "") -> Any:
    """``value`` if it is an instance of ``types`` (an OptionTypeError naming ``accepted``
    otherwise).

    >>> check_type("metrics", {"loss": 1.0}, dict, "a mapping of name -> number")
    {'loss': 1.0}
    """
    if not isinstance(value, types):
        raise OptionTypeError(name, value, accepted, hint=hint)
    return value


def check_float_dtype(name: str, value: Any, *, allow_none: bool = False) -> None:
    """A floating-point torch.dtype (or None when ``allow_none``).

    >>> check_float_dtype("dtype", torch.float64)
    """
    if value is None and allow_none:
        return
    want = "a floating torch.dtype (e.g. torch.float64)" + (" or None" if allow_none else "")
    if not isinstance(value, torch.dtype):
        raise OptionTypeError(name, value, want)
    if not value.is_floating_point:
        raise OptionError(name, value, want)


def check_has_data(name: str, tensor: Tensor) -> None:
    """Not a meta tensor (shape only, no values to compute with).

    >>> try:
    ...     check_has_data("x", torch.zeros(2, device="meta"))
    ... except ValueError as err:
    ...     print(err)
    x='a tensor on device meta' is not valid: expected a tensor holding data (on the CPU or an accelerator)
    """
    if tensor.is_meta:
        raise OptionError(name, f"a tensor on device {tensor.device}",
                          "a tensor holding data (on the CPU or an accelerator)")


def real_vector(name: str, value: Any, *, length: int) -> Tensor:
    """``value`` as a finite, non-zero real vector of ``length`` (tensor, list or array).

    >>> real_vector("direction", [1.0, 0.0], length=2)
    tensor([1., 0.])
    """
    if not isinstance(value, Tensor):
        try:
            value = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError):
            raise OptionTypeError(name, value, f"a real vector of length {length} (a tensor)") \
                from None
    check_has_data(name, value)
    if value.ndim != 1 or value.shape[0] != length or not (
            value.is_floating_point() or value.dtype in (torch.int32, torch.int64)):
        raise OptionError(name, value, f"a real vector of length d_model={length}")
    if not bool(torch.isfinite(value.double()).all()) or float(value.double().norm()) == 0:
        raise OptionError(name, "a zero or non-finite vector", "a finite, non-zero vector")
    return value


def checked_layer(layer: Any, n_layers: int, *, argument: str = "layer",
                  model: str = "") -> int:
    """``layer`` in [-n_layers, n_layers) as 0..n_layers-1: an OptionTypeError for a non-int, a
    LayerIndexError (an IndexError and a ValueError) naming ``argument=layer`` otherwise.

    >>> checked_layer(-1, 4)
    3
    """
    if not is_int(layer):
        raise OptionTypeError(argument, layer, "an int layer index")
    if not -n_layers <= layer < n_layers:
        raise LayerIndexError(f"{argument}={layer!r} is out of range: this {model + ' ' if model else ''}"
                              f"model has {n_layers} layers (valid: 0..{n_layers - 1}, or "
                              f"-{n_layers}..-1 from the end)")
    return int(layer) % n_layers
