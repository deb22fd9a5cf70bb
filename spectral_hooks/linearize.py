"""Block replay -> LinearOperator: the Jacobian of one transformer block at its recorded input.

    >>> J = block_jacobian(probe.anatomy, probe.recording, 3)      # doctest: +SKIP
    >>> eigs(J, 16).values                                          # doctest: +SKIP

f_l is the whole block (norms, attention, MLP, residual adds) as a function of its residual
input, with every other recorded input (attention mask, position ids, rotary cos/sin) held
fixed and no KV cache (the recording drops it). The block runs with ``torch.func``
(``functional_call``) on ``dtype`` copies of its own parameters and buffers: the user's model is
never mutated and only one block is copied.

* ``kind="token"``: J^(p) = d f(H)[p] / d H[p] (d x d), all other rows of H held fixed;
  ``position=-1`` is the last non-padding token of the sample.
* ``kind="sequence"``: the (n d x n d) Jacobian over the sample's n real (non-padding) positions,
  flattened row-major (position-major: index i*d + j is position i, feature j).

matvec = JVP, rmatvec = VJP. The linearisation is reused: ``torch.func.linearize`` is traced once
(a JVP then costs about one block forward) and one ``torch.func.vjp`` closure serves every
rmatvec; both are built lazily on first use; matmat/rmatmat vmap over them (a column loop if vmap
fails). Forward-mode AD does not exist for fused SDPA kernels, so everything runs under
``sdpa_kernel(SDPBackend.MATH)``; if forward AD still fails (a custom kernel), matvecs fall back
to a central finite difference with step h = eps^(1/3) * max(1, ||x0||_inf) / ||v||_inf (eps of
``dtype``; error O(h^2), ~1e-10 relative in float64) and a warning is logged.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from typing import Callable, Optional

import torch
from torch import Tensor

from .linalg import LinearOperator
from .recording import map_tensors

__all__ = ["block_jacobian", "jacobian_product", "dense_block_jacobian", "block_function",
           "BlockFunction"]

log = logging.getLogger(__name__)
METHODS = ("auto", "linearize", "jvp", "finite_difference")
KINDS = ("token", "sequence")
DENSE_LIMIT = 4096


def _math_sdpa():
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel(SDPBackend.MATH)
    except Exception:  # pragma: no cover - very old torch
        return contextlib.nullcontext()


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


class BlockFunction:
    """f(X): block ``layer`` with rows ``positions`` of its recorded input replaced by X [m, d].

    Returns the block's output at the same rows, [m, d]. Built by :func:`block_function`.
    """

    def __init__(self, block, call, hidden: Tensor, positions: Tensor, params: dict,
                 layer: int, sample: int) -> None:
        self.block, self.call, self.params = block, call, params
        self.layer, self.sample = layer, sample
        self.hidden = hidden  # [1, L, d] in the working dtype
        self.positions = positions  # LongTensor [m]
        L = hidden.shape[1]
        keep = torch.ones(L, 1, dtype=hidden.dtype, device=hidden.device)
        keep[positions] = 0
        self._base = hidden[0] * keep  # recorded rows, replaced rows zeroed
        self._scatter = torch.eye(L, dtype=hidden.dtype, device=hidden.device)[:, positions]
        self.x0 = hidden[0, positions].clone()  # [m, d]

    def full(self, H: Tensor) -> Tensor:
        """The block on a full [L, d] input (no batch dimension); returns [L, d]."""
        args, kwargs = self.call.with_hidden(H[None])
        with _math_sdpa():
            out = torch.func.functional_call(self.block, self.params, args, kwargs)
        return _first(out)[0]

    def __call__(self, X: Tensor) -> Tensor:
        H = self._base + self._scatter @ X
        return self.full(H).index_select(0, self.positions)


class _FixedKV:
    """A duck-typed KV cache: ``update`` returns the recorded keys/values of the earlier
    positions followed by the new ones, and never stores anything once filled."""

    def __init__(self) -> None:
        self.keys = self.values = None

    def update(self, key_states, value_states, *args, **kwargs):
        if self.keys is None:  # filling: the block runs on the earlier positions once
            self.keys, self.values = key_states.detach(), value_states.detach()
            return key_states, value_states
        return (torch.cat([self.keys, key_states], dim=-2),
                torch.cat([self.values, value_states], dim=-2))

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self.keys is None else int(self.keys.shape[-2])


def _slice_call(call, L: int, rows: slice, cols: slice, hidden: Tensor, cache,
                cache_slot: tuple) -> tuple:
    def cut(t: Tensor) -> Tensor:
        if t.ndim == 4 and t.shape[-1] == L and t.shape[-2] == L:  # [b, h, q, k] mask
            return t[..., rows, cols]
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


_CACHE_NAMES = ("cache", "past_key_values", "past_key_value", "layer_past")


def _cache_slot(block) -> tuple:
    """(name, positional index or None) of the block's KV-cache parameter."""
    try:
        params = list(inspect.signature(block.forward).parameters)
    except (TypeError, ValueError):
        params = []
    for name in _CACHE_NAMES:
        if name in params:
            return name, params.index(name)
    raise RuntimeError(f"{type(block).__name__}.forward takes no KV cache argument")


class SingleQueryFunction:
    """f(x) = block output at p with only row p recomputed (causal models, HF Cache blocks).

    The keys/values of positions < p are computed once from the recording and held fixed;
    each call runs the block on one query row, so a JVP costs ~1/L of a full-sequence one.
    Built only after checking it against the full-sequence :class:`BlockFunction`.
    """

    def __init__(self, full: BlockFunction) -> None:
        self.full_fn = full
        self.block, self.params = full.block, full.params
        self.layer, self.sample, self.positions, self.x0 = (full.layer, full.sample,
                                                             full.positions, full.x0)
        p = int(full.positions[0])
        L = full.hidden.shape[1]
        self.cache = _FixedKV()
        self._L, self._p = L, p
        self._slot = _cache_slot(self.block)
        args, kwargs = _slice_call(full.call, L, slice(0, p), slice(0, p),
                                   full.hidden[:, :p], self.cache, self._slot)
        with torch.no_grad(), _math_sdpa():
            torch.func.functional_call(self.block, self.params, args, kwargs)
        if self.cache.keys is None:
            raise RuntimeError("the block did not call cache.update")

    def __call__(self, X: Tensor) -> Tensor:
        p = self._p
        args, kwargs = _slice_call(self.full_fn.call, self._L, slice(p, p + 1),
                                   slice(0, p + 1), X[None], self.cache, self._slot)
        with _math_sdpa():
            out = torch.func.functional_call(self.block, self.params, args, kwargs)
        return _first(out)[0]


def _single_query(fn: BlockFunction) -> Optional[SingleQueryFunction]:
    """The verified single-query function, or None where it does not apply or disagrees."""
    if fn.positions.numel() != 1 or int(fn.positions[0]) == 0:
        return None
    try:
        sq = SingleQueryFunction(fn)
        g = torch.Generator(device="cpu").manual_seed(0)
        delta = torch.randn(fn.x0.shape, generator=g, dtype=torch.float64).to(fn.x0)
        x = fn.x0 + 0.1 * delta * fn.x0.abs().max()
        with torch.no_grad():
            a, b = sq(x), fn(x)
        tol = 1e3 * torch.finfo(fn.x0.dtype).eps ** 0.5 if fn.x0.dtype != torch.float64 else 1e-9
        err = float((a - b).norm() / b.norm().clamp_min(1e-30))
        if not err <= tol:
            log.info("single-query path disagrees for layer %d (%.1e): using the full sequence",
                     fn.layer, err)
            return None
        return sq
    except Exception as err:  # noqa: BLE001 - not an HF Cache block: use the full sequence
        log.info("single-query path unavailable for layer %d: %s", fn.layer, err)
        return None


def _working_dtype(dtype: torch.dtype, like: Tensor) -> Callable[[Tensor], Tensor]:
    def cast(t: Tensor) -> Tensor:
        return t.detach().to(dtype) if t.is_floating_point() else t.detach()
    return cast


def _resolve_sample(recording, layer: int, sample: int):
    try:
        return recording.block_input(layer, sample)
    except ValueError as err:
        raise ValueError(
            f"no replayable input for layer {layer}, sample {sample}: block inputs are captured "
            "for prefill calls only, so a recording of decode steps alone (a call continuing a "
            "KV cache made before the probe was attached) cannot be linearised, and "
            f"store='stats' keeps only the latest run's inputs ({err})") from err


def _resolve_positions(recording, layer: int, sample: int, position: Optional[int], kind: str,
                       L: int) -> Tensor:
    mask = recording.mask[sample]
    steps = recording.position_step[sample]
    real = torch.nonzero(mask[:L] != 0).flatten()
    if kind == "sequence":
        if position not in (None, -1):
            raise ValueError("kind='sequence' covers every real position: leave position=-1")
        if real.numel() == 0:
            raise ValueError(f"sample {sample} has no real (non-padding) token at layer {layer}")
        return real
    if not isinstance(position, int) or isinstance(position, bool):
        raise TypeError(f"position must be an int, got {type(position).__name__}")
    width = mask.shape[0]
    if position < 0:
        if -position > real.numel():
            raise ValueError(f"position {position} is out of range: sample {sample} has "
                             f"{real.numel()} real tokens")
        return real[position:position + 1 if position != -1 else None].clone()
    if position >= width:
        raise ValueError(f"position {position} is out of range: the recording has {width} "
                         f"positions (sample {sample})")
    if mask[position] == 0:
        raise ValueError(f"position {position} of sample {sample} is padding")
    if position >= L or int(steps[position]) > 0:
        raise ValueError(f"position {position} of sample {sample} was written by a generate() "
                         "decode step: block inputs are kept for the prefill only")
    return torch.tensor([position])


def block_function(anatomy, recording, layer: int, *, sample: int = 0, position: int = -1,
                   kind: str = "token", dtype: torch.dtype = torch.float64) -> BlockFunction:
    """The block map at the recorded input, restricted to the chosen rows (see module doc)."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: choose from {KINDS}")
    layer = anatomy.layer_index(layer)
    if layer not in recording.layers:
        raise ValueError(f"layer {layer} was not recorded (recorded: {list(recording.layers)}); "
                         "instrument with layers=None to record every layer")
    call = _resolve_sample(recording, layer, sample)
    block = anatomy.layers[layer].block
    device = call.hidden.device
    cast = _working_dtype(dtype, call.hidden)
    args, kwargs = map_tensors(call.args, cast), map_tensors(call.kwargs, cast)
    call = type(call)(args, kwargs, call.hidden_in_args)
    hidden = call.hidden
    positions = _resolve_positions(recording, layer, sample, position, kind,
                                   hidden.shape[1]).to(device)
    if not bool(torch.isfinite(hidden[0, positions]).all()):
        raise ValueError(f"the recorded input of layer {layer}, sample {sample} contains NaN/Inf "
                         "at the requested positions")
    params = {}
    for name, t in block.named_parameters():
        params[name] = t.detach().to(device, dtype)
    for name, t in block.named_buffers():
        params[name] = cast(t).to(device)
    return BlockFunction(block, call, hidden, positions, params, layer, sample)


class _Engine:
    """Lazily built JVP/VJP machinery for one BlockFunction."""

    def __init__(self, fn: BlockFunction, method: str) -> None:
        if method not in METHODS:
            raise ValueError(f"method={method!r}: choose from {METHODS}")
        self.fn, self.method = fn, method
        self.x0 = fn.x0
        self._jvp: Optional[Callable] = None
        self._vjp: Optional[Callable] = None
        self._vmap_ok = {"jvp": True, "vjp": True}

    # -------------------------------------------------------------- forward (matvec)
    def _build_jvp(self) -> None:
        fn, x0 = self.fn, self.x0
        order = ["linearize", "jvp", "finite_difference"] if self.method == "auto" else [
            self.method]
        probe = torch.randn_like(x0)
        for method in order:
            try:
                if method == "linearize":
                    with _math_sdpa():
                        _, lin = torch.func.linearize(fn, x0)
                    lin(probe)
                    self._jvp = lin
                elif method == "jvp":
                    def jvp(v, fn=fn, x0=x0):
                        with _math_sdpa():
                            return torch.func.jvp(fn, (x0,), (v,))[1]
                    jvp(probe)
                    self._jvp = jvp
                else:
                    if self.method == "auto":
                        log.warning("forward-mode AD failed for layer %d: using a central "
                                    "finite-difference JVP", fn.layer)
                    self._jvp = self._fd_jvp
                    self._vmap_ok["jvp"] = False
                self.method_used = method
                return
            except Exception as err:  # noqa: BLE001 - try the next method
                if self.method != "auto":
                    raise
                log.info("JVP method %s failed for layer %d: %s", method, fn.layer, err)

    def _fd_jvp(self, v: Tensor) -> Tensor:
        x0 = self.x0
        vmax = float(v.abs().max())
        if vmax == 0:
            return torch.zeros_like(x0)
        eps = torch.finfo(x0.dtype).eps
        h = eps ** (1 / 3) * max(1.0, float(x0.abs().max())) / vmax
        with torch.no_grad():
            return (self.fn(x0 + h * v) - self.fn(x0 - h * v)) / (2 * h)

    def jvp(self, V: Tensor) -> Tensor:
        """V [m, d] or [k, m, d] (batched) -> J V."""
        if self._jvp is None:
            self._build_jvp()
        if V.ndim == 2:
            return self._jvp(V)
        return self._batched("jvp", self._jvp, V)

    # -------------------------------------------------------------- reverse (rmatvec)
    def vjp(self, U: Tensor) -> Tensor:
        if self._vjp is None:
            self._build_vjp()
        if U.ndim == 2:
            return self._vjp(U)
        return self._batched("vjp", self._vjp, U)

    def _build_vjp(self) -> None:
        try:
            with _math_sdpa():
                _, vjp_fn = torch.func.vjp(self.fn, self.x0)
            self._vjp = lambda u: vjp_fn(u)[0]
            return
        except Exception as err:  # noqa: BLE001 - e.g. an autograd.Function without setup_context
            log.info("torch.func.vjp failed for layer %d (%s): using torch.autograd", self.fn.layer,
                     err)
        x = self.x0.clone().requires_grad_(True)
        with torch.enable_grad(), _math_sdpa():
            y = self.fn(x)
        self._vmap_ok["vjp"] = False
        self._vjp = lambda u: torch.autograd.grad(y, x, u, retain_graph=True)[0]

    def _batched(self, which: str, f: Callable, V: Tensor) -> Tensor:
        if self._vmap_ok[which]:
            try:
                with _math_sdpa():
                    return torch.vmap(f)(V)
            except Exception as err:  # noqa: BLE001
                log.info("vmap over the %s failed (%s): applying column by column", which, err)
                self._vmap_ok[which] = False
        return torch.stack([f(v) for v in V])


def _make_operator(engine: _Engine, name: str) -> LinearOperator:
    fn = engine.fn
    m, d = fn.x0.shape
    n = m * d
    dtype = fn.x0.dtype

    def as_rows(x: Tensor) -> Tensor:
        return x.to(dtype).reshape(m, d)

    def cplx(f: Callable, x: Tensor) -> Tensor:
        if x.is_complex():
            return torch.complex(f(x.real), f(x.imag))
        return f(x)

    def matvec(x: Tensor) -> Tensor:
        return cplx(lambda v: engine.jvp(as_rows(v)).reshape(n), x)

    def rmatvec(y: Tensor) -> Tensor:
        return cplx(lambda u: engine.vjp(as_rows(u)).reshape(n), y)

    def matmat(X: Tensor) -> Tensor:
        return cplx(lambda V: engine.jvp(V.to(dtype).T.reshape(-1, m, d)).reshape(-1, n).T, X)

    def rmatmat(Y: Tensor) -> Tensor:
        return cplx(lambda U: engine.vjp(U.to(dtype).T.reshape(-1, m, d)).reshape(-1, n).T, Y)

    op = LinearOperator((n, n), matvec=matvec, rmatvec=rmatvec, matmat=matmat, rmatmat=rmatmat,
                        dtype=dtype, device=fn.x0.device, name=name)
    op.layer, op.sample, op.positions, op.engine = fn.layer, fn.sample, fn.positions, engine
    return op


def block_jacobian(anatomy, recording, layer: int, *, sample: int = 0, position: int = -1,
                   kind: str = "token", dtype: torch.dtype = torch.float64,
                   method: str = "auto", single_query: bool = True) -> LinearOperator:
    """Block ``layer``'s Jacobian at its recorded input for batch row ``sample``.

    ``kind="token"``: d x d, J^(p) = d f(H)[p] / d H[p]; ``position``: a row index of the
    recording (must be a real, prefill token), or negative to count real tokens from the end
    (-1, the default: the last non-padding token). ``kind="sequence"``: (n d x n d) over the n
    real positions. ``method``: "auto" (linearize, else plain jvp, else finite differences with
    a warning), or force one of "linearize", "jvp", "finite_difference".
    ``single_query`` (token kind, causal models): recompute only row p, with the earlier
    positions' keys/values computed once and held fixed (blocks that take an HF ``cache``);
    used only after a check against the full-sequence block, else the full sequence is run.
    The operator carries ``.layer``, ``.sample`` and ``.positions`` (the recording rows used).
    """
    fn = block_function(anatomy, recording, layer, sample=sample, position=position, kind=kind,
                        dtype=dtype)
    where = f"p={int(fn.positions[0])}" if kind == "token" else f"n={fn.positions.numel()}"
    engine_fn = fn
    if single_query and kind == "token" and anatomy.causal:
        engine_fn = _single_query(fn) or fn
    op = _make_operator(_Engine(engine_fn, method), f"J[layer {fn.layer}, {kind} {where}]")
    op.single_query = engine_fn is not fn
    return op


def jacobian_product(anatomy, recording, first: int, last: int, *, sample: int = 0,
                     position: int = -1, dtype: torch.dtype = torch.float64,
                     method: str = "auto", single_query: bool = True) -> LinearOperator:
    """P = J_last ... J_first: token Jacobians at one position, each at its own recorded input.

    Exact as the end-to-end Jacobian of layers first..last at that position for causal models
    (for bidirectional ones it is the product of per-layer token Jacobians, other tokens fixed).
    """
    first, last = anatomy.layer_index(first), anatomy.layer_index(last)
    if first > last:
        raise ValueError(f"first={first} > last={last}: the product runs first..last upwards")
    missing = [l for l in range(first, last + 1) if l not in recording.layers]
    if missing:
        raise ValueError(f"layers {missing} were not recorded (recorded: "
                         f"{list(recording.layers)}); the product needs every layer "
                         f"{first}..{last}")
    P = None
    for layer in range(first, last + 1):
        J = block_jacobian(anatomy, recording, layer, sample=sample, position=position,
                           kind="token", dtype=dtype, method=method,
                           single_query=single_query)
        P = J if P is None else J @ P
    P.name = f"P[layers {first}..{last}]"
    return P


def dense_block_jacobian(anatomy, recording, layer: int, *, sample: int = 0, position: int = -1,
                         kind: str = "token", dtype: torch.dtype = torch.float64,
                         force: bool = False) -> Tensor:
    """The dense Jacobian (m d x m d) by ``torch.func.jacfwd`` (jacrev if forward AD fails).

    Refuses m d > 4096 unless ``force=True``.
    """
    fn = block_function(anatomy, recording, layer, sample=sample, position=position, kind=kind,
                        dtype=dtype)
    m, d = fn.x0.shape
    if m * d > DENSE_LIMIT and not force:
        raise ValueError(f"the dense Jacobian would be {m * d} x {m * d} (> {DENSE_LIMIT}); pass "
                         "force=True, or use block_jacobian (matrix-free)")
    try:
        with _math_sdpa():
            J = torch.func.jacfwd(fn)(fn.x0)
    except Exception as err:  # noqa: BLE001
        log.info("jacfwd failed for layer %d (%s): using reverse mode", fn.layer, err)
        engine = _Engine(fn, "auto")
        J = engine.vjp(torch.eye(m * d, dtype=fn.x0.dtype, device=fn.x0.device)
                       .reshape(m * d, m, d))
        return J.reshape(m * d, m * d)  # row i = e_i^T J
    return J.reshape(m * d, m * d)
