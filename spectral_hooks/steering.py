"""Steering: a reversible rank-1 edit of one layer's attention output projection.

    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
    >>> u = torch.ones(32) / 32 ** 0.5
    >>> with steer(model, u, gap=0.5) as edit:
    ...     out = model(torch.arange(6)[None])       # tokens pulled toward u
    >>> edit.gap_after <= 0.5 < edit.gap_before
    True

The edit W_O' = W_O + alpha u w^T (METRICS.md section 1) makes F' = F + alpha u u_r^T, where
u_r is the part of u the value projection can reach (all of u unless GQA limits it).

A quantized output projection (bitsandbytes, torchao, quanto, HQQ) is never written: the edit goes
to a float additive term its forward adds (``anatomy.effective.additive_term``), removed with its
hook once the last edit of it is undone, so the layer is then exactly as it was.

Stack-safe: edits of one weight form a stack. Removing the newest edit copies back, bit-exactly,
the weight it found; removing an older one first leaves the weight as if only the remaining
edits had been applied (each keeps its own delta: it is not re-solved), and once every edit of a
weight is removed the original weight is back bit-exactly, whatever the order. Each removal
first checks that the weight still holds what the last edit wrote; if something else changed it
meanwhile, :class:`SteeringStateError` is raised before any weight is touched
(``remove(force=True)`` restores anyway).
"""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn

from .anatomy import anatomy_of, stack_of
from .anatomy.effective import release_additive_term
from .checks import check_bool, check_float, real_vector
from .errors import (
    NonFiniteComputationError,
    SpectralHooksError,
    UnsupportedModelError,
)
from .metrics.steering_math import rank1_output_edit


class SteeringStateError(SpectralHooksError, RuntimeError):
    """A steered weight was changed by something else while the edit was active."""


@dataclass(eq=False)
class Steering:
    """An applied steering edit and what it achieved (eigenvalues of the steered layer's F).

        >>> import torch
        >>> from transformers import GPT2Config, GPT2Model
        >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
        >>> with steer(model, torch.ones(32) / 32 ** 0.5, layer=1, gap=0.5) as edit:
        ...     edit.layer, edit.gap_after <= 0.5
        (1, True)
    """

    layer: int
    direction: Tensor
    alpha: float
    reachable_fraction: float
    lambda1_before: complex
    lambda1_after: complex
    gap_before: float
    gap_after: float
    residual_gap_before: float
    residual_gap_after: float
    eigvec_cos_after: float = math.nan  # |cos(v1, direction)| of the edited F (accepted >= min_cos)
    _param: Optional[nn.Parameter] = field(default=None, repr=False)
    _original: Optional[Tensor] = field(default=None, repr=False)  # the weight it found
    _delta: Optional[Tensor] = field(default=None, repr=False)  # float64, the parameter's layout

    @property
    def active(self) -> bool:
        """True until the edit is removed."""
        return self._param is not None

    def remove(self, *, force: bool = False) -> None:
        """Undo this edit (see the module docstring for any order). Safe to call twice.

        Raises SteeringStateError, touching nothing, when the weight no longer holds what the
        last edit wrote (changed by something else); ``force=True`` restores anyway.
        """
        check_bool("force", force)
        if self._param is None:
            return
        with _LOCK:
            _stack_of(self._param).remove(self, force=force)
        self._param = self._original = self._delta = None

    def __enter__(self) -> "Steering":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


class _Stack:
    """The active edits of one parameter, oldest first."""

    def __init__(self, param: nn.Parameter, base64: Tensor) -> None:
        self.param_ref = weakref.ref(param)
        self.base64 = base64  # the parameter (float64) under the oldest edit
        self.edits: list[Steering] = []
        self.written: Optional[Tensor] = None  # what the last write put in the parameter

    def check(self, param: nn.Parameter, what: str) -> None:
        if self.written is not None and not torch.equal(param.detach(), self.written):
            raise SteeringStateError(
                f"cannot {what}: layer {self.edits[-1].layer}'s output projection was changed "
                "by something else while a steering edit was active (an optimizer step, a load, "
                "another edit); nothing was touched. Call remove(force=True) to restore the "
                "weight found before steering anyway")

    def push(self, edit: Steering, param: nn.Parameter, new: Tensor) -> None:
        self.check(param, "apply a second edit")
        with torch.no_grad():
            param.copy_(new)
        self.edits.append(edit)
        self.written = param.detach().clone()

    def remove(self, edit: Steering, *, force: bool) -> None:
        param = self.param_ref()
        if param is None or edit not in self.edits:
            return
        if not force:
            self.check(param, f"remove the steering edit of layer {edit.layer}")
        i = self.edits.index(edit)
        with torch.no_grad():
            # an applied edit's _original, _delta and _to_param are set (Steering.apply)
            param.copy_(edit._original)  # pyright: ignore[reportArgumentType]  # bit-exactly
            acc = self.base64 + sum(e._delta for e in self.edits[:i]) if i else self.base64  # pyright: ignore
            for later in self.edits[i + 1:]:  # out of order: replay the later edits' deltas
                later._original = param.detach().clone()
                acc = acc + later._delta  # pyright: ignore[reportOperatorIssue]
                param.copy_(acc.to(param.dtype).to(param.device))
        del self.edits[i]
        self.written = param.detach().clone()
        if not self.edits:
            _STACKS.pop(id(param), None)
            release_additive_term(param)  # a quantized layer's term (zero again) and its hook


_LOCK = threading.RLock()
_STACKS: dict[int, _Stack] = {}


def _stack_of(param: nn.Parameter) -> _Stack:
    stack = _STACKS.get(id(param))
    if stack is None or stack.param_ref() is not param:
        raise SteeringStateError("this steering edit is not registered on its weight")
    return stack


def _check_options(alpha: Optional[float], gap: float, min_cos: float = 0.9) -> None:
    check_float("min_cos", min_cos, minimum=0, maximum=1,
                accepted="a float in [0, 1]: the accepted |cos(v1, direction)|")
    check_float("gap", gap, above=0, below=1,
                accepted="a float in (0, 1): the target |lambda2|/|lambda1|",
                hint="gap >= 1 holds for every matrix and would edit nothing")
    check_float("alpha", alpha, minimum=0, allow_none=True,
                accepted="None (solve for the gap) or a finite float >= 0",
                hint="a negative alpha pushes tokens away from the direction")


def steer(model: nn.Module, direction: Tensor, *, layer: int = -1, alpha: Optional[float] = None,
          gap: float = 0.1, min_cos: float = 0.9) -> Steering:
    """Edit layer ``layer``'s output projection, W_O' = W_O + alpha u w^T, so that
    F' = F + alpha u u_r^T (u = ``direction`` normalised, u_r its part reachable through W_V:
    u_r = u unless W_V is rank-deficient, e.g. GQA) has a principal eigenvector close to u.

    ``alpha=None`` picks the smallest alpha giving |lambda2|/|lambda1| <= ``gap`` with a real
    positive lambda1 whose eigenvector v1 has |cos(v1, u)| >= ``min_cos``, for F and for the
    residual update I + F alike (see
    :func:`~spectral_hooks.metrics.steering_math.rank1_output_edit`); v1 is u only in the limit
    alpha -> infinity. ``gap`` is in (0, 1), ``min_cos`` in [0, 1]; ``alpha``, when given, is
    finite and >= 0 (then ``gap`` and ``min_cos`` are not enforced: read ``gap_after`` and
    ``eigvec_cos_after``).
    ``gap_*`` report F's ratio, ``residual_gap_*`` that of I + F. Edits nest and interleave
    safely (module docstring).

        >>> import torch
        >>> from transformers import GPT2Config, GPT2Model
        >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
        >>> before = model.h[1].attn.c_proj.weight.detach().clone()
        >>> edit = steer(model, torch.ones(32) / 32 ** 0.5, layer=1, gap=0.5)
        >>> edit.gap_after <= 0.5
        True
        >>> edit.remove(); torch.equal(model.h[1].attn.c_proj.weight, before)  # bit-exact undo
        True
    """
    _check_options(alpha, gap, min_cos)
    anatomy = stack_of(anatomy_of(model), what="steer")
    index = anatomy.layer_index(layer)  # a LayerIndexError naming layer=... when out of range
    part = anatomy.layers[index]
    direction = real_vector("direction", direction, length=anatomy.d_model)
    W_V, W_O = part.value_weights(), part.output_weights()
    if not (bool(torch.isfinite(W_V).all()) and bool(torch.isfinite(W_O).all())):
        raise NonFiniteComputationError(
            f"layer {index}'s value or output projection weights hold NaN or Inf: steering "
            "cannot solve for the edit; restore finite weights (reload the checkpoint) first",
            layer=index)
    param, why = part.output.writable() if part.output is not None else (None, "")
    if param is None or part.output is None or part.output.to_param is None:
        raise UnsupportedModelError(f"{anatomy.family}: the output projection of layer {index} "
                                    f"cannot be written back ({why or 'no writable layout'}); "
                                    "steering needs a writable W_O")
    W_O64 = W_O.to("cpu", torch.float64)
    try:
        edit = rank1_output_edit(W_V.to("cpu", torch.float64), W_O64,
                                 direction.to("cpu", torch.float64), alpha=alpha, gap=gap,
                                 min_cos=float(min_cos))
    except BaseException:
        if id(param) not in _STACKS:
            release_additive_term(param)  # a quantized layer's term made for this edit
        raise
    # the parameter moves by the edit (an adapter's additive delta rides along unchanged)
    delta = part.output.to_param(edit.delta_W_O)
    expected = W_O64 + edit.delta_W_O  # now: W_O64 may be a view of the parameter
    new = (param.detach().to("cpu", torch.float64) + delta).to(param.dtype).to(param.device)
    result = Steering(layer=index, direction=direction.detach().clone(), alpha=edit.alpha,
                      reachable_fraction=edit.reachable_fraction,
                      lambda1_before=edit.lambda1_before, lambda1_after=edit.lambda1_after,
                      gap_before=edit.gap_before, gap_after=edit.gap_after,
                      residual_gap_before=edit.residual_gap_before,
                      residual_gap_after=edit.residual_gap_after,
                      eigvec_cos_after=edit.eigvec_cos_after, _param=param,
                      _original=param.detach().clone(), _delta=delta)
    with _LOCK:
        stack = _STACKS.get(id(param))
        if stack is None or stack.param_ref() is not param:
            stack = _STACKS[id(param)] = _Stack(param, param.detach().to("cpu", torch.float64))
        stack.push(result, param, new)
    _check_effective(result, part.output.read, expected, index)
    return result


def _check_effective(edit: Steering, read: Callable[[], Tensor], expected: Tensor,
                     layer: int) -> None:
    """The forward's W_O now is the edited one (a guard on the effective-weight rule: an
    adapter that is not additive would leave it elsewhere); else undo and refuse."""
    got = read().to("cpu", torch.float64)
    eps = torch.finfo(edit._param.dtype).eps if edit._param is not None else 0.0
    scale = float(expected.abs().max()) or 1.0
    if float((got - expected).abs().max()) > 64 * eps * scale:
        edit.remove(force=True)
        raise UnsupportedModelError(
            f"layer {layer}'s output projection did not take the edit (its forward's weight is "
            "not the stored weight plus the edit, e.g. a non-additive adapter): nothing was "
            "changed; merge adapters (merge_and_unload()) before steering")
