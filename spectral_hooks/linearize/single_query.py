"""Single-query token functions: only row p is recomputed, earlier keys/values held fixed.

Two modes, tried in this order and each used only after a check against the full-sequence
block:

* ``split`` (HF blocks whose attention core is pluggable, see ``anatomy.hf``): the cache hands
  the attention only the new key/value and :func:`_split_attention` scores the query against
  the fixed keys and the new one separately. Forward AD then never carries the (zero) tangents
  of the p fixed keys/values, and the block also runs on a *batch* of c query rows at once
  (:meth:`SingleQueryFunction.batched`), so c JVPs become one matrix-matrix pass.
* ``concat``: the cache returns the fixed keys/values concatenated with the new ones and the
  block's own attention runs (any HF Cache block).

Every architecture fact used here comes from the anatomy's
:class:`~spectral_hooks.anatomy.calls.BlockCallConvention` (carried by the BlockFunction): the
cache keyword, whether the attention core is pluggable, the core's calling convention and the
score-modifying keywords the split core must refuse; switching the core is
:func:`~spectral_hooks.anatomy.hf.attention_implementation`.

Not thread-safe: while a split-mode replay runs, the block's HF config names the split core, so
a forward of the same model from another thread meanwhile raises a RuntimeError.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from typing import TYPE_CHECKING, List, Optional, cast

import torch
from torch import Tensor
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten

from ..anatomy.hf import attention_implementation, register_attention
from ..errors import fallback
from ..recording import map_tensors
from .function import REPLAY_ERRORS, BlockFunction, agreement_tol, first_output, math_sdpa

if TYPE_CHECKING:
    from ..anatomy.calls import BlockCallConvention

log: logging.Logger = logging.getLogger("spectral_hooks.linearize")
SPLIT_ATTENTION = "spectral_hooks_single_query"
_PENDING: contextvars.ContextVar = contextvars.ContextVar("spectral_hooks_fixed_kv",
                                                          default=None)
#: A duck-typed cache in an unknown block can fail in any of these ways (a missing cache
#: method, a mis-sliced input), besides what a transform raises.
_SINGLE_QUERY_ERRORS = REPLAY_ERRORS + (AttributeError, IndexError, KeyError)


def _split_attention(module, query: Tensor, key: Tensor, value: Tensor, attention_mask,
                     scaling: Optional[float] = None, dropout: float = 0.0, softcap=None,
                     **kwargs):
    """softmax([q K_fixed^T, q k_new^T] * scaling + mask) [V_fixed; v_new], per head.

    query [c, h, 1, dh]; key/value [c, h_kv, 1, dh] (the new row only); the fixed ones
    [1, h_kv, p, dh] come from the cache (set by :class:`FixedKV`). The products with the
    fixed keys/values fold the c rows and the h / h_kv query heads of a KV group into one
    matrix per KV head, so nothing of size c x p x dh is ever materialised.
    """
    fixed = _PENDING.get()
    _PENDING.set(None)
    if fixed is None:
        raise RuntimeError("single-query attention called without fixed keys/values")
    Kf, Vf, refused = fixed
    bad = [k for k in refused if kwargs.get(k) is not None]
    if bad or dropout:
        raise NotImplementedError(f"single-query split attention: unsupported {bad or 'dropout'}")
    c, h, q1, dh = query.shape
    hk, p = Kf.shape[1], Kf.shape[2]
    g = h // hk
    if scaling is None:
        scaling = dh ** -0.5
    qh = query.permute(1, 0, 2, 3).reshape(hk, g * c * q1, dh)
    s_fixed = (qh @ Kf[0].transpose(-1, -2)).reshape(h, c, q1, p).permute(1, 0, 2, 3)
    if g > 1:
        key, value = key.repeat_interleave(g, 1), value.repeat_interleave(g, 1)
    s = torch.cat([s_fixed, query @ key.transpose(-1, -2)], dim=-1) * cast(float, scaling)
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            s = s.masked_fill(~attention_mask, float("-inf"))
        else:
            s = s + attention_mask
    a = torch.softmax(s, dim=-1).to(value.dtype)
    a_fixed = a[..., :p].permute(1, 0, 2, 3).reshape(hk, g * c * q1, p)
    out = (a_fixed @ Vf[0]).reshape(h, c, q1, dh).permute(1, 0, 2, 3) + a[..., p:] @ value
    return out.transpose(1, 2), None


_REGISTERED: list[bool] = []  # [registered?] once done: registered once per process


def _split_registered() -> bool:
    """Register the split core with HF on first use (importing ``AttentionInterface`` pulls in
    ``transformers.modeling_utils``, seconds of imports, so not at package import)."""
    if not _REGISTERED:
        _REGISTERED.append(register_attention(SPLIT_ATTENTION, _split_attention))
    return _REGISTERED[0]


class _CacheFilled(Exception):
    """Raised by the fill's ``cache.update``: the rest of that forward (the attention and MLP
    of the p earlier rows) is not needed, as baukit's ``StopForward`` ends a forward early."""


class FixedKV:
    """A duck-typed KV cache holding the recorded keys/values of the earlier positions.

    The first ``update`` (the fill, on positions < p) stores them and ends that forward
    (:class:`_CacheFilled`). Afterwards ``update``
    returns them concatenated with the new ones (``split=False``), or stashes them for
    :func:`_split_attention` and returns the new ones only (``split=True``). It never grows.
    """

    def __init__(self, split: bool = False, refused: tuple[str, ...] = ()) -> None:
        self.keys: Optional[Tensor] = None
        self.values: Optional[Tensor] = None
        self.split = split
        self.refused = refused  # score-modifying core keywords the split core refuses

    def update(self, key_states, value_states, *args, **kwargs):
        """The HF cache hook a block's attention calls with its new keys / values: fills the
        cache on first call, then returns the keys / values to attend to.
        """
        if self.keys is None:  # filling: the block runs on the earlier positions once
            self.keys, self.values = key_states.detach(), value_states.detach()
            raise _CacheFilled
        if self.split:
            _PENDING.set((self.keys, self.values, self.refused))
            return key_states, value_states
        assert self.values is not None  # filled with the keys
        return (torch.cat([self.keys, key_states], dim=-2),
                torch.cat([self.values, value_states], dim=-2))

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """The number of fixed earlier positions (0 before the fill)."""
        return 0 if self.keys is None else int(self.keys.shape[-2])


def slice_call(call, L: int, rows: slice, cols: slice, hidden: Tensor, cache,
                cache_slot: tuple) -> tuple:
    """A block call's arguments for query rows ``rows`` attending to key columns ``cols``.

    Masks, ALiBi key biases and per-position tensors (position ids, rotary cos/sin) of the
    recorded call (sequence length ``L``) are cut to those rows / columns, ``hidden`` becomes
    the hidden states and ``cache`` goes where the block takes its cache.

    Args:
        cache_slot: ``(keyword, positional index or None)`` of the block's cache argument.

    Returns:
        ``(args, kwargs)`` for the block.
    """
    def cut(t: Tensor) -> Tensor:
        if t.ndim == 4 and t.shape[-1] == L and t.shape[-2] == L:  # [b, h, q, k] mask
            return t[..., rows, cols]
        if t.ndim == 3 and t.shape[-2] == 1 and t.shape[-1] == L:  # [b h, 1, k] key bias
            return t[..., cols]  # (ALiBi: BLOOM, Falcon); the replay is checked regardless
        if t.ndim >= 2 and t.shape[1] == L:  # position ids, rotary cos/sin [b, L, ...]
            return t[:, rows]
        return t
    args, kwargs = call.with_hidden(hidden)
    args = [args[0]] + list(map_tensors(tuple(args[1:]), cut))
    kwargs = map_tensors(kwargs, cut)
    name, index = cache_slot
    if index is not None and index < len(args):
        args[index] = cache
    else:
        kwargs[name] = cache
    return tuple(args), kwargs


class SingleQueryFunction:
    """f(x) = block output at p with only row p recomputed (causal models, HF Cache blocks).

    The keys/values of positions < p are computed once from the recording and held fixed;
    each call runs the block on one query row, so a JVP costs ~1/L of a full-sequence one.
    ``split=True``: the split attention core (module doc); then :meth:`batched` runs c rows
    at once. Built only after checking it against the full-sequence :class:`BlockFunction`.
    """

    full_fn: BlockFunction
    block: torch.nn.Module
    params: dict[str, Tensor]
    layer: int
    sample: int
    positions: Tensor
    rows: tuple[int, ...]
    x0: Tensor
    split: bool
    convention: BlockCallConvention
    cache: FixedKV

    def __init__(self, full: BlockFunction, *, split: bool = False) -> None:
        self.full_fn = full
        self.block, self.params = full.block, full.params
        self.layer, self.sample, self.positions, self.x0 = (full.layer, full.sample,
                                                             full.positions, full.x0)
        self.rows = full.rows
        p = full.rows[0]
        L = full.hidden.shape[1]
        self.split = split
        self.convention = full.convention
        self.cache = FixedKV(refused=self.convention.score_modifier_kwargs)
        self._L, self._p = L, p
        slot = self.convention.cache_slot(self.block)
        if slot is None:
            raise RuntimeError(f"{type(self.block).__name__}.forward takes no KV cache argument "
                               f"(none of {self.convention.cache_kwargs})")
        self._slot = slot
        self._spec = None  # the sliced call as pytree leaves, built by _template()
        self._leaves: list = []
        self._hidden_slot = self._cache_leaf = -1
        self._tensor_slots: List[int] = []
        args, kwargs = slice_call(full.call, L, slice(0, p), slice(0, p),
                                   full.hidden[:, :p], self.cache, self._slot)
        with contextlib.suppress(_CacheFilled):  # the fill's forward ends at cache.update
            with torch.no_grad(), math_sdpa(), self.convention.replaying(self.block):
                torch.func.functional_call(self.block, self.params, args, kwargs)
        if self.cache.keys is None:
            raise RuntimeError("the block did not call cache.update")
        self.cache.split = split

    def _core(self):
        if not self.split:
            return contextlib.nullcontext()
        return attention_implementation(self.block, SPLIT_ATTENTION)

    def batched(self, X: Tensor) -> Tensor:
        """X [c, 1, d] (c query rows, each the token at p) -> block outputs [c, 1, d]."""
        return self.batched_with(self.inputs(), X)

    def inputs(self) -> List[Tensor]:
        """Every tensor the block call reads besides X: parameters/buffers, the fixed keys and
        values, and the recorded call's other tensors (mask, positions, rotary cos/sin)."""
        self._template()
        return [*self.params.values(), cast(Tensor, self.cache.keys), cast(Tensor, self.cache.values),
                *(self._leaves[i] for i in self._tensor_slots)]

    def use_inputs(self, inputs: List[Tensor]) -> None:
        """Read its tensors from ``inputs`` from now on (same order, shapes and values as
        :meth:`inputs`): views into a layer group's stacked copy, so the weights are held
        once (``linearize.group``)."""
        self._template()
        n = len(self.params)
        for name, t in zip(list(self.params), inputs[:n]):
            self.params[name] = t
        self.cache.keys, self.cache.values = inputs[n], inputs[n + 1]
        for i, t in zip(self._tensor_slots, inputs[n + 2:]):
            self._leaves[i] = t

    def batched_with(self, inputs: List[Tensor], X: Tensor) -> Tensor:
        """:meth:`batched` as a pure function of ``inputs`` (same order as :meth:`inputs`):
        one traced graph then serves every block of the same structure (see shared.py)."""
        self._template()
        n = len(self.params)
        params = dict(zip(self.params, inputs[:n]))
        cache = FixedKV(split=self.split, refused=self.convention.score_modifier_kwargs)
        cache.keys, cache.values = inputs[n], inputs[n + 1]
        leaves = list(self._leaves)
        leaves[self._hidden_slot] = X
        leaves[self._cache_leaf] = cache
        for i, t in zip(self._tensor_slots, inputs[n + 2:]):
            leaves[i] = t
        args, kwargs = tree_unflatten(leaves, cast(TreeSpec, self._spec))  # set by _template
        _PENDING.set(None)
        with math_sdpa(), self._core(), self.convention.replaying(self.block):
            out = torch.func.functional_call(self.block, params, args, kwargs)
        return first_output(out)

    def _template(self) -> None:
        """The sliced call (row p, keys 0..p) as pytree leaves, with slots for X, the cache
        and the other tensors."""
        if self._spec is not None:
            return
        p, marker = self._p, torch.empty(0)
        args, kwargs = slice_call(self.full_fn.call, self._L, slice(p, p + 1),
                                   slice(0, p + 1), marker, self.cache, self._slot)
        leaves, self._spec = tree_flatten((args, kwargs))
        self._leaves = leaves
        self._hidden_slot = next(i for i, x in enumerate(leaves) if x is marker)
        self._cache_leaf = next(i for i, x in enumerate(leaves) if x is self.cache)
        self._tensor_slots = [i for i, x in enumerate(leaves)
                              if isinstance(x, Tensor) and x is not marker]

    def __call__(self, X: Tensor) -> Tensor:
        return self.batched(X[None])[0]


def _check(sq: SingleQueryFunction, fn: BlockFunction) -> float:
    """Relative disagreement with the full-sequence block at a perturbed input (and, split
    mode, of a batch of two rows with the one-row calls)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    delta = torch.randn((2, *fn.x0.shape), generator=g, dtype=torch.float64).to(fn.x0)
    xs = fn.x0 + 0.1 * delta * fn.x0.abs().max()
    with torch.no_grad():
        b = fn(xs[0])
        if sq.split:  # row 0 of a batch of two against the full sequence, row 1 alone
            ab = sq.batched(xs)
            a, a1 = ab[0], sq(xs[1])
            errs = [(ab[1] - a1).norm() / a1.norm().clamp_min(1e-30)]
        else:
            a, errs = sq(xs[0]), []
        errs.append((a - b).norm() / b.norm().clamp_min(1e-30))
    values = torch.stack(errs).tolist()  # one read for both
    return max(values[0] if sq.split else 0.0, values[-1])


def single_query_function(fn: BlockFunction) -> Optional[SingleQueryFunction]:
    """The verified single-query function (split mode where it works, else concat), or None
    where it does not apply or disagrees with the full sequence.

    A block whose family takes no replayable cache (``call_convention.cache_kwargs`` empty:
    TransformerLens) runs the full sequence quietly; any other failure is a fallback."""
    if len(fn.rows) != 1 or fn.rows[0] == 0:
        return None
    if not fn.convention.cache_kwargs:
        return None
    tol = agreement_tol(fn.x0.dtype)
    split_ok = _split_registered() and fn.convention.pluggable_attention
    modes = (True, False) if split_ok else (False,)
    for split in modes:
        try:
            sq = SingleQueryFunction(fn, split=split)
            err = _check(sq, fn)
        except _SINGLE_QUERY_ERRORS as err:  # not an HF Cache block: use the full sequence
            log.info("single-query path (split=%s) unavailable for layer %d: %s", split,
                     fn.layer, err)
            continue
        if err <= tol:
            if not split and len(modes) > 1:
                fallback("linearize.concat_single_query",
                         f"split single-query attention is unavailable for layer {fn.layer}: "
                         "its own attention runs on concatenated keys/values, one query row "
                         "per JVP (no batched JVPs, several times slower per column)")
            return sq
        log.info("single-query path (split=%s) disagrees for layer %d (%.1e)", split, fn.layer,
                 err)
    fallback("linearize.full_sequence",
             f"no verified single-query replay for layer {fn.layer}: the full sequence is "
             f"replayed (a JVP costs ~{fn.hidden.shape[1]} times more)")
    return None
