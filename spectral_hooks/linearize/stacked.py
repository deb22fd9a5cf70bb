"""All layers' token Jacobians from ONE linearisation: homogeneous blocks stacked under vmap.

The torch.func "model ensembling" pattern applied to block Jacobians. For a stack of blocks of
one class with identical parameter shapes and identical per-layer call inputs (mask, position
ids, rotary cos/sin), the single-query token function of every layer (see :mod:`.single_query`)
is the SAME code run on different parameters and different fixed past keys/values::

    g(X[L, 1, d]) = vmap_l( functional_call(template, params_l, x_l; kv_l) )

so ``torch.func.linearize(g, X0)`` is traced once for all L layers, and one call of the
linearised map computes every layer's J_l v_l (the Jacobian of g is block-diagonal).
:func:`stacked_block_jacobians` returns one :class:`~spectral_hooks.linalg.LinearOperator` per
layer; they share a :class:`StackedJacobians` ``batch_group``, which ``linalg.eigs`` /
``linalg.svds`` use to apply all members of a batch with one call per Krylov step.

Where blocks are not homogeneous (different classes or parameter shapes, per-layer attention
types such as Gemma sliding/global or GPT-Neo local/global, a per-layer call input that
differs) or the stacked function does not reproduce every layer's own single-query function at
a perturbed input (1e-9 relative in float64), it returns None and the caller uses
:func:`~spectral_hooks.linearize.block_jacobian` per layer.

Cost (measured, GPT-2-small-sized, 12 layers, 128 tokens, one CPU thread,
``benchmarks/jacobian_spectra.py --stacked``): one build for 12 layers 4.4 s vs 9 s for 12
per-layer linearisations, and one 12-layer JVP 58 ms vs 75 ms as 12 calls, yet ``eigs`` over the
12 stacked operators took 44 s vs 35-36 s per layer: the float64 JVP streams each layer's own
weights (no sharing), and in lockstep every call pays for all layers while their Krylov runs
restart and converge at different steps. Prefer per-layer operators on CPU.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence

import torch
from torch import Tensor

from ..errors import OptionError, fallback
from .finite import replay_error
from .function import (
    REPLAY_ERRORS,
    agreement_tol,
    block_function,
    first_output,
    linearize,
    math_sdpa,
)
from .operator import StackedBlockJacobian
from .single_query import FixedKV, single_query_function, slice_call

if TYPE_CHECKING:
    from ..anatomy import Anatomy
    from ..recording import Recording

log: logging.Logger = logging.getLogger("spectral_hooks.linearize")

__all__ = ["stacked_block_jacobians", "StackedJacobians"]


def _same(a, b) -> bool:
    """Structural equality of recorded call inputs (tensors bitwise, containers recursively)."""
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return (isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and bool(torch.equal(a, b)))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if a is b:
        return True
    try:
        return bool(a == b)
    except (TypeError, ValueError, RuntimeError):  # no truth value (arrays): not provably equal
        return False


def _kinds_differ(anatomy, layers: Sequence[int]) -> Optional[str]:
    """Why the layers' attention types (``anatomy.layer_kinds``) rule out one stacked form."""
    kinds = anatomy.layer_kinds
    if kinds is None or len({kinds[l] for l in layers}) <= 1:
        return None
    return f"the layers' attention types differ ({sorted(set(kinds[l] for l in layers))})"


class StackedJacobians:
    """The shared engine: g(X) over the stacked layers, its linearisation and VJP (lazy).

    ``matmat_all(X [L, d, c]) -> [L, d, c]`` applies J_l to X[l] for every stacked layer l in
    one call; ``rmatmat_all`` likewise with J_l^T. This is the ``batch_group`` protocol of
    ``spectral_hooks.linalg`` (``size``, ``dtype``, ``matmat_all``, ``rmatmat_all``).
    """

    g: Callable[[Tensor], Tensor]
    x0: Tensor
    layers: List[int]
    sample: int
    positions: tuple[int, ...]
    size: int
    n: int
    dtype: torch.dtype
    device: torch.device
    n_calls: int

    def __init__(self, g: Callable[[Tensor], Tensor], x0: Tensor, layers: List[int], *,
                 sample: int = 0, positions: tuple[int, ...] = ()) -> None:
        self.g, self.x0, self.layers = g, x0, layers  # x0: [L, 1, d]
        self.sample, self.positions = sample, positions  # where (for error messages)
        self.size = x0.shape[0]
        self.n = x0.shape[-1]
        self.dtype, self.device = x0.dtype, x0.device
        self._jvp: Optional[Callable] = None
        self._vjp: Optional[Callable] = None
        self.n_calls = 0

    def _build_jvp(self) -> None:
        self._jvp = linearize(self.g, self.x0)

    def _build_vjp(self) -> None:
        try:
            with math_sdpa():
                vjp_fn = torch.func.vjp(self.g, self.x0)[1]
            self._vjp = lambda u: vjp_fn(u)[0]
            return
        except REPLAY_ERRORS as err:  # e.g. an autograd.Function without setup_context
            log.info("torch.func.vjp of the stacked function failed (%s): using torch.autograd",
                     err)
            fallback("linearize.autograd_vjp",
                     f"torch.func.vjp of the stacked layers failed ({err}): VJPs by "
                     "torch.autograd")
        x = self.x0.clone().requires_grad_(True)
        with torch.enable_grad():
            y = self.g(x)
        self._vjp = lambda u: torch.autograd.grad(y, x, u, retain_graph=True)[0]

    def _apply(self, f: Callable, X: Tensor) -> Tensor:
        L, n, c = X.shape
        X = X.to(self.dtype)
        self.n_calls += 1
        if c == 1:
            return f(X[:, :, 0].reshape(L, 1, n)).reshape(L, n, 1)
        # column by column: vmapping the (already layer-vmapped) linearised graph over
        # columns measured ~10x slower on CPU (GPT-2-small, 12 layers x 16 columns: 8.4 s vs
        # 0.88 s), unlike the per-layer engine, where vmap over columns is a win
        cols = X.permute(2, 0, 1).reshape(c, L, 1, n)
        Y = torch.stack([f(v) for v in cols])
        return Y.reshape(c, L, n).permute(1, 2, 0)

    def matmat_all(self, X: Tensor) -> Tensor:
        """X [L, d, c] -> [L, d, c]: slot l is J_l X[l] (the JVP, built on first use)."""
        if self._jvp is None:
            self._build_jvp()
        assert self._jvp is not None  # built above
        return self._checked(self._apply(self._jvp, X), "JVP")

    def rmatmat_all(self, X: Tensor) -> Tensor:
        """X [L, d, c] -> [L, d, c]: slot l is J_l^T X[l] (the VJP, built on first use)."""
        if self._vjp is None:
            self._build_vjp()
        assert self._vjp is not None  # built above
        return self._checked(self._apply(self._vjp, X), "VJP")

    def _checked(self, Y: Tensor, what: str) -> Tensor:
        """Y, or an error naming the first stacked layer whose output is not finite."""
        ok = torch.isfinite(Y.reshape(Y.shape[0], -1)).all(dim=1)
        if not bool(ok.all()):
            i = int((~ok).nonzero()[0])
            raise replay_error(layer=self.layers[i], sample=self.sample,
                               positions=self.positions, what=what, dtype=Y.dtype)
        return Y


def _member(group: StackedJacobians, i: int, layer: int, sample: int, positions: Tensor,
            name: str) -> StackedBlockJacobian:
    n, dtype, L = group.n, group.dtype, group.size

    def lift(X: Tensor) -> Tensor:  # [n, c] -> [L, n, c], zeros for the other layers
        Z = torch.zeros(L, n, X.shape[1], dtype=dtype, device=X.device)
        Z[i] = X.to(dtype)
        return Z

    def cplx(f: Callable, X: Tensor) -> Tensor:
        if X.is_complex():
            return torch.complex(f(X.real), f(X.imag))
        return f(X)

    def matmat(X: Tensor) -> Tensor:
        return cplx(lambda V: group.matmat_all(lift(V))[i], X)

    def rmatmat(X: Tensor) -> Tensor:
        return cplx(lambda U: group.rmatmat_all(lift(U))[i], X)

    return StackedBlockJacobian(
        n, matvec=lambda x: matmat(x[:, None])[:, 0], rmatvec=lambda y: rmatmat(y[:, None])[:, 0],
        matmat=matmat, rmatmat=rmatmat, dtype=dtype, device=group.device, name=name,
        layer=layer, sample=sample, positions=positions, kind="token",
        single_query_mode="concat", batch_group=group, batch_index=i)


def stacked_block_jacobians(anatomy: Anatomy, recording: Recording, layers: Sequence[int], *, sample: int = 0,
                            position: int = -1, dtype: torch.dtype = torch.float64
                            ) -> Optional[List[StackedBlockJacobian]]:
    """Token Jacobians of ``layers`` (one d x d operator each) sharing ONE linearisation.

    Same maps as ``block_jacobian(anatomy, recording, l, sample=sample, position=position,
    kind="token", dtype=dtype)``; each is a :class:`~.operator.StackedBlockJacobian`
    (``single_query_mode="concat"``) carrying ``.batch_group`` (a :class:`StackedJacobians`),
    so ``linalg.eigs(ops, k)`` applies all of them with one batched
    JVP per Krylov step. Returns None (log message says why) where the stacked form does not
    apply: a non-causal model, blocks that differ in class, parameter names/shapes or per-layer
    attention type, differing call inputs, no verified single-query function for some layer,
    or a stacked forward that disagrees with the per-layer ones.
    """
    layers = [anatomy.layer_index(l) for l in layers]
    if len(layers) == 0:
        raise OptionError("layers", layers, "a non-empty list of layers")
    if len(set(layers)) != len(layers):
        raise OptionError("layers", layers, "distinct layers", hint="it has duplicates")
    if not anatomy.causal:
        log.info("stacked Jacobians: model is not causal (no single-query form)")
        return None
    why = _kinds_differ(anatomy, layers)
    if why:
        log.info("stacked Jacobians: %s", why)
        return None
    blocks = [anatomy.layers[l].block for l in layers]
    if len({type(b) for b in blocks}) != 1:
        log.info("stacked Jacobians: block classes differ")
        return None
    sqs = []
    for l in layers:
        fn = block_function(anatomy, recording, l, sample=sample, position=position,
                            kind="token", dtype=dtype)
        sq = single_query_function(fn, allow_split=False)  # the stacked form runs concat mode
        if sq is None:
            log.info("stacked Jacobians: no single-query function for layer %d", l)
            return None
        sqs.append(sq)
    ref = sqs[0]
    p, Lseq, slot = ref._p, ref._L, ref._slot
    shapes0 = {k: (t.shape, t.dtype) for k, t in ref.params.items()}
    probe_h = ref.full_fn.hidden[:, :1]
    args0, kwargs0 = ref.full_fn.call.with_hidden(probe_h)
    for sq in sqs[1:]:
        if sq._p != p or sq._L != Lseq or sq._slot != slot:
            log.info("stacked Jacobians: position or sequence length differs at layer %d",
                     sq.layer)
            return None
        if {k: (t.shape, t.dtype) for k, t in sq.params.items()} != shapes0:
            log.info("stacked Jacobians: parameter names/shapes differ at layer %d", sq.layer)
            return None
        if (sq.cache.keys.shape != ref.cache.keys.shape
                or sq.cache.values.shape != ref.cache.values.shape):
            log.info("stacked Jacobians: cached key/value shapes differ at layer %d", sq.layer)
            return None
        args, kwargs = sq.full_fn.call.with_hidden(probe_h)
        if not (_same(args, args0) and _same(kwargs, kwargs0)):
            log.info("stacked Jacobians: recorded call inputs (mask, positions, rotary) differ "
                     "at layer %d", sq.layer)
            return None
    params = {k: torch.stack([sq.params[k] for sq in sqs]) for k in shapes0}
    keys = torch.stack([sq.cache.keys for sq in sqs])
    values = torch.stack([sq.cache.values for sq in sqs])
    template, call = ref.block, ref.full_fn.call

    def one(prm: dict, k: Tensor, v: Tensor, x: Tensor) -> Tensor:
        cache = FixedKV()
        cache.keys, cache.values = k, v
        a, kw = slice_call(call, Lseq, slice(p, p + 1), slice(0, p + 1), x[None], cache, slot)
        return first_output(torch.func.functional_call(template, prm, a, kw))[0]

    def g(X: Tensor) -> Tensor:
        with math_sdpa(), ref.convention.replaying(template):
            return torch.vmap(one)(params, keys, values, X)

    x0 = torch.stack([sq.x0 for sq in sqs])  # [L, 1, d]
    try:
        gen = torch.Generator(device="cpu").manual_seed(1)
        delta = torch.randn(x0.shape, generator=gen, dtype=torch.float64).to(x0)
        xp = x0 + 0.1 * delta * x0.abs().amax(dim=(1, 2), keepdim=True)
        with torch.no_grad():
            got = g(xp)
            for i, sq in enumerate(sqs):
                want = sq(xp[i])
                err = float((got[i] - want).norm() / want.norm().clamp_min(1e-30))
                tol = agreement_tol(dtype)
                if not err <= tol:
                    log.info("stacked Jacobians: stacked forward disagrees with layer %d's own "
                             "(%.1e)", sq.layer, err)
                    return None
        group = StackedJacobians(g, x0, layers, sample=ref.sample,
                                 positions=tuple(int(q) for q in ref.positions))
        group.matmat_all(delta.reshape(len(layers), -1, 1))  # builds the linearisation once
        group.n_calls = 0
    except REPLAY_ERRORS as err:  # e.g. vmap cannot batch some op of this block
        log.info("stacked Jacobians unavailable: %s: %s", type(err).__name__, err)
        return None
    return [_member(group, i, sq.layer, sq.sample, sq.positions,
                    f"J[layer {sq.layer}, token p={p}, stacked]") for i, sq in enumerate(sqs)]
